"""The AgSpec drafter on hand-computed sessions."""

from __future__ import annotations

import pytest
from chartok import CharTokenizer, toks

from agspec.corpora import GlobalCorpus
from agspec.drafter import VARIANTS, AgSpecConfig, AgSpecServer, choose_source
from agspec.policy.caps import ProfiledCap


@pytest.mark.parametrize(
    "m_s, m_w, m_g, margin, expected",
    [
        (0, 0, 0, 4, None),
        (3, 0, 0, 4, "session"),
        (3, 3, 0, 4, "session"),  # ties go to the session
        (3, 4, 0, 4, "workspace"),
        (3, 4, 8, 4, "workspace"),  # global must beat 4 by more than 4
        (3, 4, 9, 4, "global"),
        (0, 0, 1, 0, "global"),
        (5, 2, 5, 0, "session"),
    ],
)
def test_source_preference_at_each_margin(m_s, m_w, m_g, margin, expected):
    assert choose_source(m_s, m_w, m_g, margin) == expected


def test_length_rule_uses_profiled_caps_and_scales(tmp_path):
    caps = ProfiledCap(default_cap_tokens=3)
    caps.set("coder", model="", batch_size=1, cap_tokens=5)
    text = "0123456789abcdefghij"
    scales = tmp_path / "scales.json"
    server = AgSpecServer(
        tokenizer=CharTokenizer(),
        config=AgSpecConfig(use_global=False, break_even_prob=0.3),
        caps=caps,
        scales_path=scales,
    )
    sess = server.session("s")
    sess.open_artifact("t.txt", text)
    for agent, cap in (("coder", 5), ("reviewer", 3)):
        call = sess.call(agent, "code", 1)
        call.begin(toks("\x00" + text[:8]))  # m = 8, alpha = 1: min(8, cap)
        draft = call.propose(32)
        assert draft == toks(text[8 : 8 + cap])
        call.accept(draft + [ord("!")])  # full accept at the cap: censored, no update
        call.end()
    assert server.lengths.scale is not None
    assert server.lengths.scale.scales == {}
    call = sess.call("coder", "code", 2)
    call.begin(toks("\x00z" + text[:2]))  # m = 2 < cap: a full accept updates alpha
    draft = call.propose(32)
    assert draft == toks(text[2:4])
    call.accept(draft + [ord("!")])
    assert server.lengths.scale.alpha("coder") == pytest.approx(1 + 0.05 * (1 - 0.3))
    sess.end()  # scales are written when a session ends, and load back
    again = AgSpecServer(tokenizer=CharTokenizer(), config=AgSpecConfig(), scales_path=scales)
    assert again.lengths.scale is not None
    assert again.lengths.scale.alpha("coder") == pytest.approx(1.035)


def test_corrupt_scales_file_is_reported_and_ignored(tmp_path):
    bad = tmp_path / "scales.json"
    bad.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="corrupt"):
        server = AgSpecServer(tokenizer=CharTokenizer(), scales_path=bad)
    assert server.lengths.scale is not None and server.lengths.scale.scales == {}


def run_call(call, prompt: str, output: str, k: int = 16):
    """Greedy replay of one call: returns the drafts proposed at each step."""
    call.begin(toks(prompt))
    out = toks(output)
    pos, steps = 0, []
    while pos < len(out):
        draft = call.propose(k)
        acc = 0
        while acc < len(draft) and pos + acc < len(out) and draft[acc] == out[pos + acc]:
            acc += 1
        commit = out[pos : pos + acc + 1]
        call.accept(commit)
        steps.append((call.last_source, draft, acc))
        pos += len(commit)
    call.end()
    return steps


def test_session_text_from_an_earlier_call_is_drafted():
    server = AgSpecServer(tokenizer=CharTokenizer(), config=AgSpecConfig(use_global=False))
    sess = server.session("s1")
    run_call(sess.call("coder", "code", 1), "\x00fix it", "def f(): return 1")
    steps = run_call(sess.call("coder", "code", 2), "\x00again", "def f(): return 2")
    # After "d" the session holds "def f(): return 1": everything but the last char copies.
    sources = [s for s, _, _ in steps]
    assert "session" in sources
    total_accepted = sum(a for _, _, a in steps)
    assert total_accepted >= len("ef(): return ") - 1


def test_workspace_draws_from_the_unified_diff_form():
    server = AgSpecServer(tokenizer=CharTokenizer(), config=AgSpecConfig(use_global=False))
    sess = server.session("s1", emission_format="unified_diff")
    sess.open_artifact("a.py", "alpha = 1\nbeta = 2\n")
    call = sess.call("coder", "code", 1)
    call.begin(toks("\x00patch:\n-alpha"))
    draft = call.propose(8)
    assert call.last_source == "workspace"
    # m = len("-alpha") = 6, so L = 6, copied from the "-" form, prefixes included.
    assert call.last_match_length == 6
    assert draft == toks(" = 1\n-")
    # Without emission forms the context "-alpha" matches only "alpha": shorter match.
    plain = AgSpecServer(
        tokenizer=CharTokenizer(),
        config=AgSpecConfig(use_global=False, use_emission_forms=False),
    ).session("s2", emission_format="unified_diff")
    plain.open_artifact("a.py", "alpha = 1\nbeta = 2\n")
    c2 = plain.call("coder", "code", 1)
    c2.begin(toks("\x00patch:\n-alpha"))
    c2.propose(8)
    assert c2.last_match_length == len("alpha") < call.last_match_length


def test_global_needs_the_margin():
    g = GlobalCorpus.build([toks("the quick brown fox jumps")])
    server = AgSpecServer(
        tokenizer=CharTokenizer(),
        global_corpus=g,
        config=AgSpecConfig(global_margin_tokens=3),
    )
    sess = server.session("s")
    sess.open_artifact("n.txt", "brown cat")
    call = sess.call("a", "other", 0)
    call.begin(toks("\x00quick brown"))
    # m_w = len(" brown") = 6, m_g = len("quick brown") = 11 > 6 + 3: global.
    assert call.propose(4) == toks(" fox")
    assert call.last_source == "global"
    call2 = sess.call("a", "other", 0)
    call2.begin(toks("\x00k brown"))
    # m_g = 7 is not > 6 + 3: workspace, first occurrence.
    assert call2.propose(4) == toks(" cat")
    assert call2.last_source == "workspace"


def test_bad_input_leaves_state_intact():
    server = AgSpecServer(tokenizer=CharTokenizer(), config=AgSpecConfig(use_global=False))
    sess = server.session("s")
    with pytest.raises(TypeError):
        sess.open_artifact("bin", b"\x00\x01")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        sess.open_artifact("bin", "a\x00b")
    call = sess.call("a")
    call.begin(toks("\x00abcabc"))
    draft = call.propose(3)
    assert draft == toks("abc")[: len(draft)] and draft
    with pytest.raises(ValueError, match="never proposed"):
        call.accept(toks("zzz"))
    with pytest.raises(ValueError):
        call.accept([])
    with pytest.raises(ValueError):
        call.propose(-1)
    call.accept(draft[:1] + [ord("q")])  # a valid step still works after the errors
    with pytest.raises(KeyError, match="unknown session"):
        server.get_session("nope")
    sess.end()
    with pytest.raises(KeyError):
        sess.call("a")


def test_sessions_are_evicted_by_ttl_and_budget():
    now = [0.0]
    server = AgSpecServer(
        tokenizer=CharTokenizer(),
        config=AgSpecConfig(use_global=False, session_ttl_s=10, live_token_budget=100),
        clock=lambda: now[0],
    )
    a = server.session("a")
    a.open_artifact("x", "y" * 60)
    now[0] = 5
    b = server.session("b")
    b.open_artifact("x", "z" * 60)
    server.session("c")  # over budget (120 > 100): the oldest, a, goes
    assert a.closed and not b.closed
    now[0] = 100
    server.session("d")  # b and c idle past the TTL
    assert b.closed
    with pytest.raises(KeyError):
        server.get_session("b")


def test_history_corpus_carries_outputs_across_sessions():
    cfg = AgSpecConfig(use_global=False, use_history=True)
    server = AgSpecServer(tokenizer=CharTokenizer(), config=cfg)
    first = server.session("a")
    run_call(first.call("coder", "code", 1), "\x00task A", "print('hello world')")
    first.end()
    second = server.session("b")  # a new session: its own corpora are empty
    call = second.call("coder", "code", 1)
    call.begin(toks("\x00task B: print('hel"))
    draft = call.propose(8)
    assert call.last_source == "history"
    assert draft == toks("lo world")[: len(draft)] and draft
    # Without the history corpus the new session has nothing to copy from.
    plain = AgSpecServer(tokenizer=CharTokenizer(), config=AgSpecConfig(use_global=False))
    c = plain.session("b").call("coder", "code", 1)
    c.begin(toks("\x00task B: print('hel"))
    assert c.propose(8) == [] or c.last_source == "session"


def test_history_is_fed_live_so_concurrent_calls_share_answers():
    """A call's committed tokens reach the history corpus as they are committed: a call of
    another session running at the same time drafts from them before the first call ends
    (SuffixDecoding's response tree does the same), and ending the call adds nothing twice."""
    cfg = AgSpecConfig(use_global=False, use_history=True)
    server = AgSpecServer(tokenizer=CharTokenizer(), config=cfg)
    writer = server.session("a").call("coder", "code", 1)
    writer.begin(toks("\x00task A"))
    for ch in "print('hello world')":
        writer.propose(8)
        writer.accept(toks(ch))  # one plain token per step (no draft accepted)
    reader = server.session("b").call("coder", "code", 1)  # while `writer` is still live
    reader.begin(toks("\x00task B: print('hel"))
    draft = reader.propose(8)
    assert reader.last_source == "history"
    assert draft and draft == toks("lo world')")[: len(draft)]
    before = server.history.num_tokens
    writer.end()
    assert server.history.num_tokens == before  # nothing appended at end()


def test_min_match_gate_drops_short_matches():
    cfg = AgSpecConfig(use_global=False, min_match_tokens=4)
    sess = AgSpecServer(tokenizer=CharTokenizer(), config=cfg).session("s")
    sess.open_artifact("a.txt", "abcdefgh")
    short = sess.call("a")
    short.begin(toks("\x00xyzabc"))  # m = 3 < 4: no draft
    assert short.propose(8) == []
    long = sess.call("a")
    long.begin(toks("\x00xyzabcd"))  # m = 4: drafts
    assert long.propose(8) == toks("efgh")
    with pytest.raises(ValueError, match="min_match_tokens"):
        AgSpecConfig(min_match_tokens=0)


def test_cost_mode_drafts_only_where_it_pays():
    """length_mode="cost" with a dear verification (2 tokens cost 3 decode steps): a
    3-token match is not worth drafting from, a long match is, and what is drafted is
    the copy the session holds."""

    class DearVerification:  # the CostModel protocol: 2 tokens cost 3 decode steps
        def step_cost(self, n_tokens: int, batch_size: int) -> float:
            return 1.0 if n_tokens == 1 else 3.0 + 0.1 * n_tokens

        def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
            return 10.0 * self.step_cost(n_tokens, batch_size)

    profile = DearVerification()
    cfg = AgSpecConfig(use_global=False, length_mode="cost", cost_max_draft_tokens=8)
    with pytest.raises(ValueError, match="cost model"):
        AgSpecServer(tokenizer=CharTokenizer(), config=cfg)
    server = AgSpecServer(tokenizer=CharTokenizer(), config=cfg, cost_model=profile)
    sess = server.session("s")
    sess.open_artifact("a.py", "def area(width, height): return width * height\n")
    short = sess.call("coder")
    short.begin(toks("\x00xyzdef"))  # m = 3: q = 2/3 per token, not worth 3 decode steps
    assert short.propose(8) == []
    long = sess.call("coder")
    long.begin(toks("\x00see def area(width, "))  # m = 17: drafts the copy
    assert long.propose(8) == toks("height):")
    long.accept(toks("height):"))  # wrong last token: 7 accepted + bonus
    assert server.lengths.survival.curve("coder", 17)[0] > 16 / 17  # learned from it


def test_cost_mode_curves_survive_a_restart(tmp_path):
    class Flat:
        def step_cost(self, n_tokens: int, batch_size: int) -> float:
            return 1.0 + 0.5 * (n_tokens - 1)

        def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
            return self.step_cost(n_tokens, batch_size)

    cfg = AgSpecConfig(use_global=False, length_mode="cost", cost_max_draft_tokens=8)
    path = tmp_path / "curves.json"
    server = AgSpecServer(
        tokenizer=CharTokenizer(), config=cfg, cost_model=Flat(), curves_path=path
    )
    sess = server.session("s")
    run_call(sess.call("coder"), "\x00one", "abcdefgh abcdefgh abcdefgh")
    server.end_session("s")
    assert path.exists()
    learned = server.lengths.survival.counts  # something was learned, not just the prior
    assert any(agent == "coder" for agent, _ in learned)
    again = AgSpecServer(tokenizer=CharTokenizer(), config=cfg, cost_model=Flat(), curves_path=path)
    for m in (1, 2, 5, 9):
        assert again.lengths.survival.curve("coder", m) == server.lengths.survival.curve("coder", m)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_copies_a_retry(variant):
    """Each named variant, on a session whose second call repeats the first answer (and
    shows it in its prompt, as agent transcripts do), drafts most of the repeat."""
    if VARIANTS[variant].engine == "suffix-tree":
        pytest.importorskip("arctic_inference", reason="arctic-inference is not installed")

    class Flat:  # verification nearly free, as on a GPU at batch 1
        def step_cost(self, n_tokens: int, batch_size: int) -> float:
            return 1.0 + 0.01 * (n_tokens - 1)

        def step_time_ms(self, n_tokens: int, batch_size: int) -> float:
            return self.step_cost(n_tokens, batch_size)

    answer = "def area(width, height):\n    return width * height\n"
    server = AgSpecServer(tokenizer=CharTokenizer(), config=VARIANTS[variant], cost_model=Flat())
    sess = server.session("s")
    run_call(sess.call("coder", "code", 1), "\x00write area", answer)
    steps = run_call(sess.call("coder", "code", 2), "\x00write area" + answer + "\x00again", answer)
    accepted = sum(a for _, _, a in steps)
    assert accepted >= len(answer) // 2, (variant, accepted, len(steps))
    assert len(steps) < len(answer) // 2


def test_end_session_saves_state_at_most_every_save_interval(tmp_path):
    """A server that ends many short sessions writes its state files on a timer (and when
    asked), not at every session end; with the default interval 0 it writes every time."""
    now = [0.0]
    scales = tmp_path / "scales.json"
    server = AgSpecServer(
        tokenizer=CharTokenizer(), scales_path=scales, save_interval_s=30.0, clock=lambda: now[0]
    )

    def run_session(sid: str) -> None:
        call = server.session(sid).call("coder")
        call.begin([ord(c) for c in "abcabcabc"])
        draft = call.propose(4)
        call.accept([*draft[:1], ord("x")] if draft else [ord("x")])
        call.end()
        server.end_session(sid)

    run_session("s1")  # the first end saves
    assert scales.is_file()
    first = scales.stat().st_mtime_ns
    scales.unlink()
    now[0] = 10.0
    run_session("s2")  # 10 s later: no write
    assert not scales.exists()
    now[0] = 31.0
    run_session("s3")  # past the interval: written again
    assert scales.is_file() and first > 0
    scales.unlink()
    server.save_scales()  # shutdown: always writes
    assert scales.is_file()
    every = AgSpecServer(tokenizer=CharTokenizer(), scales_path=tmp_path / "b.json")
    for sid in ("a", "b"):
        every.session(sid)
        (tmp_path / "b.json").unlink(missing_ok=True)
        every.end_session(sid)
        assert (tmp_path / "b.json").is_file()
    with pytest.raises(ValueError, match="save_interval_s"):
        AgSpecServer(tokenizer=CharTokenizer(), save_interval_s=-1.0)


def test_drafts_grow_to_cost_free_draft_tokens_only_where_verifying_them_is_free():
    # H200 roofline of a 32B model: 65 tokens cost one decode step at batch size 1 (the
    # default may look 64 tokens ahead), 2.4 decode steps at 8 (it keeps 32). A CPU
    # profile measured to 32 tokens, whose last segment falls (a tile end), grows past
    # them by its mean slope: 65 tokens cost more than 33, and neither is free: 32.
    from agspec.policy.costmodel import get_cost_model

    gpu = get_cost_model("h200-qwen2.5-32b")
    cpu = get_cost_model("epyc2t-llamacpp-qwen2.5-coder-0.5b-measured", context_tokens=1024)
    assert cpu.step_cost(31, 1) > cpu.step_cost(32, 1)  # the measured staircase
    assert 8.0 < cpu.step_cost(33, 1) < cpu.step_cost(48, 1) < cpu.step_cost(65, 1)

    def bound(variant, cost_model, batch_size):
        s = AgSpecServer.from_variant(variant, tokenizer=None, cost_model=cost_model)
        s.set_batch_size(batch_size)
        return s.lengths.cost_bound_tokens

    assert bound("agspec", gpu, 1) == 64
    assert bound("agspec", gpu, 8) == 32
    assert bound("agspec", gpu, 16) == 32
    assert bound("agspec", cpu, 1) == 32
    assert bound("agspec-paper+cost", gpu, 1) == 32  # the option is off there
    with pytest.raises(ValueError, match="cost_free_draft_tokens"):
        AgSpecConfig(length_mode="cost", cost_free_draft_tokens=16)
