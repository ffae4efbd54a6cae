"""A Python mirror of the native index's file format (cpp/index/token_index_io.cc), to
read a saved index and write an edited one with a valid checksum
(tests/index/test_token_index_io.py, tests/corpora/test_global_build.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

M64 = (1 << 64) - 1

# --------------------------------------------------------------------- the file format
# Mirrors cpp/index/token_index_io.cc (format version 5): a 32-byte header, then a payload of
# sections each zero-padded to 8 bytes; the checksum runs over the payload's 8-byte words.
# Version 4 is the same without the last two sections (the frequent picks).
STATE_FIELDS = [
    "len", "link", "first_child", "next_sib", "prev_sib", "own_head", "edge_head",
    "in_tok", "in_tgt", "first_pos", "last_pos",
]  # fmt: skip
F = {name: i for i, name in enumerate(STATE_FIELDS)}
EMPTY_KEY = M64


def _mix64(k: np.ndarray) -> np.ndarray:
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xFF51AFD7ED558CCD)
    k = k ^ (k >> np.uint64(33))
    k = k * np.uint64(0xC4CEB9FE1A85EC53)
    return k ^ (k >> np.uint64(33))


def _mix1(k: int) -> int:
    return int(_mix64(np.array([k], dtype=np.uint64))[0])


def checksum(payload: bytes) -> int:
    words = np.frombuffer(payload, dtype="<u8")
    h = 0x9E3779B97F4A7C15
    for m in _mix64(words).tolist():
        h = ((h ^ m) * 0x100000001B3) & M64
    return _mix1(h ^ _mix1(len(words)))


@dataclass
class Doc:
    id: int
    removed: int
    last_state: int
    tokens: np.ndarray  # int32


@dataclass
class IndexFile:
    """A saved index, section by section, editable and writable with a valid checksum."""

    docs: list[Doc]
    epoch: int
    states: np.ndarray  # int32 [num_states, 11]
    edge_next: np.ndarray  # int32
    own_next: np.ndarray  # int32
    edge_token: np.ndarray  # int32
    pos_doc: np.ndarray  # uint32
    pos_off: np.ndarray  # uint32
    edges_size: int
    keys: np.ndarray  # uint64
    vals: np.ndarray  # int32
    pick_occurrences: int  # 0 and no picks: a live index's file
    picks: np.ndarray  # uint32, one per state (a frozen index's)
    header: bytes = field(default=b"", repr=False)

    @classmethod
    def parse(cls, data: bytes) -> IndexFile:
        pos = 32

        def u64() -> int:
            nonlocal pos
            (v,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            return int(v)

        def scalar(fmt: str) -> int:
            nonlocal pos
            (v,) = struct.unpack_from(fmt, data, pos)
            pos += 8
            return int(v)

        def vec(dtype: str, width: int = 1) -> np.ndarray:
            nonlocal pos
            n = u64()
            size = n * np.dtype(dtype).itemsize * width
            arr = np.frombuffer(data, dtype=dtype, count=n * width, offset=pos).copy()
            pos += size + (-size) % 8
            return arr.reshape(n, width) if width > 1 else arr

        docs = []
        for _ in range(u64()):
            doc_id = scalar("<q")
            removed = scalar("<B")
            last_state = scalar("<i")
            docs.append(Doc(doc_id, removed, last_state, vec("<i4")))
        epoch = u64()
        states = vec("<i4", 11)
        if states.ndim == 1:
            states = states.reshape(0, 11)
        out = cls(
            docs, epoch, states, vec("<i4"), vec("<i4"), vec("<i4"), vec("<u4"), vec("<u4"),
            u64(), vec("<u8"), vec("<i4"), u64(), vec("<u4"), header=data[:32],
        )  # fmt: skip
        assert pos == len(data)
        return out

    def payload(self, version: int = 5) -> bytes:
        parts: list[bytes] = []

        def pad(b: bytes) -> bytes:
            return b + b"\0" * ((-len(b)) % 8)

        def vec(arr: np.ndarray, dtype: str, count: int | None = None) -> None:
            a = np.ascontiguousarray(arr, dtype=dtype)
            n = len(a) if count is None else count
            parts.append(struct.pack("<Q", n))
            parts.append(pad(a.tobytes()))

        parts.append(struct.pack("<Q", len(self.docs)))
        for d in self.docs:
            parts.append(struct.pack("<q", d.id))
            parts.append(pad(struct.pack("<B", d.removed & 0xFF)))
            parts.append(pad(struct.pack("<i", d.last_state)))
            vec(d.tokens, "<i4")
        parts.append(struct.pack("<Q", self.epoch & M64))
        vec(self.states.reshape(-1), "<i4", count=len(self.states))
        vec(self.edge_next, "<i4")
        vec(self.own_next, "<i4")
        vec(self.edge_token, "<i4")
        vec(self.pos_doc, "<u4")
        vec(self.pos_off, "<u4")
        parts.append(struct.pack("<Q", self.edges_size & M64))
        vec(self.keys, "<u8")
        vec(self.vals, "<i4")
        if version >= 5:
            parts.append(struct.pack("<Q", self.pick_occurrences & M64))
            vec(self.picks, "<u4")
        return b"".join(parts)

    def to_bytes(self, version: int = 5) -> bytes:
        """The file, with payload size and checksum recomputed: the loader sees no damage
        (`version=4`: the format before the frequent picks)."""
        payload = self.payload(version)
        head = self.header[:8] + struct.pack("<I", version) + self.header[12:16]
        return head + struct.pack("<QQ", len(payload), checksum(payload)) + payload
