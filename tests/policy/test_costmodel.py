"""Cost models and p*: hand-computed rooflines, profile interpolation and validation."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from agspec.policy.costmodel import (
    MODEL_SHAPES,
    Accelerator,
    CostProfileError,
    ModelShape,
    ProfileCostModel,
    RooflineCostModel,
    break_even_accept_prob,
    get_cost_model,
    list_cost_models,
)

REPO = Path(__file__).resolve().parents[2]

# A shape small enough to compute by hand:
#   layer: q 2·1·2=4, k+v 2·2·1·2=8, o 4, mlp 3·2·4=24 -> 40; + LM head 10·2=20 -> 60.
TOY = ModelShape(
    name="toy",
    num_layers=1,
    hidden_size=2,
    num_heads=1,
    num_kv_heads=1,
    head_dim=2,
    intermediate_size=4,
    vocab_size=10,
)
TOY_ACC = Accelerator(name="toy", memory_bytes_per_s=100.0, flop_per_s=1000.0)


def toy_model(**kw: object) -> RooflineCostModel:
    args: dict[str, object] = dict(
        shape=TOY,
        accelerator=TOY_ACC,
        context_tokens=3,
        weight_bytes_per_param=1.0,
        kv_bytes_per_element=1.0,
        overhead_ms=0.0,
    )
    args.update(kw)
    return RooflineCostModel(**args)  # type: ignore[arg-type]


def test_roofline_by_hand() -> None:
    m = toy_model()
    assert TOY.matmul_params == 60
    # n=1, B=1: memory 60 + 1·(3+1 keys)·(2·1·2·1 bytes) = 76 B -> 760 ms;
    # compute 2·60·1 + 4·1·4·1·2 = 152 FLOP -> 152 ms. Memory-bound.
    assert m.memory_bytes(1, 1) == 76
    assert m.flops(1, 1) == 152
    assert m.step_time_ms(1, 1) == pytest.approx(760.0)
    # n=10, B=2: memory 60 + 2·13·4 = 164 B -> 1640 ms; compute 2·60·20 + 2·(4·10·13·2)
    # = 2400 + 2080 = 4480 FLOP -> 4480 ms. Compute-bound.
    assert m.step_time_ms(10, 2) == pytest.approx(4480.0)
    # n=1, B=2: memory 60 + 2·4·4 = 92 B -> 920 ms (compute 304 ms).
    assert m.step_cost(10, 2) == pytest.approx(4480.0 / 920.0)
    assert m.step_cost(1, 2) == 1.0
    # The overhead is added once per step.
    assert toy_model(overhead_ms=40.0).step_cost(10, 2) == pytest.approx(4520.0 / 960.0)


def test_real_shapes_match_published_parameter_counts() -> None:
    q7 = MODEL_SHAPES["qwen2.5-7b"]
    # transformers counts 7,615,616,512 for Qwen2.5-7B (and so did scripts/gpu_verify_profile.py
    # on the H200: 7.616B); the shape leaves out the q/k/v biases and the RMSNorm weights.
    biases = q7.num_layers * (q7.num_heads + 2 * q7.num_kv_heads) * q7.head_dim
    norms = (2 * q7.num_layers + 1) * q7.hidden_size
    assert q7.total_params + biases + norms == 7_615_616_512
    assert MODEL_SHAPES["qwen2.5-32b"].total_params == pytest.approx(32.5e9, rel=0.01)
    assert MODEL_SHAPES["gemma3-27b"].total_params == pytest.approx(27.0e9, rel=0.01)


def test_gemma_sliding_window_layers() -> None:
    g = MODEL_SHAPES["gemma3-27b"]
    keys = g.attended_tokens(4096)
    assert keys.count(4096) == 10  # layers 6, 12, ..., 60 are global
    assert keys.count(1024) == 52
    assert g.attended_tokens(500) == [500] * 62


@pytest.mark.parametrize("name", ["h200-qwen2.5-7b", "h200-qwen2.5-32b", "h200-gemma3-27b"])
@pytest.mark.parametrize("batch", [1, 16, 64])
def test_presets_unit_and_monotone(name: str, batch: int) -> None:
    m = get_cost_model(name, context_tokens=8192)
    costs = [m.step_cost(n, batch) for n in range(1, 40)]
    assert costs[0] == 1.0
    assert all(b >= a for a, b in zip(costs, costs[1:], strict=False))


def test_roofline_batch_makes_drafts_expensive() -> None:
    m = get_cost_model("h200-qwen2.5-32b", context_tokens=4096)
    # B=1: 16 tokens are still memory-bound (flat). B=64, n=1: 64 GB of weights + 68.7 GB
    # of KV (64 seqs · 64 layers · 4097 keys · 4 KiB) at 4.8 TB/s = 27.6 ms. n=16: 2 · 32.0e9
    # params · 1024 tokens + 5.5 TFLOP attention = 71 TFLOP at 989 TFLOP/s = 71.8 ms.
    assert m.step_cost(16, 1) == pytest.approx(1.0, abs=0.01)
    assert m.step_cost(16, 64) == pytest.approx(72.1 / 27.9, rel=0.01)
    assert break_even_accept_prob(m, 1) == 0.01
    assert break_even_accept_prob(m, 64) > break_even_accept_prob(m, 16)


def test_preset_errors() -> None:
    with pytest.raises(ValueError, match="unknown cost model"):
        get_cost_model("h100-qwen2.5-7b")
    with pytest.raises(ValueError, match="context_tokens"):
        get_cost_model("h200-qwen2.5-7b", context_tokens=-1)
    m = get_cost_model("h200-qwen2.5-7b")
    with pytest.raises(ValueError, match="n_tokens"):
        m.step_cost(0, 1)
    with pytest.raises(ValueError, match="batch_size"):
        m.step_cost(1, 0)
    assert "h200-qwen2.5-7b-measured" in list_cost_models()


class Linear:
    """step_cost = 1 + slope·(n - 1)."""

    def __init__(self, slope: float) -> None:
        self.slope = slope

    def step_cost(self, n_tokens: int, batch_size: int) -> float:
        return 1.0 + self.slope * (n_tokens - 1)

    def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
        return self.step_cost(n_tokens, batch_size)


def test_break_even_by_hand() -> None:
    assert break_even_accept_prob(Linear(0.1), 1) == pytest.approx(0.1)
    assert break_even_accept_prob(Linear(0.1), 1, n_tokens=5) == pytest.approx(0.1)
    assert break_even_accept_prob(Linear(0.0), 1) == 0.01  # free positions: clipped low
    assert break_even_accept_prob(Linear(3.0), 1) == 0.99  # dearer than a decode step


def test_break_even_averages_over_range() -> None:
    # Costs 1, 1, 1, 2, 2: Δc is 0, 0, 1, 0 -> over n=1..4 the mean is 1/4.
    class Step:
        def step_cost(self, n_tokens: int, batch_size: int) -> float:
            return 1.0 if n_tokens <= 3 else 2.0

        def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
            return self.step_cost(n_tokens, batch_size)

    assert break_even_accept_prob(Step(), 1, n_tokens=(1, 4)) == pytest.approx(0.25)
    assert break_even_accept_prob(Step(), 1, n_tokens=3) == pytest.approx(0.99)
    assert break_even_accept_prob(Step(), 1, n_tokens=1) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="range"):
        break_even_accept_prob(Step(), 1, n_tokens=(4, 2))


def profile(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "format": "agspec-cost-profile",
        "version": 1,
        "backend": "llama.cpp",
        "model": "m",
        "device": "cpu",
        "context_tokens": 512,
        "batch_sizes": {
            "1": {"n_tokens": [1, 2, 4], "step_ms": [10.0, 12.0, 20.0]},
            "16": {"n_tokens": [1, 3], "step_ms": [20.0, 60.0]},
        },
    }
    doc.update(over)
    return doc


def test_profile_interpolation_by_hand() -> None:
    m = ProfileCostModel.from_dict(profile())
    assert m.step_time_ms(1, 1) == 10.0
    assert m.step_time_ms(3, 1) == pytest.approx(16.0)  # halfway between 12 and 20
    assert m.step_time_ms(6, 1) == pytest.approx(28.0)  # last slope, 4 ms per token
    assert m.step_cost(3, 1) == pytest.approx(1.6)
    # B=16 measured at n=1,3: n=2 -> 40 ms; B=4 is 3/15 of the way from B=1 to B=16.
    assert m.step_time_ms(2, 16) == pytest.approx(40.0)
    assert m.step_time_ms(2, 4) == pytest.approx(12.0 + (40.0 - 12.0) * 3 / 15)
    assert m.step_cost(2, 4) == pytest.approx((12.0 + 28.0 * 3 / 15) / (10.0 + 10.0 * 3 / 15))
    # Outside the measured batch sizes: the nearest one.
    assert m.step_cost(3, 64) == m.step_cost(3, 16) == pytest.approx(3.0)
    assert break_even_accept_prob(m, 16, n_tokens=1) == pytest.approx(0.99)  # Δc = 1.0 -> clip


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"format": "other"}, "format must be"),
        ({"version": 2}, "unsupported version"),
        ({"batch_sizes": {}}, "non-empty"),
        ({"context_tokens": "4k"}, "context_tokens"),
        ({"batch_sizes": {"x": {"n_tokens": [1], "step_ms": [1.0]}}}, "not an integer"),
        ({"batch_sizes": {"1": {"n_tokens": [1, 3, 2], "step_ms": [1, 2, 3]}}}, "increasing"),
        ({"batch_sizes": {"1": {"n_tokens": [2, 3], "step_ms": [1, 2]}}}, "start at 1"),
        ({"batch_sizes": {"1": {"n_tokens": [1, 2], "step_ms": [1.0]}}}, "equal length"),
        ({"batch_sizes": {"1": {"n_tokens": [1, 2], "step_ms": [1.0, -2.0]}}}, "> 0"),
        ({"batch_sizes": {"1": {"n_tokens": [1, 2], "step_ms": [1.0, math.nan]}}}, "finite"),
        ({"batch_sizes": {"1": {"step_ms": [1.0]}}}, "'n_tokens' and 'step_ms'"),
    ],
)
def test_profile_validation(over: dict[str, object], message: str) -> None:
    with pytest.raises(CostProfileError, match=message):
        ProfileCostModel.from_dict(profile(**over))


def test_profile_missing_field_and_files(tmp_path: Path) -> None:
    doc = profile()
    del doc["device"]
    with pytest.raises(CostProfileError, match="missing field 'device'"):
        ProfileCostModel.from_dict(doc)
    with pytest.raises(CostProfileError, match="no such cost profile"):
        ProfileCostModel.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostProfileError, match="not a readable JSON"):
        ProfileCostModel.load(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(profile(notes="extra fields are kept")))
    m = ProfileCostModel.load(good)
    assert m.extra["notes"] == "extra fields are kept"
    assert m.batch_sizes == (1, 16)


def test_shipped_h200_profiles() -> None:
    m4 = get_cost_model("h200-qwen2.5-7b-measured", context_tokens=4096)
    m16 = get_cost_model("h200-qwen2.5-7b-measured", context_tokens=12000)
    assert isinstance(m4, ProfileCostModel) and isinstance(m16, ProfileCostModel)
    assert (m4.context_tokens, m16.context_tokens) == (4096, 16384)
    assert m4.device == "NVIDIA H200"
    for m in (m4, m16):
        assert m.batch_sizes == (1, 16)
        assert m.curves[1].n_tokens == tuple(range(1, 34))
        assert m.step_cost(1, 16) == 1.0
        assert 0.01 <= break_even_accept_prob(m, 16) <= 0.99
    with pytest.raises(ValueError, match="no overrides"):
        get_cost_model("h200-qwen2.5-7b-measured", overhead_ms=1.0)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="scripts/gpu_verify_profile.py needs torch and transformers (extra 'transformers')",
)
def test_gpu_profile_script_tiny_on_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU script's --tiny mode runs on a CPU and writes profiles this module loads."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gpu_verify_profile as script
    finally:
        sys.path.pop(0)
    # A smaller grid than --tiny's own, to keep the suite fast.
    monkeypatch.setattr(script, "TINY_GRID", script.Grid((32, 64), (1, 2), (1, 2, 3), 0, 1))
    out = tmp_path / "tiny.json"
    assert script.main(["--tiny", "--device", "cpu", "--out", str(out)]) == 0
    raw = json.loads(out.read_text())
    assert all(fc["ok"] for fc in raw["forward_check"].values())
    for ctx in script.TINY_GRID.contexts_tokens:
        m = ProfileCostModel.load(tmp_path / f"tiny-ctx{ctx}.json")
        assert m.context_tokens == ctx
        assert m.batch_sizes == script.TINY_GRID.batch_sizes
        assert m.step_cost(1, 1) == 1.0
