"""What the tests that need an optional engine, `agspec serve` or a cached model check
first, in one place: each guard returns what the test needs or skips it with the reason
and the command that installs or fetches what is missing.

    from guards import require_engine, require_model, require_server
    llama_cpp = require_engine("llama_cpp")        # at module level: skips the module
    clients = require_server()                     # openai, httpx, llama_cpp
    path = require_model("smollm2-135m-instruct")  # inside a fixture or test

tests/conftest.py applies the same checks to the `engine("name")` and `server` markers.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

# The optional engines: the module a test imports, and how to install it.
ENGINES = {
    "llama_cpp": "llama-cpp-python is not installed (pip install 'agspec[llama]', or "
    "scripts/install_llama_cpp.sh)",
    "torch": "torch is not installed (pip install 'agspec[transformers]')",
    "transformers": "transformers is not installed (pip install 'agspec[transformers]')",
    "arctic_inference": "arctic-inference 0.3.0 is not installed (pip install 'agspec[suffix]'; "
    "see docs/baselines-suffix.md for the CPU-only install)",
    "vllm": "vLLM is not importable in this interpreter; the vLLM tests run in the virtualenv "
    "of scripts/install_vllm.sh (scripts/test.sh does that after the main suite)",
}
# `agspec serve` and the client its tests drive it with.
SERVER_MODULES = {
    "fastapi": "agspec serve needs the serve extra (pip install 'agspec[serve]')",
    "uvicorn": "agspec serve needs the serve extra (pip install 'agspec[serve]')",
    "prometheus_client": "agspec serve needs the serve extra (pip install 'agspec[serve]')",
    "openai": "the serve tests drive the server with `openai` (pip install openai)",
}


def missing_engine(name: str) -> str | None:
    """None when engine `name` (a key of ENGINES) imports here, else why not."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}: one of {sorted(ENGINES)}")
    try:
        importlib.import_module(name)
    except Exception as exc:  # ImportError, or a broken install (a torchvision mismatch)
        return f"{ENGINES[name]} ({type(exc).__name__}: {exc})"
    return None


def missing_server() -> str | None:
    """None when `agspec serve` can run here and be driven with `openai`, else why not."""
    for module, reason in SERVER_MODULES.items():
        if importlib.util.find_spec(module) is None:
            return reason
    return missing_engine("llama_cpp")


def require_engine(name: str) -> ModuleType:
    """The engine's module, or a skip (of the module when called at module level)."""
    reason = missing_engine(name)
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
    return importlib.import_module(name)


def require_server() -> SimpleNamespace:
    """`openai`, the `httpx` it brings (httpx2 in openai >= 3) and `llama_cpp`, or a skip."""
    reason = missing_server()
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
    try:
        httpx = importlib.import_module("httpx")
    except ImportError:
        httpx = pytest.importorskip("httpx2", reason="the openai client brings httpx")
    return SimpleNamespace(
        openai=importlib.import_module("openai"),
        httpx=httpx,
        llama_cpp=importlib.import_module("llama_cpp"),
    )


def require_model(name: str) -> Path:
    """The cached file of model `name` (agspec models list), or a skip naming the fetch."""
    from agspec.models import ModelFileError, resolve_model

    try:
        return Path(resolve_model(name))
    except (ModelFileError, FileNotFoundError, KeyError, ValueError) as exc:
        pytest.skip(f"{name} is not available ({exc}); run `agspec models fetch {name}`")


def smollm2_llm(n_ctx: int, n_batch: int | None = None) -> Any:
    """SmolLM2-135M in llama.cpp, one thread, seed 0: the live tests' small model (or a
    skip naming what is missing)."""
    llama_cpp = require_engine("llama_cpp")
    path = require_model("smollm2-135m-instruct")
    kw = {} if n_batch is None else {"n_batch": n_batch}
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=1, n_threads_batch=1,
                           seed=0, verbose=False, **kw)  # fmt: skip
