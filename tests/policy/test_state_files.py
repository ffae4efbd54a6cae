"""Scales and curves state files: hostile content warns and starts fresh; stale temporary
files of a killed save are removed by the next save, and nothing else is (issue 12)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chartok import CharTokenizer

from agspec import _files
from agspec.drafter import AgSpecConfig, AgSpecServer
from agspec.policy.caps import CapsFileError, ProfiledCap
from agspec.policy.scale import SCALES_FORMAT, OnlineScale
from agspec.policy.survival import CURVES_FORMAT, MatchSurvival


def _scales(value: str) -> str:
    return (
        f'{{"format": "{SCALES_FORMAT}", "version": 1, "p_star": 0.5, "scales": {{"a": {value}}}}}'
    )


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999", "-2.0", "0", "true"])
def test_bad_scale_values_warn_and_start_fresh(tmp_path: Path, value: str) -> None:
    path = tmp_path / "scales.json"
    path.write_text(_scales(value))
    with pytest.warns(RuntimeWarning, match="ignoring corrupt scales file.*finite number > 0"):
        s = OnlineScale.load(path, p_star=0.3)
    assert s.scales == {}


def test_deeply_nested_state_files_warn_instead_of_recursion_error(tmp_path: Path) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    scales, curves = tmp_path / "scales.json", tmp_path / "curves.json"
    scales.write_text(deep)
    curves.write_text(deep)
    with pytest.warns(RuntimeWarning) as record:
        server = AgSpecServer(
            tokenizer=CharTokenizer(),
            config=AgSpecConfig(use_global=False, length_mode="cost"),
            scales_path=scales,
            curves_path=curves,
            cost_model=_FlatCost(),
        )
    text = " ".join(str(w.message) for w in record)
    assert "scales" in text and "curves" in text and "nested too deeply" in text
    assert server.lengths.scale is not None and server.lengths.scale.scales == {}
    caps = tmp_path / "caps.json"
    caps.write_text(deep)
    with pytest.raises(CapsFileError, match="nested too deeply"):
        ProfiledCap.load(caps)


class _FlatCost:
    def step_cost(self, n: int, batch_size: int) -> float:
        return 1.0 + 0.01 * (n - 1)


def _curves(at_risk: object, survived: object, bucket: object = 1) -> str:
    row = {"agent": "a", "bucket": bucket, "at_risk": at_risk, "survived": survived}
    doc = {"format": CURVES_FORMAT, "version": 1, "max_tokens": 2, "prior_weight": 4.0}
    return json.dumps({**doc, "curves": [row]})


@pytest.mark.parametrize(
    "text",
    [
        _curves([True, True], [True, True]),  # booleans are not counts
        _curves([2, 2], [1, 1], bucket=True),
        _curves([2, 2], [1, 1]).replace("[1, 1]", "[NaN, 1]"),
        _curves([2, 2], [1, 1]).replace("[2, 2]", "[1e999, 2]"),
        _curves([2, 2], [1, 1]).replace("[1, 1]", "[-1, 1]"),
        _curves(["2", "2"], [1, 1]),
        json.dumps({"format": CURVES_FORMAT, "version": 1, "max_tokens": True, "curves": []}),
    ],
)
def test_bad_curve_counts_warn_and_start_from_the_prior(tmp_path: Path, text: str) -> None:
    path = tmp_path / "curves.json"
    path.write_text(text)
    max_tokens = 1 if '"max_tokens": true' in text else 2
    with pytest.warns(RuntimeWarning, match="ignoring acceptance curves file"):
        s = MatchSurvival.load(path, max_tokens=max_tokens)
    assert s.counts == {}


def test_good_curves_still_load(tmp_path: Path) -> None:
    path = tmp_path / "curves.json"
    path.write_text(_curves([3, 2.5], [2, 1]))
    assert MatchSurvival.load(path, max_tokens=2).counts == {("a", 1): ([3.0, 2.5], [2.0, 1.0])}


_KILLED_SAVE = """
import os, sys, time
from agspec.policy.length import OnlineScale
def stall(*args):
    print("writing", flush=True)
    time.sleep(60)
os.replace = stall   # the temporary file is written; the rename never comes
OnlineScale(p_star=0.5, scales={"a": 2.0}).save(sys.argv[1])
"""


def _killed_save(path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SAVE, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_kill_9_during_a_save_leaves_temporaries_the_next_save_removes(tmp_path: Path) -> None:
    path = tmp_path / "scales.json"
    OnlineScale(p_star=0.5, scales={"a": 1.5}).save(path)
    for _ in range(3):
        _killed_save(path)
    # Each killed save left its file and removed the one before it (a dead writer's).
    orphans = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
    assert len(orphans) == 1
    # Files that are not ours, or not stale, stay.
    keep = [
        tmp_path / ".scales.json.notours.tmp",
        tmp_path / "scales.json.tmp",
        tmp_path / ".other.json.abcd1234.tmp",
        tmp_path / f".scales.json.{_files._HOST}.{os.getpid()}.abcd1234.tmp",  # a live writer
        tmp_path / ".scales.json.abcd1234.tmp",  # the old layout, fresh: maybe a live writer
        tmp_path / ".scales.json.otherhost.99999999.abcd1234.tmp",  # another host, fresh
    ]
    old = tmp_path / ".scales.json.efgh5678.tmp"  # the old layout, untouched for 2 hours
    for p in [*keep, old]:
        p.write_text("x")
    stale = time.time() - 2 * _files.STALE_TMP_S
    os.utime(old, (stale, stale))
    OnlineScale(p_star=0.5, scales={"a": 3.0}).save(path)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "scales.json")
    assert left == sorted(p.name for p in keep)
    assert json.loads(path.read_text())["scales"] == {"a": 3.0}
