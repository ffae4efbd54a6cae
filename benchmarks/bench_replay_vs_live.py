"""Does replay agree with reality? Accept lengths replayed vs measured live (issue 7).

For every call recorded by `agspec record` (default: the shipped default traces), the
live per-step accept lengths (AgSpec inside llama.cpp, from the `.live` sidecar) are
compared with two replays of the same AgSpec configuration on the recorded outputs:

- **exact**: a greedy loop exactly like the live one: a fresh `AgSpecServer` per
  session, the session's emission format, artifacts opened before each call, the same
  draft budget per step (`min(num_draft_tokens, max_new_tokens - produced - 1)`), the
  output ids re-encoded from the recorded text with the final `<|im_end|>` when the live
  call stopped at EOS; accept = LCP(draft, recorded continuation), commit accept + 1.
- **lab**: the replay lab itself (`agspec.lab.load_sessions` + `replay_batched` at
  B = 1, `max_draft_tokens = num_draft_tokens`, no global corpus), which does not model
  EOS and picks a session's emission format by majority of calls.

A step agrees when both give the same accept length at the same step index; a call
agrees when all its steps do. Every disagreeing call is listed with its cause:
`retokenized` (the recorded text re-encodes to other ids than the model produced),
`eos` (a live step accepted draft tokens past EOS) or `other`; a lab disagreement is
`end-of-output rules` when this loop run with the lab's rules (no EOS, full budget, no
bonus after a draft that covers the rest) reproduces it, with or without `majority
emission format`, else `unexplained`.

    python benchmarks/bench_replay_vs_live.py [TRACES.jsonl[.gz]] [--live SIDECAR]
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agspec.drafter import VARIANTS, AgSpecServer
from agspec.lab.greedy import replay_live_record
from agspec.tokenizers import get_tokenizer
from agspec.traces import iter_sessions
from agspec.traces.recorder import read_sidecar, sidecar_path
from agspec.traces.schema import Session

DEFAULT = Path(__file__).resolve().parent.parent / "src/agspec/data/traces/default.jsonl.gz"


def read_any(path: Path) -> Iterator[Session]:
    """Sessions of a plain or gzip-compressed trace file."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            yield from iter_sessions(f, str(path))
    else:
        with open(path, encoding="utf-8") as g:
            yield from iter_sessions(g, str(path))


def replay_loop(
    session: Session,
    live: dict[str, Any],
    budget: int,
    *,
    like_lab: bool = False,
    emission: str | None = None,
) -> list[list[int]]:
    """Per call, the accept length of each step (agspec.lab.greedy.replay_live_record)."""
    return replay_live_record(session, live, budget, like_lab=like_lab, emission=emission)


def majority_emission(session: Session) -> str:
    """The replay lab's rule: the most frequent call format, first seen wins a tie."""
    counts = Counter(c.emission_format for c in session.calls)
    return max(counts, key=lambda k: counts[k]) if counts else "none"


def replay_lab(path: Path, budget: int) -> dict[tuple[str, int], list[int]]:
    """Per (session, call index), accept lengths from the replay lab's simulator."""
    from agspec.lab.run import load_sessions
    from agspec.lab.simulator import replay_batched

    class Flat:
        def step_cost(self, n_tokens: int, batch_size: int) -> float:
            return 1.0

    tok = get_tokenizer("qwen2.5")
    plain = path
    if path.suffix == ".gz":  # the lab reads plain JSONL
        plain = Path("/tmp") / (path.stem + ".bench.jsonl")
        plain.write_bytes(gzip.decompress(path.read_bytes()))
    sessions = load_sessions([plain], tok)
    pairs = [
        (s, AgSpecServer(tokenizer=tok, config=VARIANTS["agspec-paper"], name="agspec-paper"))
        for s in sessions
    ]
    res = replay_batched(pairs, batch_size=1, cost_model=Flat(), max_draft_tokens=budget)
    out: dict[tuple[str, int], list[int]] = {}
    for row in res.recorder.rows():
        out.setdefault((row["session"], row["call_index"]), []).append(row["accepted"])
    return out


def cause(rec: dict[str, Any], call_text: str) -> str:
    tok = get_tokenizer("qwen2.5")
    ids = rec["output_ids"]
    body = ids[:-1] if rec["stopped_by"] == "eos" else ids
    if list(tok.encode(call_text)) != body:
        return "retokenized"
    if any(acc > committed - 1 for _, acc, committed in rec["steps"]):
        return "eos"
    return "other"


def compare_ar(spec: dict[str, Any], ar: dict[str, Any]) -> None:
    """Outputs with and without drafting, call by call, and decode speed per agent.

    A session is compared up to its first differing call: later prompts depend on it.
    """
    same = differ = 0
    speed: dict[tuple[str, str], list[float]] = {}
    for sid, rec in spec.items():
        other = ar.get(sid)
        if other is None:
            continue
        for a, b in zip(rec["calls"], other["calls"]):
            if a["output_ids"] != b["output_ids"]:
                differ += 1
                print(f"  {sid} call {a['index']}: outputs differ with and without drafting")
                break
            same += 1
            for name, c in (("agspec", a), ("ar", b)):
                acc = speed.setdefault((a["agent"], name), [0.0, 0.0])
                acc[0] += len(c["output_ids"])
                acc[1] += (c["total_ms"] - c["prefill_ms"]) / 1000.0
    print(f"\nLossless: {same} calls identical with and without AgSpec, {differ} differ")
    print("\n| agent | AR tokens/s | AgSpec tokens/s | ratio |")
    print("|---|--:|--:|--:|")
    for agent in sorted({k[0] for k in speed}):
        ar_tps = speed[(agent, "ar")][0] / max(speed[(agent, "ar")][1], 1e-9)
        sp_tps = speed[(agent, "agspec")][0] / max(speed[(agent, "agspec")][1], 1e-9)
        print(f"| {agent} | {ar_tps:.1f} | {sp_tps:.1f} | {sp_tps / ar_tps:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="?", default=str(DEFAULT))
    ap.add_argument("--live", default=None, help="live sidecar (default: <traces>.live...)")
    ap.add_argument("--no-lab", action="store_true", help="skip the replay-lab comparison")
    ap.add_argument(
        "--ar",
        default=None,
        help="a recording of the same tasks with --drafter none: "
        "compare outputs (lossless) and decode speed",
    )
    args = ap.parse_args(argv)
    path = Path(args.traces)
    live = read_sidecar(args.live or sidecar_path(path))
    budget_of = {
        sid: rec.get("config", {}).get("num_draft_tokens", 16) for sid, rec in live.items()
    }
    budgets = set(budget_of.values()) or {16}
    if len(budgets) != 1:
        raise SystemExit(f"sessions use different draft budgets {sorted(budgets)}")
    budget = budgets.pop()
    lab = {} if args.no_lab else replay_lab(path, budget)
    totals: dict[str, Counter[str]] = {"exact": Counter(), "lab": Counter()}
    per_agent: dict[str, Counter[str]] = {}
    report = io.StringIO()
    for session in read_any(path):
        rec = live.get(session.session_id)
        if rec is None:
            print(f"{session.session_id}: no live record, skipped", file=sys.stderr)
            continue
        exact = replay_loop(session, rec, budget)
        lab_no_eos = replay_loop(session, rec, budget, like_lab=True)
        lab_mimic = replay_loop(
            session, rec, budget, like_lab=True, emission=majority_emission(session)
        )
        for i, (call, crec) in enumerate(zip(session.calls, rec["calls"])):
            live_acc = [s[1] for s in crec["steps"]]
            agent = per_agent.setdefault(call.agent, Counter())
            agent["steps"] += len(live_acc)
            agent["accepted"] += sum(live_acc)
            agent["calls"] += 1
            # The live adapter counts draft tokens that matched past EOS (not committed);
            # clipped, a step's accept length is at most its committed tokens.
            clipped = [min(s[1], s[2]) for s in crec["steps"]]
            totals.setdefault("exact, live clipped at EOS", Counter())
            t = totals["exact, live clipped at EOS"]
            t["calls"] += 1
            t["steps"] += max(len(clipped), len(exact[i]))
            t["steps_agree"] += sum(1 for a, b in zip(clipped, exact[i]) if a == b)
            if clipped == exact[i]:
                t["calls_agree"] += 1
            else:
                t["cause:unexplained"] += 1
            for name, replayed in (("exact", exact[i]), ("lab", lab.get((session.session_id, i)))):
                if name == "lab" and args.no_lab:
                    continue
                replayed = replayed or []  # the lab records no step for an empty output
                t = totals[name]
                n = max(len(live_acc), len(replayed))
                same = sum(1 for a, b in zip(live_acc, replayed) if a == b)
                t["steps"] += n
                t["steps_agree"] += same
                t["calls"] += 1
                if same == n:
                    t["calls_agree"] += 1
                else:
                    if name == "exact":
                        why = cause(crec, call.output)
                    elif replayed == lab_no_eos[i]:
                        why = "lab: end-of-output rules"
                    elif replayed == lab_mimic[i]:
                        why = "lab: end-of-output rules + majority emission format"
                    else:
                        why = "lab: unexplained"
                    t[f"cause:{why}"] += 1
                    first = next(
                        (k for k, (a, b) in enumerate(zip(live_acc, replayed)) if a != b),
                        min(len(live_acc), len(replayed)),
                    )
                    print(
                        f"  {name}: {session.session_id} call {i} ({call.agent}): {why}; "
                        f"steps live {len(live_acc)} replay {len(replayed)}, first "
                        f"difference at step {first}: live {live_acc[first : first + 4]} "
                        f"replay {replayed[first : first + 4]}",
                        file=report,
                    )
    print(f"# {path.name}: draft budget {budget} tokens/step")
    print("| replay | calls | calls agreeing | steps | steps agreeing | disagreement causes |")
    print("|---|--:|--:|--:|--:|---|")
    for name, t in totals.items():
        if not t["calls"]:
            continue
        causes = ", ".join(f"{k[6:]} {v}" for k, v in sorted(t.items()) if k.startswith("cause:"))
        print(
            f"| {name} | {t['calls']} | {t['calls_agree']} ({t['calls_agree'] / t['calls']:.1%}) "
            f"| {t['steps']} | {t['steps_agree']} ({t['steps_agree'] / t['steps']:.1%}) "
            f"| {causes or '-'} |"
        )
    print("\n| agent | calls | live steps | mean live accept length |")
    print("|---|--:|--:|--:|")
    for agent, c in sorted(per_agent.items()):
        print(
            f"| {agent} | {c['calls']} | {c['steps']} | {c['accepted'] / max(c['steps'], 1):.2f} |"
        )
    if args.ar:
        compare_ar(live, read_sidecar(sidecar_path(Path(args.ar))))
    if report.getvalue():
        print("\nDisagreeing calls:")
        print(report.getvalue(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
