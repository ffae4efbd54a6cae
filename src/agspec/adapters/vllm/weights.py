"""Hugging Face-format model folders for vLLM, made offline from the pinned GGUF files.

vLLM's CPU build loads a Hugging Face folder (config.json, safetensors, tokenizer). The
models AgSpec can fetch offline are GGUF files (`agspec models fetch`), so
`export_hf(name)` dequantizes one with transformers (`from_pretrained(folder,
gguf_file=...)`, needs the `gguf` package), drops the GGUF quantization marker (transformers
refuses to save a model that carries it), rebuilds the model from its config, loads the
dequantized weights and saves them as bfloat16 safetensors with the tokenizer.

The folder is written under a temporary name and renamed into place, so a half-written
export never has the final name, and it carries `agspec-export.json`: the source GGUF's
sha256 and the sha256 of every file written. `export_hf` on a cached folder re-hashes
the files against that manifest and re-exports when anything differs.

    $ python -m agspec.adapters.vllm.weights smollm2-135m-instruct
    /root/.cache/agspec/models/hf/smollm2-135m-instruct-b179c9523d0e

Folders live in `cache_dir()/hf/<model>-<first 12 hex of the GGUF sha256>`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agspec.models import ModelFileError, cache_dir, file_sha256, model_spec, resolve_model

MANIFEST = "agspec-export.json"
EXPORT_VERSION = 1


def export_dir(name: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the HF folder of pinned model `name` lives (or will live)."""
    spec = model_spec(name)
    return cache_dir(cache) / "hf" / f"{spec.name}-{spec.sha256[:12]}"


def _hash_files(folder: Path) -> dict[str, str]:
    files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST]
    return {p.name: file_sha256(p) for p in files}


def check_export(folder: Path, gguf_sha256: str) -> str | None:
    """None when `folder` is a complete export of the GGUF with that hash, else why not."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"{folder} has no {MANIFEST}"
    try:
        meta = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{manifest} is unreadable ({exc})"
    if meta.get("version") != EXPORT_VERSION or meta.get("gguf_sha256") != gguf_sha256:
        return f"{manifest} is for another source or export version"
    want = meta.get("files")
    if not isinstance(want, dict) or not want:
        return f"{manifest} lists no files"
    got = _hash_files(folder)
    if got != want:
        bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        return f"{folder}: files differ from the manifest: {', '.join(bad)}"
    return None


def export_hf(
    name: str,
    cache: str | os.PathLike[str] | None = None,
    *,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """The HF-format folder of pinned model `name`, exported from its GGUF when needed.

    The GGUF must be fetched already (`agspec models fetch NAME`); its full sha256 is
    checked before the export. Needs torch, transformers and gguf (the vLLM virtualenv
    of `scripts/install_vllm.sh` has them).
    """
    spec = model_spec(name)
    say = progress or (lambda _msg: None)
    final = export_dir(name, cache)
    if final.is_dir() and not force:
        why = check_export(final, spec.sha256)
        if why is None:
            say(f"{spec.name}: HF folder cached at {final} (hashes ok)")
            return final
        say(f"{spec.name}: re-exporting: {why}")
    gguf = resolve_model(spec.name, cache, full_hash=True)
    t0 = time.perf_counter()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        _convert(gguf, tmp)
        files = _hash_files(tmp)
        meta: dict[str, Any] = {
            "version": EXPORT_VERSION,
            "model": spec.name,
            "gguf": gguf.name,
            "gguf_sha256": spec.sha256,
            "dtype": "bfloat16",
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        if final.exists():
            old = final.with_name(final.name + f".old-{os.getpid()}")
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"{spec.name}: exported {gguf.name} -> {final} in {time.perf_counter() - t0:.1f} s")
    return final


def _convert(gguf: Path, out: Path) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "exporting a GGUF to a Hugging Face folder needs torch, transformers and gguf "
            "(bash scripts/install_vllm.sh makes a virtualenv with them)"
        ) from exc
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ModelFileError(
            f"{gguf.name}: dequantized weights do not fit the model built from its config "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )
    del loaded
    model = model.to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
    if not (out / "tokenizer.json").is_file():
        raise ModelFileError(f"{gguf.name}: the exported tokenizer has no tokenizer.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m agspec.adapters.vllm.weights",
        description="Export a pinned GGUF model to a Hugging Face folder for vLLM; "
        "prints the folder.",
    )
    ap.add_argument("name", help="a pinned model name, e.g. smollm2-135m-instruct")
    ap.add_argument("--cache-dir", default=None, help="model cache folder")
    ap.add_argument("--force", action="store_true", help="export again even if cached")
    args = ap.parse_args(argv)
    try:
        folder = export_hf(
            args.name,
            args.cache_dir,
            force=args.force,
            progress=lambda m: print(m, file=sys.stderr),
        )
    except (KeyError, ModelFileError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
