"""Bundled task repos, the diff applier and the executor (issue 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agspec.pipeline.diffapply import PatchError, apply_patch, parse_patch
from agspec.pipeline.executor import run_patch, run_tests
from agspec.pipeline.tasks import TaskError, load_task, load_tasks, task_names

NAMES = task_names()


def test_at_least_twelve_small_tasks() -> None:
    assert len(NAMES) >= 12
    for name in NAMES:
        task = load_task(name)
        assert 3 <= len(task.files) <= 6, name
        assert sum(t.count("\n") for t in task.files.values()) <= 150, name
        assert task.test_files and task.source_files and task.reference_patch, name
        assert "\n\n" not in task.issue, f"{name}: the issue is one paragraph"


@pytest.mark.parametrize("name", NAMES)
def test_tests_fail_before_and_pass_after_the_reference_patch(name: str) -> None:
    task = load_task(name)
    before = run_tests(task.files, timeout_s=60)
    assert before.status == "failed", before.log
    assert "FAILED" in before.log
    after = run_patch(task.reference_patch, task.files, timeout_s=60)
    assert after.status == "passed", after.log
    assert after.changed_files and all(p in task.source_files for p in after.changed_files)


def test_load_tasks_expands_all_and_keeps_order() -> None:
    assert load_tasks(["paginate", "all"])[0] == "paginate"
    assert sorted(load_tasks(["all"])) == NAMES
    with pytest.raises(TaskError, match="no task"):
        load_tasks([])


def test_broken_task_folders_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="unknown task 'nope'"):
        load_task("nope")
    (tmp_path / "t").mkdir()
    with pytest.raises(TaskError, match="ISSUE.md is missing"):
        load_task(tmp_path / "t")
    (tmp_path / "t" / "ISSUE.md").write_text("x")
    with pytest.raises(TaskError, match="no Python file"):
        load_task(tmp_path / "t")
    (tmp_path / "t" / "m.py").write_bytes(b"x = '\xff'\n")
    with pytest.raises(TaskError, match="not UTF-8"):
        load_task(tmp_path / "t")


FILE = "a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n"


def test_apply_exact_patch() -> None:
    patch = "--- a/m.py\n+++ b/m.py\n@@ -2,3 +2,3 @@\n b = 2\n-c = 3\n+c = 30\n d = 4\n"
    assert apply_patch(patch, {"m.py": FILE}) == {"m.py": FILE.replace("c = 3", "c = 30")}


def test_apply_with_wrong_line_numbers_fence_and_prose() -> None:
    patch = (
        "Here is the fix:\n```diff\n--- m.py\n+++ m.py\n@@ -40,3 +40,4 @@\n d = 4\n-e = 5\n"
        "+e = 50\n+f = 6\n```\nThis fixes it."
    )
    assert apply_patch(patch, {"m.py": FILE})["m.py"] == FILE.replace("e = 5\n", "e = 50\nf = 6\n")


def test_apply_headerless_hunk_to_default_file_and_loose_whitespace() -> None:
    patch = "@@ -1,2 +1,2 @@\n a = 1   \n-b = 2\n+b = 20\n"
    out = apply_patch(patch, {"m.py": FILE, "n.py": "x\n"}, default_path="m.py")
    assert out == {"m.py": FILE.replace("b = 2", "b = 20")}


def test_unprefixed_lines_are_context_inside_a_fence_and_end_the_hunk_outside() -> None:
    body = "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\na = 1\n-b = 2\n+b = 3\nc = 3\n"
    assert apply_patch(f"```diff\n{body}```", {"m.py": FILE})["m.py"] == FILE.replace(
        "b = 2", "b = 3"
    )
    with pytest.raises(PatchError, match="no unified-diff hunk"):  # "a = 1" ends the hunk
        apply_patch(body, {"m.py": FILE})


def test_apply_fuzz_drops_a_wrong_context_line() -> None:
    patch = "--- a/m.py\n+++ b/m.py\n@@ -2,3 +2,3 @@\n b = 2\n-c = 3\n+c = 4\n WRONG\n"
    assert apply_patch(patch, {"m.py": FILE})["m.py"] == FILE.replace("c = 3", "c = 4")


def test_apply_two_hunks_and_a_blank_context_line_without_space() -> None:
    text = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    patch = (
        "--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n def f():\n-    return 1\n+    return 10\n\n"
        "@@ -5,2 +5,2 @@\n def g():\n-    return 2\n+    return 20\n"
    )
    assert apply_patch(patch, {"m.py": text})["m.py"] == text.replace("1\n", "10\n").replace(
        "2\n", "20\n"
    )


def test_non_applying_patches_raise() -> None:
    with pytest.raises(PatchError, match="does not match"):
        apply_patch("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-zzz = 9\n+zzz = 1\n", {"m.py": FILE})
    with pytest.raises(PatchError, match="not one of"):
        apply_patch("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n", {"m.py": FILE})
    with pytest.raises(PatchError, match="no unified-diff hunk"):
        parse_patch("I think the bug is in m.py.")


def test_executor_records_patch_errors_and_timeouts() -> None:
    files = {"m.py": "X = 1\n", "test_m.py": "import m\n"}
    bad = run_patch("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-Y = 1\n+Y = 2\n", files)
    assert bad.status == "patch_error" and "did not apply" in bad.observation()
    hang = {
        "test_h.py": "import unittest\nclass T(unittest.TestCase):\n"
        "    def test(self):\n        while True: pass\n"
    }
    slow = run_tests(hang, timeout_s=1.0)
    assert slow.status == "timeout" and slow.duration_s < 10
