"""One registry type for every pluggable family: replay drafters, baselines, trace
importers, emission forms and index engines are each a `Registry` of named entries.

An entry is registered once, by an explicit call in the module that defines the family
(no decorators, no discovery at import time, no signature inspection), and looked up by
name. An unknown name is an `UnknownNameError` (a `ValueError`) that lists the known
names in registration order; registering a name twice is an error, never a replacement.

    >>> engines = Registry[str]("index engine")
    >>> engines.register("native", "TokenIndex", help="the C++ token index")
    >>> engines.get("native"), engines.names(), "native" in engines
    ('TokenIndex', ['native'], True)
    >>> engines.get("suffix")
    Traceback (most recent call last):
    ...
    agspec._registry.UnknownNameError: unknown index engine 'suffix'; known: native
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name no entry of the family was registered under."""


class Registry(Generic[T]):
    """The named entries of one family; names are unique, in registration order."""

    def __init__(self, family: str, *, hint: Callable[[str], str] | None = None) -> None:
        self.family = family  # in messages: "unknown {family} 'x'; known: ..."
        self._hint = hint  # an unknown name -> more words after it (e.g. a rename)
        self._entries: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def register(self, name: str, entry: T, *, help: str = "") -> None:
        """Add `entry` under `name` (a non-empty string without surrounding spaces)."""
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"{self.family} name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.family} {name!r} is already registered")
        self._entries[name] = entry
        self._help[name] = help

    def get(self, name: str) -> T:
        """The entry registered under `name`; `UnknownNameError` lists the known names."""
        if isinstance(name, str) and name in self._entries:
            return self._entries[name]
        known = ", ".join(self._entries) or "(none)"
        more = self._hint(name) if self._hint is not None and isinstance(name, str) else ""
        raise UnknownNameError(f"unknown {self.family} {name!r}{more}; known: {known}")

    def help(self, name: str) -> str:
        """The one-line description given at registration."""
        self.get(name)
        return self._help[name]

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.family!r}: {', '.join(self._entries)})"
