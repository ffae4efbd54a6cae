"""Reproduce the independent cross-check of issue 5 (tokens per step at batch 1).

Settings, as the independent harness states them: Qwen2.5 tokenizer (ordinary text);
the prompt of a call is every earlier non-demo message of the raw history rendered as
`### <role>\\n<content>\\n\\n`, then `### assistant\\n` (SWE-agent, mini-swe-agent; no
history shortening); a ChatDev call's prompt is the text of the last `[Start Chat]` block;
accept = LCP plus one bonus token unless the draft covered the rest; no EOS; tokens per
step = output tokens / steps over all calls. The raw files are read here directly (not
through `agspec.traces`, whose importers shorten SWE-agent histories and use ChatML).

Drafters: PLD (`pld-hf`: n-gram 2 then 1, 10 tokens), SuffixDecoding per-request tree
(`suffix-64-local`), and + global tree of earlier responses (`suffix-64`; the tree grows
in file-name order of sessions: no split), and the oracle (cap 32) over this call, + the
session's earlier calls, + every earlier call of the run.

Example: `### user\\nfix it\\n\\n### assistant\\n` is the prompt of an assistant reply to
one user message.

    python benchmarks/crosscheck.py ../shared/data/traces -o runs/crosscheck
    python -m agspec.lab.crosscheck ../shared/data/traces   # the same
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agspec.lab.oracle import OracleServer
from agspec.lab.records import ReplayCall, ReplaySession
from agspec.lab.simulator import replay_batched

# (dev set, drafter or oracle scope) -> tokens per step measured by the independent harness.
EXPECTED: dict[str, dict[str, float]] = {
    "swe-agent": {
        "pld-hf": 2.14,
        "suffix-64-local": 2.41,
        "suffix-64": 2.91,
        "oracle-call": 5.21,
        "oracle-session": 5.21,
        "oracle-run": 7.56,
    },
    "chatdev": {
        "pld-hf": 2.73,
        "suffix-64-local": 3.02,
        "suffix-64": 4.62,
        "oracle-call": 6.27,
        "oracle-session": 7.97,
        "oracle-run": 10.81,
    },
    "mini-swe-agent": {
        "pld-hf": 1.83,
        "suffix-64-local": 1.93,
        "suffix-64": 2.06,
        "oracle-call": 4.51,
        "oracle-session": 4.51,
        "oracle-run": 5.55,
    },
}
CAP_TOKENS = 32

_RECORD = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [A-Z]+\] ", re.M)
_START = re.compile(r"([^\n:]+): \*\*\[Start Chat\]\*\*")
_OUTPUT = re.compile(r"([^\n:]+): \*\*(([^\n]+?)<->([^\n]+?) on : (\w+), turn (\d+))\*\*")


class PieceEncoder:
    """Encodes `### role\\ncontent\\n\\n` pieces once each (agents resend their history).

    Each piece starts with `###` after a `\\n\\n`, a pre-tokenizer boundary of the Qwen2
    regex, so encoding pieces apart gives the ids of the whole prompt encoded at once.
    """

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        self.encode = encode
        self.cache: dict[str, list[int]] = {}

    def piece(self, text: str) -> list[int]:
        ids = self.cache.get(text)
        if ids is None:
            ids = self.cache[text] = self.encode(text)
        return ids

    def chat_calls(self, messages: Sequence[tuple[str, str]], agent: str) -> list[ReplayCall]:
        """One call per assistant message; its prompt is every message before it."""
        calls: list[ReplayCall] = []
        prefix: list[int] = []
        for role, content in messages:
            if role == "assistant":
                prompt = prefix + self.piece("### assistant\n")
                calls.append(ReplayCall(agent, "any", len(calls), prompt, self.encode(content)))
            prefix = prefix + self.piece(f"### {role}\n{content}\n\n")
        return calls


def swe_agent_sessions(files: Sequence[str], enc: PieceEncoder) -> list[ReplaySession]:
    out = []
    for path in files:
        with open(path, encoding="utf-8") as fh:
            history = json.load(fh)["history"]
        messages = [(h["role"], h["content"]) for h in history if not h.get("is_demo", False)]
        out.append(
            ReplaySession(
                Path(path).name, tuple(enc.chat_calls(messages, "primary")), source="swe-agent"
            )
        )
    return out


def mini_swe_agent_sessions(files: Sequence[str], enc: PieceEncoder) -> list[ReplaySession]:
    out = []
    for path in files:
        with open(path, encoding="utf-8") as fh:
            messages = [(m["role"], m["content"]) for m in json.load(fh)["messages"]]
        out.append(
            ReplaySession(
                Path(path).name, tuple(enc.chat_calls(messages, "primary")), source="mini-swe-agent"
            )
        )
    return out


def chatdev_sessions(files: Sequence[str], enc: PieceEncoder) -> list[ReplaySession]:
    """Calls = output blocks after a `[Start Chat]`; a block whose output text repeats the
    block just before it is the same call logged twice and is dropped."""
    out = []
    for path in files:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        starts = [m.start() for m in _RECORD.finditer(text)]
        prompt: list[int] | None = None
        calls: list[ReplayCall] = []
        previous_output: str | None = None
        for a, b in zip(starts, [*starts[1:], len(text)], strict=True):
            body = _RECORD.sub("", text[a:b], count=1)
            if _START.match(body):
                prompt = enc.piece(body.strip())
                continue
            m = _OUTPUT.match(body)
            if not m or prompt is None:
                continue
            rest = body.split("\n", 1)[1].lstrip("\n") if "\n" in body else ""
            if rest.startswith("["):
                end = rest.find("]\n")
                rest = rest[end + 2 :] if end >= 0 else rest
            output = rest.strip()
            if output == previous_output:
                continue
            previous_output = output
            calls.append(ReplayCall(m.group(1), m.group(5), len(calls), prompt, enc.encode(output)))
        if calls:
            out.append(ReplaySession(Path(path).name, tuple(calls), source="chatdev"))
    return out


class _Flat:
    def step_cost(self, n_tokens: float, batch_size: int) -> float:
        return 1.0


def crosscheck_source(
    sessions: Sequence[ReplaySession], *, drafters: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """Tokens per step of every cross-check drafter on one dev set."""
    from agspec.baselines.registry import make_family

    names = list(drafters) if drafters else list(EXPECTED["swe-agent"])
    results: dict[str, dict[str, Any]] = {}
    outputs = {s.session_id: [c.output_ids for c in s.calls] for s in sessions}
    for name in names:
        server: Any
        if name.startswith("oracle-"):
            server = OracleServer(outputs, cap_tokens=CAP_TOKENS, scope=name.split("-", 1)[1])
        else:
            server = make_family(name, global_docs=[])
        t0 = time.perf_counter()
        res = replay_batched(
            [(s, server) for s in sessions],
            batch_size=1,
            cost_model=_Flat(),
            max_draft_tokens=CAP_TOKENS,
        )
        results[name] = {
            "tokens_per_step": res.tokens_per_step,
            "num_steps": res.num_steps,
            "num_output_tokens": res.num_output_tokens,
            "wall_s": time.perf_counter() - t0,
        }
    return results


def _files(root: Path, pattern: str) -> list[str]:
    return sorted(str(p) for p in root.glob(pattern))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", help="the dev-set folder (../shared/data/traces)")
    parser.add_argument("-o", "--out", default=None, help="write crosscheck.json here")
    parser.add_argument("--sources", nargs="+", default=list(EXPECTED))
    parser.add_argument("--drafters", nargs="+", default=None)
    args = parser.parse_args(argv)
    root = Path(args.traces)
    if not root.is_dir():
        raise SystemExit(f"crosscheck: no such folder: {root}")
    from agspec.tokenizers import get_tokenizer

    enc = PieceEncoder(get_tokenizer("qwen2.5").encode)
    loaders = {
        "swe-agent": lambda: swe_agent_sessions(_files(root, "swe-agent-java/*/*.traj"), enc),
        "chatdev": lambda: chatdev_sessions(_files(root, "chatdev/*.log"), enc),
        "mini-swe-agent": lambda: mini_swe_agent_sessions(
            _files(root, "mini-swe-agent/*/*.traj.json")[:40], enc
        ),
    }
    report: dict[str, Any] = {}
    for source in args.sources:
        sessions = loaders[source]()
        n_calls = sum(len(s.calls) for s in sessions)
        n_out = sum(s.num_output_tokens for s in sessions)
        print(
            f"{source}: {len(sessions)} sessions, {n_calls} calls, {n_out:,} output tokens",
            file=sys.stderr,
        )
        results = crosscheck_source(sessions, drafters=args.drafters)
        report[source] = {
            "num_sessions": len(sessions),
            "num_calls": n_calls,
            "num_output_tokens": n_out,
            "results": results,
        }
        for name, r in results.items():
            want = EXPECTED[source].get(name)
            diff = f"{100 * (r['tokens_per_step'] / want - 1):+.1f}%" if want else ""
            print(
                f"{source:15s} {name:16s} {r['tokens_per_step']:6.2f}  expected "
                f"{want if want else '-':>5}  {diff:>7}  ({r['wall_s']:.1f} s)",
                flush=True,
            )
    if args.out:
        from agspec._files import atomic_write_text

        atomic_write_text(os.path.join(args.out, "crosscheck.json"), json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
