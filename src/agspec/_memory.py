"""Giving freed memory back to the operating system, where the C library allows it.

An index's arrays come from the C library's heap; when a session is evicted they are
freed, but glibc keeps freed heap pages (and raises its mmap threshold after each large
free), so the process's RSS stays near its peak. `release_free_memory()` asks glibc to
return them (`malloc_trim(0)`); elsewhere (musl, macOS) it does nothing. The drafter calls
it after evictions only when a byte budget is set (`AgSpecConfig.memory_budget_bytes`).
It costs about a millisecond per GB of heap.

>>> release_free_memory() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["release_free_memory"]

_trim: Any = None


def release_free_memory() -> bool:
    """Return freed heap memory to the OS; True when the C library could do it."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            _trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _trim = False
    if _trim is False:
        return False
    _trim(0)
    return True
