"""Live speculative decoding on transformers (CPU torch): tokens/s of plain greedy
`generate`, transformers' own prompt lookup, and AgSpec drafters as the candidate source
of assisted decoding, side by side in one run, on the code calls of the bundled pipeline
sessions.

The model is Qwen2.5-Coder-0.5B-Instruct loaded from the same GGUF file the llama.cpp
benchmarks use (`agspec models fetch qwen2.5-coder-0.5b-instruct`): transformers
dequantizes it to float32 (`pip install -e ".[transformers-gguf]"`: gguf, accelerate),
so this is the same network as on llama.cpp with another kernel library and precision.

Before the measured methods, the script times one forward pass verifying n = 1..33 tokens
after a 1024-token context and writes it as an `agspec-cost-profile` (the cost model
`agspec-paper+cost` needs); on float32 CPU matmuls, 16 tokens cost about 2 decode steps
instead of llama.cpp's 5.

    python benchmarks/bench_live_transformers.py --calls 6 --max-new-tokens 128 \
        --drafters agspec,agspec-paper+cost --out /tmp/live-tf.json

Every method's output is compared with plain greedy's, token for token.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_live_llama_cpp import first_difference, pick_calls, warm_session  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACES = REPO / "src" / "agspec" / "data" / "traces" / "default.jsonl.gz"


def load_model(gguf: Path, threads: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    return model


def timed(generate: Any, ids: Any, **kwargs: Any) -> tuple[list[int], float]:
    """New token ids of one greedy `generate`-like call, and its wall seconds."""
    import torch

    t = time.perf_counter()
    with torch.no_grad():
        out = generate(ids, **kwargs)
    return out[0, ids.shape[1] :].tolist(), time.perf_counter() - t


def compared(reference: list[int], out: list[int], seconds: float) -> dict[str, Any]:
    return {
        "tokens": len(out),
        "s": seconds,
        "same": out == reference,
        "first_diff": first_difference(reference, out),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", default=str(DEFAULT_TRACES))
    ap.add_argument("--drafters", default="agspec,agspec-paper+cost")
    ap.add_argument("--calls", type=int, default=6, help="code calls to run")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=2048)
    ap.add_argument("--num-draft-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile-repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write per-call results as JSON")
    args = ap.parse_args(argv)

    import torch

    from agspec.adapters.transformers import generate_with_drafter, measure_cost_profile
    from agspec.lab.registry import make_server
    from agspec.models import resolve_model
    from agspec.policy.costmodel import ProfileCostModel
    from agspec.tokenizers import get_tokenizer
    from agspec.traces import render_call

    model = load_model(resolve_model("qwen2.5-coder-0.5b-instruct"), args.threads)
    profile = measure_cost_profile(
        model,
        max_tokens=args.num_draft_tokens + 17,
        context_tokens=1024,
        repeats=args.profile_repeats,
        model_name="qwen2.5-coder-0.5b-instruct (dequantized GGUF)",
    )
    steps = profile["batch_sizes"]["1"]["step_ms"]
    print(
        "verification cost, x one decode step: "
        + ", ".join(f"n={n} {steps[n - 1] / steps[0]:.2f}" for n in (2, 4, 8, 16, 32)),
        file=sys.stderr,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(profile, f)
    cost_model = ProfileCostModel.load(f.name)

    tokenizer = get_tokenizer("qwen2.5")
    stops = [tokenizer.im_end_id, tokenizer.endoftext_id]
    drafters = [d for d in args.drafters.split(",") if d]
    calls = pick_calls(Path(args.traces), ["code"], args.calls, 13, args.max_new_tokens // 2)
    rows = []
    for session, index in calls:
        call = session.calls[index]
        prompt = list(render_call(call, "qwen2.5")[0][-args.max_prompt_tokens :])
        ids = torch.tensor([prompt], dtype=torch.long)
        gen = dict(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=stops)
        row: dict[str, Any] = {"session": session.session_id, "call": index, "prompt": len(prompt)}
        reference, s = timed(model.generate, ids, **gen)
        row["ar"] = {"tokens": len(reference), "s": s}
        out, s = timed(model.generate, ids, prompt_lookup_num_tokens=10, **gen)
        row["hf-pld"] = compared(reference, out, s)
        for name in drafters:
            server = make_server(
                name, global_docs=[], tokenizer=tokenizer, cost_model=cost_model, batch_size=1
            )
            ds = warm_session(server, session, index, args.num_draft_tokens)
            drafter = ds.call(call.agent, call.role, call.turn)
            holder: list[Any] = []

            def with_drafter(
                ids: Any, drafter: Any = drafter, holder: list = holder, **kw: Any
            ) -> Any:
                seq, stats = generate_with_drafter(
                    model, ids, drafter, num_draft_tokens=args.num_draft_tokens, **kw
                )
                holder.append(stats)
                return seq

            out, s = timed(with_drafter, ids, **gen)
            row[name] = compared(reference, out, s)
            row[name]["drafted"] = sum(holder[0].drafted_tokens)
            row[name]["accepted"] = sum(holder[0].accepted_tokens)
        rows.append(row)
        rates = [f"{k} {v['tokens'] / v['s']:.1f}" for k, v in row.items() if isinstance(v, dict)]
        print(f"p={len(prompt):5d}  tok/s: " + "  ".join(rates), file=sys.stderr)

    methods = [k for k, v in rows[0].items() if isinstance(v, dict)]
    ar_rate = sum(r["ar"]["tokens"] for r in rows) / sum(r["ar"]["s"] for r in rows)
    print(f"\n| calls | {' | '.join(methods)} |\n|---|{'---|' * len(methods)}")
    cells = []
    for m in methods:
        rate = sum(r[m]["tokens"] for r in rows) / sum(r[m]["s"] for r in rows)
        cells.append(f"{rate:.1f} tok/s ({rate / ar_rate:.2f}x)")
    print(f"| {len(rows)} | {' | '.join(cells)} |")
    diff = {m: sum(1 for r in rows if not r[m].get("same", True)) for m in methods}
    print(f"\noutputs different from ar: {diff}")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"profile": profile, "rows": rows, "args": vars(args)}, indent=1) + "\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
