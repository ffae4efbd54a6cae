"""Token trees: a draft that proposes several continuations at once, verified in one pass.

A `DraftTree` is token ids plus, for each node, the index of its parent (-1: a child of
the root, the last committed token), the layout SuffixDecoding's drafts use. Nodes come
in topological order (every parent before its children), so one left-to-right pass
verifies the tree. A chain is a tree with one branch: parents `[-1, 0, 1, ...]`.

The verifier commits the longest root path that the model's own output follows, plus the
token the model writes after it (the bonus), exactly as for a chain: the accept length is
the path's length, bonus excluded (`agspec.drafter.protocol`).

Example with concrete tokens: after the context `... 5 6`, the tree

    tokens  [7, 8, 9, 4]      7 -> 8 -> 9   (the first branch)
    parents [-1, 0, 1, 0]     7 -> 4        (a second branch after 7)

verified against the model's output `[7, 4, 2]` commits `[7, 4, 2]`: accept length 2,
won by the second branch (the chain `[7, 8, 9]` alone would have committed `[7, 4]`).

>>> tree = DraftTree([7, 8, 9, 4], [-1, 0, 1, 0])
>>> tree_commit(tree, [7, 4, 2], 0)
(2, [7, 4, 2], 1)
>>> tree.first_branch()
[7, 8, 9]
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DraftTree", "check_tree", "greedy_tree_path", "tree_branches", "tree_commit"]


def check_tree(token_ids: Sequence[int], parents: Sequence[int], *, what: str = "tree") -> None:
    """Raises ValueError (naming the node) unless `parents` describes a tree over
    `token_ids`: same length, each parent -1 or an earlier node, ids ints in [0, 2^31).

    >>> check_tree([7, 8], [-1, 1])
    Traceback (most recent call last):
    ...
    ValueError: tree.parents[1] = 1 must be -1 (the root) or an earlier node in [0, 1): \
a parent comes before its children
    """
    if len(token_ids) != len(parents):
        raise ValueError(
            f"{what}: token_ids and parents must have the same length, got "
            f"{len(token_ids)} and {len(parents)}"
        )
    for i, (tok, parent) in enumerate(zip(token_ids, parents)):
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < 2**31:
            raise ValueError(f"{what}.token_ids[{i}] = {tok!r} must be an int in [0, 2^31)")
        if isinstance(parent, bool) or not isinstance(parent, int) or not -1 <= parent < i:
            raise ValueError(
                f"{what}.parents[{i}] = {parent!r} must be -1 (the root) or an earlier node "
                f"in [0, {i}): a parent comes before its children"
            )


class DraftTree:
    """A token tree draft (see the module docstring). Checked when built; immutable by
    convention (the verifier and the drafter read the same lists)."""

    __slots__ = ("token_ids", "parents")

    def __init__(
        self, token_ids: Sequence[int], parents: Sequence[int], *, check: bool = True
    ) -> None:
        token_ids, parents = list(token_ids), list(parents)
        if check:
            check_tree(token_ids, parents)
        self.token_ids: list[int] = token_ids
        self.parents: list[int] = parents

    @classmethod
    def chain(cls, token_ids: Sequence[int]) -> DraftTree:
        """A chain as a tree: each node the child of the one before.

        >>> DraftTree.chain([5, 6, 7]).parents
        [-1, 0, 1]
        """
        # Built without __init__'s copies (a batched step makes one per request).
        tree = object.__new__(cls)
        tree.token_ids = list(token_ids)
        tree.parents = list(range(-1, len(tree.token_ids) - 1))
        return tree

    @classmethod
    def adopt(cls, token_ids: list[int], parents: list[int]) -> DraftTree:
        """A tree of these lists themselves, unchecked and uncopied: for a drafter that
        built them in topological order and hands them over (the batched tree step)."""
        tree = object.__new__(cls)
        tree.token_ids = token_ids
        tree.parents = parents
        return tree

    @property
    def num_nodes(self) -> int:
        return len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DraftTree)
            and self.token_ids == other.token_ids
            and self.parents == other.parents
        )

    def __repr__(self) -> str:
        return f"DraftTree({self.token_ids!r}, {self.parents!r})"

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def first_branch(self) -> list[int]:
        """The tokens of the first branch: from the first root child, the first child of
        each node in turn (for the drafter's trees, the chain it would draft alone)."""
        if not self.token_ids:
            return []
        out = [self.token_ids[0]]
        node = 0
        parents = self.parents
        for i in range(1, len(parents)):
            if parents[i] == node:
                out.append(self.token_ids[i])
                node = i
        return out

    def path(self, node: int) -> list[int]:
        """The tokens from the root down to `node` (inclusive).

        >>> DraftTree([7, 8, 9, 4], [-1, 0, 1, 0]).path(3)
        [7, 4]
        """
        out = []
        while node >= 0:
            out.append(self.token_ids[node])
            node = self.parents[node]
        out.reverse()
        return out

    def depth(self) -> int:
        """The longest root path's length in nodes (0 for an empty tree)."""
        depths: list[int] = []
        for p in self.parents:
            depths.append(1 if p < 0 else depths[p] + 1)
        return max(depths, default=0)


def tree_commit(
    tree: DraftTree, reference: Sequence[int], start: int
) -> tuple[int, Sequence[int], int]:
    """What a greedy verifier commits for `tree` when the model's output from `start` on
    is `reference[start:]`: (accept length, committed tokens, how far the first branch
    alone would have got). The committed tokens are the longest root path the output
    follows plus the model's next token (the bonus), unless the path covered the rest of
    the reference. For a chain it is `greedy_commit` with the accept length twice.

    One pass in node order: a node is on the output when its parent is (or is the root)
    and its token is the output's token at its depth (siblings with the same token are
    all followed; the longest path wins).

    >>> tree_commit(DraftTree([7, 8, 9, 4], [-1, 0, 1, 0]), [7, 8, 9, 1], 0)
    (3, [7, 8, 9, 1], 3)
    """
    tokens, parents = tree.token_ids, tree.parents
    rest = len(reference) - start
    # depth[i] > 0: node i is on the output at that depth; 0: it is not.
    depth = [0] * len(tokens)
    accepted = 0
    for i, (tok, par) in enumerate(zip(tokens, parents)):
        d = 1 if par < 0 else (depth[par] + 1 if depth[par] else 0)
        if d and d <= rest and tok == reference[start + d - 1]:
            depth[i] = d
            if d > accepted:
                accepted = d
    # The first branch: from node 0, the first child of each node in turn.
    first = 0
    node = -1
    for i, par in enumerate(parents):
        if par == node:
            if not depth[i]:
                break
            first += 1
            node = i
    return accepted, reference[start : start + accepted + 1], first


def greedy_tree_path(tree: DraftTree, next_tokens: Sequence[int]) -> list[int]:
    """The nodes a live greedy verifier accepts, root to leaf: from the root, the child
    whose token is the model's own next token, while there is one (of siblings with the
    same token, the first). `next_tokens[0]` is the model's token after the last committed
    token, `next_tokens[i + 1]` its token after node i (one forward over the tree). The
    committed tokens are the path's tokens plus `next_tokens` after its last node (the
    bonus). The one walk of every engine that verifies trees (transformers, llama.cpp).

    >>> tree = DraftTree([8, 9, 4], [-1, 0, 0])
    >>> greedy_tree_path(tree, [8, 4, 1, 2])   # after 7: 8; after 8: 4; after 4: 2
    [0, 2]
    """
    tokens, parents = tree.token_ids, tree.parents
    kids: dict[int, dict[int, int]] = {}
    for i, par in enumerate(parents):
        kids.setdefault(par, {}).setdefault(tokens[i], i)
    path: list[int] = []
    node = -1
    while True:
        child = kids.get(node, {}).get(int(next_tokens[node + 1]))
        if child is None:
            return path
        path.append(child)
        node = child


def tree_branches(parents: Sequence[int]) -> tuple[list[int], list[list[int]], list[int]]:
    """The tree's branches (one per leaf, in node order): (leaves, for each node the
    branches through it, in rank order, and each node's depth, 1 for a root child). An
    engine that gives each branch its own KV sequence tags a node with the sequences of
    the branches through it.

    >>> tree_branches([-1, 0, 1, 0, -1])    # 0 -> 1 -> 2, 0 -> 3, 4
    ([2, 3, 4], [[0, 1], [0], [0], [1], [2]], [1, 2, 3, 2, 1])
    """
    n = len(parents)
    depth = [0] * n
    is_leaf = [True] * n
    for i, par in enumerate(parents):
        depth[i] = 1 if par < 0 else depth[par] + 1
        if par >= 0:
            is_leaf[par] = False
    leaves = [i for i in range(n) if is_leaf[i]]
    through: list[list[int]] = [[] for _ in range(n)]
    for b, leaf in enumerate(leaves):
        node = leaf
        while node >= 0:
            through[node].append(b)
            node = parents[node]
    return leaves, through, depth
