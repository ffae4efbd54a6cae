"""Memoize a one-argument function with an LRU cache."""

from collections.abc import Callable

from lru import LRUCache


def memoize(fn: Callable[[str], int], capacity: int = 2) -> Callable[[str], int]:
    cache = LRUCache(capacity)

    def wrapper(key: str) -> int:
        hit = cache.get(key)
        if hit is not None:
            return hit
        value = fn(key)
        cache.put(key, value)
        return value

    return wrapper
