"""The cost profile `agspec serve` uses when none is given: measured once, then cached.

The cache key is the model's sha256, the CPU (its model name and core count), the thread
count and llama.cpp's build string: a profile is reused only where it was measured.
Files live in `$AGSPEC_PROFILE_CACHE`, else `$AGSPEC_CACHE/costprofiles`, else
`~/.cache/agspec/costprofiles`, one `<key>.json` each, written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agspec._files import atomic_write_text

__all__ = ["cached_cost_profile", "profile_cache_dir", "model_sha256", "cpu_name"]

# A short measurement: n = 1..32 (the longest draft of agspec-paper+cost is 32, and the
# verification batch holds one more token), 3 rounds over every n, 512 tokens of context.
SHORT_MAX_TOKENS = 33
SHORT_REPEATS = 3
SHORT_CONTEXT = 512


def profile_cache_dir() -> Path:
    own = os.environ.get("AGSPEC_PROFILE_CACHE")
    if own:
        return Path(own)
    env = os.environ.get("AGSPEC_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "agspec"
    return root / "costprofiles"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_sha256(path: Path) -> str:
    """The pinned sha256 for a fetched model (size-checked), else the file's own."""
    from agspec.models import MODELS, file_sha256

    size = path.stat().st_size
    for spec in MODELS.values():
        if path.name == spec.filename and size == spec.size_bytes:
            return spec.sha256
    return file_sha256(path)


def _build_info() -> str:
    from agspec.adapters.llama_cpp import import_llama_cpp

    llama_cpp = import_llama_cpp()
    return str(llama_cpp.llama_print_system_info().decode(errors="replace").strip())


def cached_cost_profile(
    model_path: Path,
    threads: int,
    *,
    progress: Callable[[str], None] = print,
    cache: Path | None = None,
) -> tuple[Path, bool]:
    """(path of the profile for this model, CPU and thread count; True if it was cached)."""
    from agspec.adapters.llama_cpp import measure_cost_profile
    from agspec.policy.costmodel import ProfileCostModel

    key_src = json.dumps(
        [model_sha256(model_path), cpu_name(), os.cpu_count(), threads, _build_info()]
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
    folder = cache or profile_cache_dir()
    path = folder / f"{key}.json"
    if path.exists():
        try:
            ProfileCostModel.load(path)
            return path, True
        except ValueError as exc:
            progress(f"cached cost profile {path} is unreadable ({exc}); measuring again")
    progress(
        f"measuring a cost profile of {model_path.name} with {threads} threads "
        f"(once per model, CPU and thread count; cached in {folder})"
    )
    profile: dict[str, Any] = measure_cost_profile(
        str(model_path),
        max_tokens=SHORT_MAX_TOKENS,
        context_tokens=SHORT_CONTEXT,
        repeats=SHORT_REPEATS,
        threads=threads,
        progress=lambda msg: progress(f"  cost profile {msg}"),
    )
    profile["cache_key"] = {"model_sha256": model_sha256(model_path), "cpu": cpu_name(),
                            "threads": threads}  # fmt: skip
    atomic_write_text(path, json.dumps(profile, indent=1) + "\n")
    return path, False
