"""PLD's drafting cost: the lab's `pld-hf` against HF transformers' own
`PromptLookupCandidateGenerator`, on the same steps of real sessions.

For each call of the first N sessions of a trace file, both draft at every step from the
same context (prompt + output so far, greedy acceptance of the lab's draft): the lab's
`prompt_lookup` on an int64 numpy array, HF's `get_candidates` on a `[1, L]` LongTensor
(what `generate(prompt_lookup_num_tokens=10)` hands it; building that tensor is
`generate`'s cost, not the drafter's, and is left out). Both rescan the whole context
every step; the drafts must be equal (checked). Prints µs per step and per output token.

    python benchmarks/pld_engine_cost.py traces/swe-agent.jsonl --sessions 10
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--sessions", type=int, default=10)
    a = ap.parse_args(argv)
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from agspec.baselines.pld import PLD_HF, prompt_lookup
    from agspec.lab.run import load_sessions
    from agspec.tokenizers import get_tokenizer

    torch.set_num_threads(1)  # the thread clock counts this thread only
    sessions = load_sessions([a.trace], get_tokenizer("qwen2.5"), limit_sessions=a.sessions)
    hf = PromptLookupCandidateGenerator(num_output_tokens=10, max_matching_ngram_size=2)
    clock = time.thread_time_ns  # CPU time, as the replay lab measures drafting
    lab_ns = hf_ns = steps = tokens = 0
    for s in sessions:
        for c in s.calls:
            full = np.concatenate(
                [np.asarray(c.prompt_ids, dtype=np.int64), np.asarray(c.output_ids, np.int64)]
            )
            full_t = torch.from_numpy(full)
            prompt_len, out = len(c.prompt_ids), c.output_ids
            hf.max_length = len(full) + 64  # no length cut inside the call
            pos = 0
            while pos < len(out):
                ctx = full[: prompt_len + pos]
                t0 = clock()
                draft = prompt_lookup(ctx, PLD_HF, 64)
                t1 = clock()
                cand, _ = hf.get_candidates(full_t[: prompt_len + pos].unsqueeze(0))  # type: ignore[arg-type]
                t2 = clock()
                theirs = cand[0, prompt_len + pos :].tolist()
                if theirs != draft:
                    raise SystemExit(f"drafts differ at {s.session_id}: {draft} vs {theirs}")
                lab_ns += t1 - t0
                hf_ns += t2 - t1
                rest = len(out) - pos
                acc = 0
                while acc < min(len(draft), rest) and draft[acc] == out[pos + acc]:
                    acc += 1
                pos += acc if acc == rest else acc + 1
                steps += 1
            tokens += len(out)
    print(
        f"{a.trace}: {len(sessions)} sessions, {steps} steps, {tokens} output tokens; "
        f"lab pld-hf {lab_ns / 1e3 / steps:.1f} us/step {lab_ns / 1e3 / tokens:.1f} us/token; "
        f"HF PromptLookupCandidateGenerator {hf_ns / 1e3 / steps:.1f} us/step "
        f"{hf_ns / 1e3 / tokens:.1f} us/token (same drafts)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
