"""The bundled task repos (`agspec/data/tasks/<name>/`): small Python projects with a bug.

Each folder holds 3–6 Python files (modules and `test_*.py` files that `python -m
unittest` discovers), a one-paragraph `ISSUE.md` and `REFERENCE.patch`, a known-good fix
used by the tests only (never shown to the model).

>>> task = load_task("paginate")
>>> task.name, sorted(task.files), task.test_files
('paginate', ['links.py', 'pages.py', 'test_pages.py'], ['test_pages.py'])
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TASKS_DIR", "Task", "TaskError", "task_names", "load_task", "load_tasks"]

TASKS_DIR = Path(__file__).resolve().parent.parent / "data" / "tasks"
ISSUE_FILE = "ISSUE.md"
REFERENCE_FILE = "REFERENCE.patch"
_MAX_FILE_BYTES = 64_000


class TaskError(ValueError):
    """A task folder that cannot be used (missing issue, no Python file, bad encoding)."""


@dataclass(frozen=True)
class Task:
    """A task repo in memory: `files` maps a relative path to its text (sorted by path)."""

    name: str
    issue: str
    files: dict[str, str]
    reference_patch: str = ""

    @property
    def test_files(self) -> list[str]:
        return [p for p in self.files if Path(p).name.startswith("test")]

    @property
    def source_files(self) -> list[str]:
        return [p for p in self.files if p not in self.test_files]


def task_names(root: str | os.PathLike[str] = TASKS_DIR) -> list[str]:
    """Names of the task folders under `root`, sorted."""
    base = Path(root)
    if not base.is_dir():
        raise TaskError(f"task folder {base} does not exist")
    return sorted(p.name for p in base.iterdir() if p.is_dir() and (p / ISSUE_FILE).exists())


def load_task(
    name_or_path: str | os.PathLike[str], root: str | os.PathLike[str] = TASKS_DIR
) -> Task:
    """A bundled task by name, or any folder laid out the same way by path."""
    text = os.fspath(name_or_path)
    folder = Path(text) if (os.sep in text or Path(text).is_dir()) else Path(root) / text
    if not folder.is_dir():
        known = ", ".join(task_names(root)) if Path(root).is_dir() else "none"
        raise TaskError(f"unknown task {text!r} (bundled tasks: {known})")
    issue_path = folder / ISSUE_FILE
    if not issue_path.is_file():
        raise TaskError(f"task {folder.name}: {ISSUE_FILE} is missing")
    files: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).as_posix()
        if "__pycache__" in rel:
            continue
        if path.stat().st_size > _MAX_FILE_BYTES:
            raise TaskError(f"task {folder.name}: {rel} is larger than {_MAX_FILE_BYTES} bytes")
        files[rel] = _read_text(path, folder.name)
    if not files:
        raise TaskError(f"task {folder.name}: no Python file")
    if not any(Path(p).name.startswith("test") for p in files):
        raise TaskError(f"task {folder.name}: no test file (test*.py)")
    ref = folder / REFERENCE_FILE
    return Task(
        name=folder.name,
        issue=_read_text(issue_path, folder.name).strip(),
        files=files,
        reference_patch=_read_text(ref, folder.name) if ref.is_file() else "",
    )


def _read_text(path: Path, task: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"task {task}: {path.name} is not UTF-8 (byte {exc.start})") from None


def load_tasks(names: Sequence[str], root: str | os.PathLike[str] = TASKS_DIR) -> list[str]:
    """Expand `all` and drop repeats, keeping order. Names are not loaded here: a missing
    or broken task is recorded as an `error` session instead of stopping the run."""
    out: list[str] = []
    for name in names:
        if name == "all":
            out.extend(n for n in task_names(root) if n not in out)
        elif name not in out:
            out.append(name)
    if not out:
        raise TaskError("no task given")
    return out
