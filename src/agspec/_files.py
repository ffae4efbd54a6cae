"""Output files that are written whole or not at all, and never over an input.

Every file AgSpec writes (state files, traces, indexes, run folders, plots) goes through
`atomic_output` / `atomic_write_text`: the bytes go to a temporary file in the target's
folder, which is flushed to disk and renamed over the target only when complete. A reader
sees the old file or the new one, never half of one; an exception (Ctrl-C included)
removes the temporary file.

A process killed with `kill -9` mid-write cannot remove its temporary file. Their names
are ours and say who wrote them, `.<target name>.<host>.<pid>.<random>.tmp`, so the next
write of the same target removes the stale ones: those of a process of this host that is
gone, and any of ours (older layouts included) untouched for `STALE_TMP_S` seconds. Other
files are never touched.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> atomic_write_text(d / "a.json", "{}")
>>> sorted(p.name for p in d.iterdir())
['a.json']
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

__all__ = [
    "STALE_TMP_S",
    "atomic_output",
    "atomic_write_text",
    "check_not_input",
    "clean_stale_temps",
]

# A temporary file of ours untouched this long belongs to a writer that is gone: a state
# save takes milliseconds, and a large output is written (and its mtime moves) continuously.
STALE_TMP_S = 3600.0

_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"
# mkstemp's random part: 8 characters of [a-z0-9_].
_RAND = r"[a-z0-9_]{8}"


def _tmp_prefix(name: str) -> str:
    return f".{name}.{_HOST}.{os.getpid()}."


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path to write; renamed over `path` when the block ends without error.

    The caller opens and closes the temporary path itself (any writer: `open`, gzip,
    pyarrow, a native `save`). The target's folder is created when missing (as for
    `atomic_write_text`: every command's output rule, `agspec replay -o` included).

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_output(target) as tmp:
    ...     _ = tmp.write_text("done")
    >>> target.read_text()
    'done'
    """
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"output {target} is a folder; give a file path")
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(target)
    fd, name = tempfile.mkstemp(prefix=_tmp_prefix(target.name), suffix=".tmp", dir=folder)
    os.close(fd)
    tmp = Path(name)
    try:
        # mkstemp makes the file 0600; give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
        _fsync_path(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` so a reader sees the old file or the new one, never half.

    The target's folder is created when missing.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(target) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def clean_stale_temps(path: str | os.PathLike[str], *, now: float | None = None) -> list[Path]:
    """Removes stale temporary files of ours for target `path`; returns those removed.

    Ours: `.<name>.<host>.<pid>.<random>.tmp` (this module's) or `.<name>.<random>.tmp`
    (the layout before it). Stale: written on this host by a process that no longer runs,
    or untouched for `STALE_TMP_S`. A live writer's file is never removed.
    """
    target = Path(path)
    folder = target.parent
    base = re.escape("." + target.name + ".")
    ours = re.compile(rf"^{base}(?:(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.)?{_RAND}\.tmp$")
    prefix = "." + target.name + "."
    removed: list[Path] = []
    now = time.time() if now is None else now
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        m = ours.match(entry.name)
        if m is None:
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        gone = (
            m.group("pid") is not None
            and m.group("host") == _HOST
            and int(m.group("pid")) != os.getpid()
            and not _pid_alive(int(m.group("pid")))
        )
        if gone or age > STALE_TMP_S:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process, or an absurd number: leave the file alone
    return True


def check_not_input(
    output: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]]
) -> None:
    """ValueError when `output` is one of `inputs` (same file, by path or inode).

    >>> check_not_input("a.jsonl", ["b.log"])
    >>> check_not_input("a.log", ["./a.log"])
    Traceback (most recent call last):
    ...
    ValueError: output a.log is also an input (./a.log): refusing to overwrite an input
    """
    out = Path(output)
    out_resolved = out.resolve()
    for item in inputs:
        p = Path(item)
        same = p.resolve() == out_resolved
        if not same and out.exists() and p.exists():
            with contextlib.suppress(OSError):
                same = os.path.samefile(p, out)
        if same:
            raise ValueError(
                f"output {output} is also an input ({item}): refusing to overwrite an input"
            )
