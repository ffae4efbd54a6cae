"""One model call of an AgSpec session: `begin / propose / accept / end` (paper §3)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, get_args

import numpy as np

from agspec.corpora.corpus_set import (
    CorpusSet,
    continuation_tries,
    continuation_tries_flat,
    continuations_batch,
)
from agspec.drafter.tree import DraftTree
from agspec.index.engines import ENGINES
from agspec.index.token_index import ContinuationRule, as_tokens
from agspec.policy.source import Source
from agspec.policy.tree_size import (
    BranchTrie,
    FlatTries,
    flatten_tries,
    merge_candidates,
    node_probabilities,
    size_tree,
)

if TYPE_CHECKING:
    from agspec.drafter.session import AgSpecSession

# The occurrence rules a tree's candidate branches are copied by, in each corpus that
# matches: the most recent, the most frequent next-3-token group's and the first
# occurrence (the chain's own (corpus, rule) is the first branch).
TREE_RULES: tuple[ContinuationRule, ...] = ("recent", "frequent", "first")
# The 2nd .. 8th most recent occurrences: more candidates from every matching corpus
# whose index lists its occurrences (the native one; the suffix tree keeps counts, not
# occurrences), up to `tree_occurrences` most recent in all (docs/trees.md).
RANK_RULES: tuple[ContinuationRule, ...] = tuple(
    r for r in get_args(ContinuationRule) if r.startswith("recent") and r != "recent"
)


def tree_rules(occurrences: int, native: bool) -> tuple[ContinuationRule, ...]:
    """The rules a tree's candidates are copied by in every matching corpus: `TREE_RULES`
    and, where the corpora are native, the 2nd .. `occurrences`-th most recent occurrence.

    >>> tree_rules(3, True), tree_rules(3, False)
    (('recent', 'frequent', 'first', 'recent2', 'recent3'), ('recent', 'frequent', 'first'))
    """
    return TREE_RULES + RANK_RULES[: occurrences - 1] if native else TREE_RULES


def candidate_tries(
    sets: Sequence[CorpusSet],
    slots: list[int],
    max_tokens: list[int],
    rules: list[ContinuationRule],
    ranks: list[int],
    counts: list[int],
    firsts: list[list[int]],
    *,
    max_occurrences: int,
) -> list[BranchTrie]:
    """The candidate branches of token trees, copied and merged: tree t's candidates are
    the next counts[t] (slot, length, rule) entries, copied from sets[t] (one set per
    tree) and merged after its chain firsts[t] in the order of their ranks
    (`merge_candidates`). One native call for every tree when the corpora are native
    (`continuation_tries`), else `merge_candidates` of each tree's copies."""
    if all(cs.is_native for cs in sets):
        return continuation_tries(
            sets, slots, max_tokens, rules, ranks, counts, firsts, max_occurrences=max_occurrences
        )
    flat = [cs for cs, n in zip(sets, counts) for _ in range(n)]
    conts = continuations_batch(flat, slots, max_tokens, rules, max_occurrences=max_occurrences)
    out = []
    at = 0
    for n, first in zip(counts, firsts):
        out.append(merge_candidates(first, conts[at : at + n], ranks[at : at + n]))
        at += n
    return out


def candidate_tries_flat(
    sets: Sequence[CorpusSet],
    slots: list[int],
    max_tokens: list[int],
    rules: list[ContinuationRule],
    ranks: list[int],
    counts: list[int],
    firsts: list[list[int]],
    *,
    max_occurrences: int,
) -> FlatTries:
    """`candidate_tries` for the whole batch in seven lists (`FlatTries`): one native call
    when the corpora are native (`continuation_tries_flat`)."""
    if all(cs.is_native for cs in sets):
        return continuation_tries_flat(
            sets, slots, max_tokens, rules, ranks, counts, firsts, max_occurrences=max_occurrences
        )
    return flatten_tries(
        candidate_tries(
            sets, slots, max_tokens, rules, ranks, counts, firsts, max_occurrences=max_occurrences
        )
    )


class TreeCandidates(NamedTuple):
    """The candidate branches of a batch step's trees, flat, tree after tree: tree t's are
    entries starts[t] .. starts[t + 1] - 1 of the first four lists, each (corpus slot,
    rule, rank: minus its corpus's match, tokens to copy); depths[t] how deep they go."""

    slots: list[int]
    rules: list[ContinuationRule]
    ranks: list[int]
    max_tokens: list[int]
    starts: list[int]
    depths: list[int]


def tree_depth(budget: int, branch_tokens: int) -> int:
    """How deep a tree's candidate branches are copied for a node budget: half the budget
    (at least 1), at most `branch_tokens` (with a small budget the deep nodes of
    alternatives would never be kept, only merged and scored).

    >>> tree_depth(64, 16), tree_depth(6, 16), tree_depth(1, 16)
    (16, 3, 1)
    """
    depth = budget // 2
    if depth < 1:
        depth = 1
    return branch_tokens if branch_tokens < depth else depth


def tree_candidates(
    calls: Sequence[AgSpecCall], lengths: list[int], budgets: list[int]
) -> TreeCandidates:
    """The candidate branches to retrieve for each call's tree, given its corpora's match
    lengths (`lengths`: every call's in turn, as `match_lengths_flat` returns them) and
    its node budget: every (corpus, rule of `tree_rules`) whose match is long enough but
    the chain's own, ranked by its corpus's match, longest first, each copied
    `tree_depth` tokens deep."""
    out = TreeCandidates([], [], [], [], [0], [])
    slots, rules, ranks, max_tokens, starts, depths = out
    at = 0
    for call, budget in zip(calls, budgets):
        source = call.last_source
        assert source is not None  # propose() drafted the chain from it
        rules_of = call._tree_rules.get(source)
        if rules_of is None:
            rules_of = call._tree_rules[source] = call._candidate_rules(source)
        server = call.session.server
        min_match = server.min_match_tokens
        if min_match < 1:
            min_match = 1
        depth = tree_depth(budget, server.config.tree_branch_tokens)
        depths.append(depth)
        for s, rs in enumerate(rules_of):
            m = lengths[at + s]
            if m >= min_match:
                k = len(rs)
                slots += [s] * k
                rules += rs
                ranks += [-m] * k
                max_tokens += [depth] * k
        at += len(rules_of)
        starts.append(len(slots))
    return out


class AgSpecCall:
    """One model call: `begin / propose / accept / end`.

    The call's corpora (session, workspace, history, global, or its own text only) sit
    behind one `CorpusSet`: a step feeds them the committed tokens in one native call
    and reads their match lengths in another. After `propose`, `last_source` and
    `last_match_length` say where the draft came from.

    `propose_tree` drafts a token tree (an engine that verifies trees: the replay lab,
    the transformers adapter); `propose` stays the chain, for engines that take chains.
    """

    def __init__(self, session: AgSpecSession, agent: str, role: str, turn: int, doc_id: int):
        self.session = session
        self.agent, self.role, self.turn = agent, role, turn
        self._doc_id = doc_id
        self._corpora: CorpusSet | None = None
        self._cap = 0
        self._max_occurrences = 32
        # Per source of a chain: the rules each corpus's tree candidates are copied by.
        self._tree_rules: dict[Source, list[tuple[ContinuationRule, ...]]] = {}
        self._primaries: dict[Source, tuple[int, ContinuationRule]] = {}
        self._request: Any = None
        self._draft: list[int] = []
        # The last draft's (length, censored by the cap, match length), for the policy.
        self._decision: tuple[int, bool, int] | None = None
        # The last tree draft (propose_tree) and its nodes' support, until its accept.
        self._tree: tuple[DraftTree, list[int]] | None = None
        self._begun = False
        self._ended = False
        self._live = False  # begun and not ended (one attribute for the batched step)
        self._released = False  # the session was ended or evicted
        self._index_output = False  # accept() appends to the session corpus
        self.last_source: Source | None = None
        self.last_match_length = 0

    def _release(self) -> None:
        """The session ended or was evicted: drop every reference to its corpora."""
        self._released = self._ended = True
        self._live = False
        if self._corpora is not None:
            self._corpora.close()
        self._corpora = None
        self._request = None
        self._draft = []
        self._decision = None
        self._tree = None
        self._index_output = False

    def _stop_indexing(self) -> None:
        """The session stopped indexing (over the live token budget on its own)."""
        if self._index_output and self._corpora is not None:
            self._corpora.stop_appending(self.session.session_corpus.index)
        self._index_output = False

    def _not_live(self, what: str) -> Exception:
        if self._released:
            return KeyError(f"{what}: session {self.session.session_id!r} was ended or evicted")
        return RuntimeError(f"{what} needs begin() first and no end()")

    def begin(self, prompt_ids: Sequence[int] | np.ndarray, *, known_tokens: int = 0) -> None:
        """Starts the call with its prompt.

        `known_tokens`: how many leading prompt tokens the session has already seen (an
        earlier request's prompt, or its prompt and answer), when the caller knows (the
        session resolver of `agspec.drafter.session_inference` does): the session corpus
        then indexes only what follows, without looking at the known text at all
        (`SessionCorpus.add_prompt`). Without it, a prompt that extends the session's
        previous one costs one list comparison, not a re-split.
        """
        if self._begun:
            raise RuntimeError("begin() was already called for this call")
        self.session._check_open()
        server = self.session.server
        cfg = server.config
        # Lists go to the corpora as they are (the native side checks the ids it indexes);
        # only the tail can be part of a match, so only the tail feeds the cursors.
        prompt = (
            prompt_ids
            if isinstance(prompt_ids, list)
            else as_tokens(prompt_ids, what="prompt_ids").tolist()
        )
        # Checked where it is used (the corpora, the cursors), with as_tokens's message.
        tail = prompt[-cfg.max_match_tokens :]
        if (
            isinstance(known_tokens, bool)
            or not isinstance(known_tokens, int)
            or not 0 <= known_tokens <= len(prompt)
        ):
            raise ValueError(
                f"known_tokens must be an int in [0, {len(prompt)}] (the prompt's length), "
                f"got {known_tokens!r}"
            )
        sess = self.session
        entries: list[tuple[str, Any, ContinuationRule]] = []
        appends: list[tuple[Any, int]] = []
        if cfg.use_session:
            if not sess.frozen:
                before = sess.session_corpus.num_tokens
                sess.session_corpus.add_prompt(
                    self._doc_id,
                    prompt,
                    # Nothing is known to a session corpus that holds nothing (evicted and
                    # started afresh under the same id).
                    known_tokens=known_tokens if sess.session_corpus.num_tokens else 0,
                )
                server._grew(sess, sess.session_corpus.num_tokens - before)
            entries.append(("session", sess.session_corpus.index, cfg.session_rule))
            self._index_output = not sess.frozen
            if self._index_output:
                appends.append((sess.session_corpus.index, self._doc_id))
        if cfg.use_workspace:
            entries.append(("workspace", sess.workspace.index, cfg.workspace_rule))
        server.fit_memory_budget(sess)
        history = server.open_history()
        if history is not None:
            entries.append(("history", history[0], cfg.history_rule))
            appends.append(history)
        if server.global_corpus is not None:
            entries.append(("global", server.global_corpus.index, cfg.global_rule))
        if cfg.use_request:
            self._request = ENGINES.get(cfg.engine)()
            self._request.extend_list(0, prompt)
            entries.append(("request", self._request, cfg.session_rule))
            appends.append((self._request, 0))
        self._corpora = CorpusSet(
            entries,
            tail,
            max_match_tokens=cfg.max_match_tokens,
            appends=appends,
            order=server.source_order,
        )
        lengths = server.lengths
        # The cap of this agent cannot change during a call: look it up once.
        self._cap = lengths.caps.cap_for(
            self.agent, model=lengths.model, batch_size=lengths.batch_size
        )
        self._max_occurrences = cfg.max_occurrences
        self._begun = self._live = True

    def propose(self, max_tokens: int) -> list[int]:
        if not self._begun or self._ended:
            raise self._not_live("propose()")
        if type(max_tokens) is not int:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)):
                raise TypeError(
                    f"max_tokens must be an int in [0, 65536], got {type(max_tokens).__name__}"
                )
            max_tokens = int(max_tokens)
        if max_tokens < 0 or max_tokens > 1 << 16:
            raise ValueError(f"max_tokens must be in [0, 65536], got {max_tokens}")
        self._draft = []
        self._decision = None
        self._tree = None
        self.last_source, self.last_match_length = None, 0
        if max_tokens == 0:
            return []
        corpora = self._corpora
        assert corpora is not None
        slot, m = corpora.match_pick(self.session.server.min_match_tokens)
        if slot < 0:
            return []
        want = self._length(slot, m, max_tokens)
        if want == 0:
            return []
        draft = corpora.continuation(slot, want, max_occurrences=self._max_occurrences)
        return self._take(draft, slot, want, m)

    def propose_tree(self, max_nodes: int) -> DraftTree:
        """A token tree of at most `max_nodes` nodes (`agspec.drafter.tree`), its first
        branch the chain `propose` drafts. The other branches are continuations of other
        occurrences (rules `tree_rules`) in every corpus whose match is long enough,
        merged in one trie and scored by `agspec.policy.tree_size`; the cost rule keeps
        the nodes that pay at the live batch size. A budget (`max_nodes`, or the config's
        `tree_max_nodes`) of 0 or 1 drafts the chain, as does a profile where wider trees
        do not pay. `accept` then takes the tokens of one root path plus the bonus.

        Example: the session holds `... 5 6 7 8 9` and `... 5 6 7 4 2`; after `5 6` the
        chain is `[7, 4, 2]` (the recent occurrence) and the first occurrence adds the
        branch `7 -> 8 -> 9`: tokens `[7, 4, 2, 8, 9]`, parents `[-1, 0, 1, 0, 3]`.
        """
        chain = self.propose(max_nodes)
        budget = min(max_nodes, self.session.server.tree_max_nodes)
        chain_curve = self.tree_curve(chain, budget)
        if chain_curve is None:
            return DraftTree.chain(chain)
        corpora = self._corpora
        assert corpora is not None
        lengths = corpora.match_lengths()
        slots, rules, ranks, max_tokens, _, (depth,) = tree_candidates([self], lengths, [budget])
        if not slots:
            return DraftTree.chain(chain)
        (trie,) = candidate_tries(
            [corpora],
            slots,
            max_tokens,
            rules,
            ranks,
            [len(slots)],
            [chain],
            max_occurrences=self._max_occurrences,
        )
        return self.take_tree(chain, chain_curve, budget, lengths, slots, trie, depth)

    # --- propose_tree in its parts (step_batch(trees=True) runs each for a whole batch) ---

    def tree_curve(self, chain: list[int], budget: int) -> list[float] | None:
        """The chain's acceptance curve when a tree of `budget` nodes may beat the chain
        just drafted (`chain`, recorded by `propose`); None when the chain stands."""
        if budget <= 1 or not chain:
            return None
        assert self.last_source is not None
        curve = self.session.server.lengths.survival.curve(
            self.agent, self.last_match_length, len(chain)
        )[: len(chain)]
        return curve if self._tree_may_pay(curve, budget) else None

    def _tree_primary(self, source: Source) -> tuple[int, ContinuationRule]:
        """The (corpus slot, rule) a chain from `source` is copied by: the one pair its
        tree's candidates leave out (`_candidate_rules`)."""
        got = self._primaries.get(source)
        if got is None:
            corpora = self._corpora
            assert corpora is not None
            slot = corpora.names.index(source)
            got = self._primaries[source] = (slot, corpora.rule(slot))
        return got

    def _candidate_rules(self, source: Source) -> list[tuple[ContinuationRule, ...]]:
        """Per corpus slot, the rules of `tree_rules` its candidates are copied by when
        the chain came from `source` (all of them but the chain's own (corpus, rule))."""
        corpora = self._corpora
        assert corpora is not None
        primary = corpora.names.index(source)
        primary_rule = corpora.rule(primary)
        rules = tree_rules(self.session.server.config.tree_occurrences, corpora.is_native)
        return [
            tuple(r for r in rules if not (s == primary and r == primary_rule))
            for s in range(len(corpora.names))
        ]

    def take_tree(
        self,
        chain: list[int],
        chain_curve: list[float],
        budget: int,
        lengths: list[int],
        slots: list[int],
        trie: BranchTrie,
        depth: int,
    ) -> DraftTree:
        """The tree of this step from the chain and the trie of its candidates (copied
        from `slots`, ranked by their corpus's match, longest first: `candidate_tries`):
        scored and sized (`agspec.policy.tree_size`), recorded for the next `accept`."""
        tokens, parents, support, curve_of, origin = trie
        if len(origin) == 1:  # no candidate adds a node
            return DraftTree.chain(chain)
        server = self.session.server
        agent = self.agent
        survival = server.lengths.survival
        curves = [chain_curve]
        # Each branch follows its corpus's curve (read once per corpus: scoring only reads).
        by_slot: dict[int, list[float]] = {}
        for k in origin[1:]:
            s = slots[k]
            curve = by_slot.get(s)
            if curve is None:
                curve = by_slot[s] = survival.curve(agent, lengths[s], depth)[:depth]
            curves.append(curve)
        p = node_probabilities(
            parents, support, curve_of, curves, server.branch_rates.rates_for(agent)
        )
        if server.batch_cost_mode:
            # A node costs what a draft token costs in the batch (the chain rule's prices,
            # at the tree's step costs).
            prices = server.lengths.cost.batch_prices(
                min(budget, len(tokens)), server.tree_step_costs
            )
            keep = size_tree(p, None, budget, prices=prices)
        else:
            keep = size_tree(p, server.tree_step_costs, budget)
        return self.keep_tree(chain, keep, tokens, parents, support)

    def keep_tree(
        self,
        chain: list[int],
        keep: list[int],
        tokens: list[int],
        parents: list[int],
        support: list[int],
    ) -> DraftTree:
        """The tree of the nodes `keep` (in node order, every parent kept) of the trie
        (tokens, parents, support) after `chain`, recorded for the next `accept`
        (`take_tree`'s end)."""
        # The chain's nodes are 0 .. len(chain) - 1 and p falls along it: what is kept of
        # it is a prefix (the first branch; what the acceptance curves learn from).
        num_chain = bisect_left(keep, len(chain))  # keep is in node order
        if len(keep) == num_chain:
            return self.adopt_tree(chain, num_chain, chain[:num_chain], [], [])
        # Every kept node's parent is kept, earlier: its new index is its rank in `keep`.
        new_index = dict(zip(keep, range(len(keep))))
        new_index[-1] = -1  # the root stays the root
        return self.adopt_tree(
            chain,
            num_chain,
            [tokens[i] for i in keep],
            [new_index[parents[i]] for i in keep],
            [support[i] for i in keep],
        )

    def adopt_tree(
        self,
        chain: list[int],
        num_chain: int,
        tokens: list[int],
        parents: list[int],
        support: list[int],
    ) -> DraftTree:
        """The tree of these lists themselves (what `keep_tree` keeps of a trie, or what
        the batched tree step's native sizing keeps, `size_flat_tries_at_prices`), whose
        first `num_chain` nodes are chain[:num_chain], recorded for the next `accept`.
        When they are all it has, the chain's prefix is drafted (parents and support are
        not read)."""
        draft = chain[:num_chain]
        self._draft = draft
        self._decision = (num_chain, False, self.last_match_length) if num_chain else None
        if len(tokens) == num_chain:
            return DraftTree.chain(draft)
        tree = DraftTree.adopt(tokens, parents)
        self._tree = (tree, support)
        return tree

    def _tree_may_pay(self, curve: list[float], budget: int) -> bool:
        """False when no alternative could enter the tree: the likeliest one (at most the
        largest drop of the chain's curve, or its last value below the chain's end, times
        the agent's best rate) is no likelier than the chain's last node and below the
        price of one more node (at batch size 1: at the chain's own rate of tokens per
        unit cost). With step costs that rise no slower with more tokens, such a tree is
        the chain: this spares the candidates' retrieval and scoring where trees do not
        pay (a CPU profile, a large batch)."""
        server = self.session.server
        n = len(curve)
        top = curve[-1]
        drop = 1.0 - curve[0]
        for i in range(1, n):
            d = curve[i - 1] - curve[i]
            if d > drop:
                drop = d
        rate = server.branch_rates.table_for(self.agent)  # kept until the next observe
        q = max(rate[1:])  # supports 1 .. MAX_SUPPORT_BUCKET
        bound = q * (drop if drop > top else top)
        if bound > top:
            return True  # an alternative may outrank a node of the chain
        if n >= budget:
            return False
        if server.batch_cost_mode:
            policy = server.lengths
            if n + 1 < len(policy.step_costs):
                prices = policy.cost.batch_prices(n + 1)
                return bound > prices[n + 1] - prices[n]
            return True
        costs = server.tree_step_costs
        value = (1.0 + sum(curve)) / costs[n]
        return bound > value * (costs[n + 1] - costs[n])

    def _tree_path(self, committed: list[int], feed: bool) -> int:
        """Checks that `committed` is a root path of the last tree plus at most one token
        (ValueError otherwise); with `feed`, the alternatives' rates learn from it (each
        node on the path whose first child was wrong: its alternatives, by rank, until the
        right one). Returns how many committed tokens the first branch (the chain) had."""
        assert self._tree is not None
        tree, support = self._tree
        tokens, parents = tree.token_ids, tree.parents
        m = len(parents)
        seen: list[tuple[int, bool]] = []
        node = -1
        n = len(committed)
        for d in range(n):
            want = committed[d]
            nxt = node + 1
            if nxt < m and parents[nxt] == node and tokens[nxt] == want:
                # The node's first child (nodes are in topological order: a child of
                # `node` at node + 1 is its first) is right: no alternative was tried.
                node = nxt
                continue
            # The node's children, in node order (every child comes after its parent).
            group: list[int] = []
            for _ in range(parents.count(node)):
                nxt = parents.index(node, nxt)
                group.append(nxt)
                nxt += 1
            # The first right child; where the first child was wrong, the alternatives
            # tried, in rank order (the order their branches came), until the right one.
            nxt = -1
            if group:
                if tokens[group[0]] == want:
                    nxt = group[0]
                else:
                    for i in group[1:]:
                        right = tokens[i] == want
                        seen.append((support[i], right))
                        if right:
                            nxt = i
                            break
            if nxt < 0:
                if d < n - 1:
                    raise ValueError(
                        f"committed_ids {committed[:8]} do not follow a root path of the "
                        f"draft tree plus one token (token {d} = {want} is no child of the "
                        f"path): these tokens were never proposed"
                    )
                break
            node = nxt
        if feed:
            rates = self.session.server.branch_rates
            for sup, right in seen:
                rates.observe(self.agent, sup, right)
        draft = self._draft
        limit = min(n - 1, len(draft))
        a = 0
        while a < limit and committed[a] == draft[a]:
            a += 1
        return a

    def _plan(self, lengths: list[int], max_tokens: int) -> tuple[int, int, int]:
        """Source slot, draft length and match length for these match lengths (policy)."""
        corpora = self._corpora
        assert corpora is not None
        slot, m = corpora.pick_at_least(lengths, self.session.server.min_match_tokens)
        if slot < 0:
            return -1, 0, 0
        return slot, self._length(slot, m, max_tokens), m

    def _length(self, slot: int, m: int, max_tokens: int) -> int:
        """The draft length from the match of the picked slot (m >= min_match_tokens)."""
        corpora = self._corpora
        assert corpora is not None
        server = self.session.server
        # An engine with its own length rule (SuffixDecoding's) bounds the draft too.
        policy = server.lengths
        want = policy.length_tokens(
            self.agent, m, max_tokens, corpora.engine_max_tokens(slot), self._cap
        )
        if server.cost_mode and want:
            # The best length over [0, want] bounds the one over [0, retrieved]; when it is
            # 0 (most short matches on a CPU), skip the continuation altogether.
            want = policy.cost_length(self.agent, m, want)
        return want

    def _take(self, draft: list[int], slot: int, want: int, m: int) -> list[int]:
        """Records the draft of this step (after the continuation was copied)."""
        server = self.session.server
        if server.cost_mode and len(draft) < want:
            draft = draft[: server.lengths.cost_length(self.agent, m, len(draft))]
        if not draft:
            return []
        cap = self._cap
        # Censored only when the cap itself bounded the draft (not max_tokens, not text).
        capped = server.capped_mode and len(draft) == want == cap
        self._draft = draft
        # What the policy learns from at the next accept: (draft length, censored, match).
        self._decision = (len(draft), capped, m)
        assert self._corpora is not None
        self.last_source = self._corpora.names[slot]  # type: ignore[assignment]
        self.last_match_length = m
        return list(draft)

    def _check_committed(
        self, committed_ids: Sequence[int] | np.ndarray, *, feed: bool = True
    ) -> list[int]:
        """The committed tokens as a list, checked against the draft; feeds the policy and
        clears the draft (with `feed=False` nothing changes: `step_batch` feeds a whole
        step's calls at once)."""
        committed, accepted = self._checked_tokens(committed_ids, feed)
        if not feed:
            self._tree = None
            return committed
        server = self.session.server
        decision = self._decision
        tree = self._tree
        if decision is not None:
            server.lengths.observe_tokens(
                self.agent, decision[0], decision[1], decision[2], accepted
            )
        if server.batch_cost_mode:
            # A tree is priced by its nodes: each is a token of the verification batch.
            drafted = len(self._draft) if tree is None else len(tree[0])
            server.lengths.note_step(drafted, len(committed))
        self._draft, self._decision, self._tree = [], None, None
        return committed

    def _checked_tokens(
        self, committed_ids: Sequence[int] | np.ndarray, feed_rates: bool
    ) -> tuple[list[int], int]:
        """The committed tokens as a list, checked against the draft (a chain, or a tree
        whose alternatives' rates learn from them with `feed_rates`), and the accept
        length the acceptance curves learn from: the first n - 1 committed tokens are the
        draft's (agspec.drafter.protocol.accept_length); of a tree, the chain's own (its
        first branch: what the curves describe). Changes nothing else."""
        if not self._begun or self._ended:
            raise self._not_live("accept()")
        committed = (
            committed_ids
            if type(committed_ids) is list
            else committed_ids
            if isinstance(committed_ids, list)
            else as_tokens(committed_ids, what="committed_ids").tolist()
        )
        n = len(committed)
        draft = self._draft
        if n == 0:
            raise ValueError("committed_ids is empty: a step commits at least one token")
        tree = self._tree
        if tree is not None:
            # A tree draft: the committed tokens follow one root path (checked); the chain
            # (first branch) had `chain_accept` of them.
            ints = type(committed) is list  # a list of ints passes as it is
            for tok in committed:
                if type(tok) is not int:
                    if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)):
                        raise TypeError(f"committed_ids must be int token ids, got {tok!r}")
                    ints = False
            if not ints:
                committed = [int(t) for t in committed]
            chain_accept = self._tree_path(committed, feed_rates)
        elif n > 1 and (n > len(draft) + 1 or committed[: n - 1] != draft[: n - 1]):
            raise ValueError(
                f"committed_ids {committed[:8]} are not a prefix of the draft "
                f"{draft[:8]} plus one token: these tokens were never proposed"
            )
        last = committed[-1]  # the only token not checked against the draft
        if type(last) is not int:
            if isinstance(last, bool) or not isinstance(last, (int, np.integer)):
                raise TypeError(
                    f"committed_ids[-1] must be an int token id, got {type(last).__name__}"
                )
            committed = [*committed[:-1], int(last)]
            last = committed[-1]
        if not 0 <= last < 2**31:
            raise ValueError(f"committed_ids[-1] = {last} is outside [0, 2^31)")
        return committed, n - 1 if tree is None else chain_accept

    def _count(self, n: int) -> None:
        """Bookkeeping after the corpora took `n` committed tokens."""
        if self._index_output:
            sess = self.session
            sess._counted += n
            server = sess.server
            server._live_tokens += n
            if server._live_tokens > server.live_token_budget:
                server._over_budget(sess)

    # --- the batched step's interface (agspec.drafter.batch.step_batch) ------------------
    # step_batch moves many calls' corpora in one native call per phase and asks the
    # policy once per step; these are the parts of a call it reads and sets.

    @property
    def live(self) -> bool:
        """Begun and not ended (nor released with its session)."""
        return self._live

    @property
    def draft(self) -> list[int]:
        """The draft the next `accept` checks against (a copy; empty when none)."""
        return list(self._draft)

    @property
    def corpora(self) -> CorpusSet | None:
        """The call's corpora behind one `CorpusSet` (None before `begin` and after `end`)."""
        return self._corpora

    @property
    def cap_tokens(self) -> int:
        """This agent's draft cap C_a, looked up once at `begin`."""
        return self._cap

    @property
    def max_occurrences(self) -> int:
        """How many occurrences a continuation rule reads."""
        return self._max_occurrences

    @property
    def indexes_output(self) -> bool:
        """Whether committed tokens go into the session corpus (and count toward the live
        token budget)."""
        return self._index_output

    def not_live_error(self, what: str) -> Exception:
        """The error of a step on a call that was not begun, was ended, or was evicted."""
        return self._not_live(what)

    def take_committed(
        self, committed_ids: Sequence[int] | np.ndarray
    ) -> tuple[list[int], int, tuple[int, bool, int] | None, int]:
        """The accept half of a batched step for this call, without feeding the policy or
        the corpora (step_batch does both for the whole step; a tree's alternatives' rates
        are fed here): the committed tokens, checked against the draft as `accept` checks
        them, the number of tokens the last draft put in the verification (a tree's
        nodes), its decision (draft length, censored by the cap, match length; None when
        the call did not draft) and the accept length the policy learns. Clears the draft."""
        draft = self._draft
        size = len(committed_ids)
        tree = self._tree
        # What _checked_tokens passes unchanged (a list of ints: the draft's prefix and
        # one id); anything else goes through it, which converts or refuses it.
        if (
            tree is None
            and type(committed_ids) is list
            and self._live
            and size <= len(draft) + 1
            and committed_ids[:-1] == draft[: size - 1]
            and type(committed_ids[-1]) is int
            and 0 <= committed_ids[-1] < 2**31
        ):
            toks, accepted = committed_ids, size - 1
        else:
            toks, accepted = self._checked_tokens(committed_ids, True)
        decision = self._decision
        self._draft, self._decision, self._tree = [], None, None
        return toks, len(draft) if tree is None else len(tree[0]), decision, accepted

    def accept_fed(self, committed_ids: Sequence[int] | np.ndarray) -> list[int]:
        """`accept`'s checks and its policy feedback, without feeding the corpora: the
        checked tokens (step_batch moves the corpora of many calls at once)."""
        return self._check_committed(committed_ids)

    def skip_step(self) -> None:
        """A step that committed nothing for this call (right after `begin`)."""
        if not self._live:
            raise self._not_live("step_batch()")
        self._draft, self._decision, self._tree = [], None, None

    def count_committed(self, num_tokens: int) -> None:
        """The live-token bookkeeping once the corpora took `num_tokens` committed tokens."""
        if self._index_output:
            self._count(num_tokens)

    def plan(self, lengths: list[int], max_tokens: int) -> tuple[int, int, int]:
        """Source slot, draft length and match length for the corpora's match lengths
        `lengths` (slot -1: no draft), as `propose` plans them."""
        return self._plan(lengths, max_tokens)

    def take_draft(self, draft: list[int], slot: int, want: int, match_length: int) -> list[int]:
        """Records `draft`, copied from slot `slot` for a plan of `want` tokens, as this
        step's draft (trimmed as `propose` trims it); returns it."""
        return self._take(draft, slot, want, match_length)

    def set_draft(self, draft: list[int], slot: int, match_length: int, capped: bool) -> None:
        """Records a draft the batched policy already sized: what the next accept checks
        against and the policy learns from (censored by the cap when `capped`)."""
        self._draft = draft
        self._decision = (len(draft), capped, match_length)
        assert self._corpora is not None
        self.last_source = self._corpora.names[slot]  # type: ignore[assignment]
        self.last_match_length = match_length

    def accept(self, committed_ids: Sequence[int] | np.ndarray) -> None:
        committed = self._check_committed(committed_ids)
        assert self._corpora is not None
        self._corpora.advance(committed)
        if self._index_output:
            self._count(len(committed))

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._live = False
        if self._corpora is not None:
            self._corpora.close()
        self._corpora = None
        self._request = None
        if not self.session.closed:
            self.session.server.touch(self.session.session_id)
