"""Draft trees, shared by the tree-drafting methods (eagle, ss, sd and mirror with ``tree``, and the
draft checking its streams' lookahead): the nodes, how the verifying model sees them in one forward (tree mask, depth
positions), the best-scoring subtree, the tree of speculative streams' candidates, and the walk
down a tree by a rule for the token at each row. The trees grow by tensor code a stage's body runs
too (tree_growth.py); here they are read to the host.

A tree hangs from a root: the last committed token, which sits at window index 0; node i sits at
window index i + 1. Parents come before their children.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..devices import to_device
from ..trace import DraftTree
from ..tree_growth import grow_fields, stream_fields
from ..tree_rules import ancestors


@dataclass
class Tree:
    """Draft nodes in creation order (a parent before its children). Node i sits at window index i + 1."""

    tokens: list[int]  # target token ids
    parents: list[int]  # index of the parent node; -1 for the root (the last committed token)
    depths: list[int]  # 1 for children of the root
    scores: list[float | None]  # sum of draft log-probs along the path (None: copied from the context)
    q: torch.Tensor | None = None  # [nodes, V] draft distributions (sampled chains only)
    copied: list[int] = field(default_factory=list)  # nodes copied from the context (drafting/lookup.py)

    def children(self) -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            kids.setdefault(p, []).append(i)
        return kids

    def committed(self, path: list[int], token: int) -> tuple[list[int], list[str]]:
        """The tokens a verdict (accepted path, next token) commits, and their origins: the next
        token is a bonus after a leaf (a whole branch accepted), else a correction."""
        leaf = (path[-1] if path else -1) not in self.children()
        return [self.tokens[i] for i in path] + [token], ["accepted"] * len(path) + ["bonus" if leaf else "correction"]

    def record(self, path: list[int], stream_rows: int = 0) -> DraftTree:
        """What a step record keeps of the tree (the app draws it): nodes and the accepted path."""
        return DraftTree(self.tokens, self.parents, self.depths, self.scores, path, self.copied, stream_rows)


def sampled_chain(tokens: list[int], q: torch.Tensor) -> Tree:
    """A tree with one branch, token i the parent of token i + 1, each drawn from its row of q [n, V]."""
    n = len(tokens)
    scores = torch.log(q[torch.arange(n), tokens]).cumsum(0).tolist()
    return Tree(tokens, list(range(-1, n - 1)), list(range(1, n + 1)), [round(x, 4) for x in scores], q)


def grow_tree(first: torch.Tensor, expand, to_ids, depth: int, top_k: int, total_tokens: int, base: int) -> Tree:
    """EAGLE-2's dynamic tree, for a drafter that feeds nodes to a KV cache of ``base`` committed slots:
    ``grow_trees`` for one root (first: log-probs [rows]), whose nodes see every committed slot."""
    sees = torch.ones(1, base, dtype=torch.bool, device=first.device)
    return grow_trees(first[None], expand, to_ids, depth, top_k, total_tokens, sees)[0]


def grow_trees(first: torch.Tensor, expand, to_ids, depth: int, top_k: int, total_tokens: int,
               sees: torch.Tensor) -> list[Tree]:
    """EAGLE-2's dynamic tree from each of B roots at once (``grow_fields``), read to the host once.

    sees [B, slots]: what tree b's nodes may see of the cache before any node is fed (its committed
    slots, its root); ``expand`` here gets each row's mask [R, slots + R'] over the cache's slots
    (``sees``, then the R' rows expanded so far, this level's last), not ``grow_fields``' ancestors."""
    k = min(top_k, first.shape[-1])
    sees = sees.repeat_interleave(k, dim=0)  # [R, slots]

    def expand_over_slots(trees, nodes, parents, tokens, depth, ancestors):
        return expand(trees, nodes, parents, tokens, depth, torch.cat([sees, ancestors], dim=1))

    return read_trees(grow_fields(first, expand_over_slots, to_ids, depth, top_k, total_tokens))


def read_trees(fields: torch.Tensor) -> list[Tree]:
    """The trees of ``grow_fields``' fields [B, 4, M], read to the host in one go."""
    return [tree_of_fields(*tree) for tree in fields.tolist()]


def tree_of_fields(tokens: list, parents: list, depths: list, scores: list) -> Tree:
    """One tree from its ``grow_fields`` fields read to the host (numbers, as floats)."""
    return Tree([int(t) for t in tokens], [int(p) for p in parents], [int(d) for d in depths],
                [round(x, 4) for x in scores])


def stream_tree(logp: torch.Tensor, to_ids, top_k: int, total_tokens: int) -> Tree:
    """A draft tree from speculative streams' log-probs logp [gamma, head rows] at one position (the
    tree drafting of Speculative Streaming): the top_k candidates of stream 1 are children of the
    root; those of stream j + 1 are children of each of the top_k best nodes of level j, scored by
    the sum of their streams' log-probs; the best ``total_tokens`` nodes are kept. to_ids maps head
    rows to target ids. Grown by ``stream_fields``, the rule a stage's body runs, and read once."""
    return read_trees(stream_fields(logp, to_ids, top_k, total_tokens))[0]


def graft(tree: Tree, chain: list[int]) -> Tree:
    """``tree`` with ``chain`` as a path from the root: where the chain follows the tree's own nodes
    they are reused, and the rest of it becomes new nodes (appended, so parents still come first,
    and listed in ``copied``). A greedy tree only: a sampled chain keeps its law (``q``) unmixed."""
    assert tree.q is None, "graft onto greedy trees only"
    tokens, parents, depths, scores = list(tree.tokens), list(tree.parents), list(tree.depths), list(tree.scores)
    kids, node, copied = tree.children(), -1, list(tree.copied)
    for depth, token in enumerate(chain, start=1):
        same = [k for k in kids.get(node, []) if tokens[k] == token]
        if same:
            node = same[0]
            continue
        tokens.append(token)
        parents.append(node)
        depths.append(depth)
        scores.append(None)
        node = len(tokens) - 1
        copied.append(node)
    return Tree(tokens, parents, depths, scores, copied=copied)


def tree_mask(parents: list[int]) -> torch.Tensor:
    """[N + 1, N + 1] bool over [root, nodes]: True where a row may attend (its ancestors and itself):
    ``tree_rules.ancestors``, the rule a tree verification stage runs."""
    return ancestors(torch.tensor([0, *(p + 1 for p in parents)]))


def tree_positions(depths: list[int], root_position: int) -> torch.Tensor:
    """[1, N + 1] rotary positions of [root, nodes]: the root's, plus each node's depth."""
    return torch.tensor([[root_position] + [root_position + d for d in depths]])


def tree_window(tree: Tree, sequence: list[int], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a target forward over [last committed token, nodes] takes, on ``device``: ids [1, N + 1],
    positions [1, N + 1] (the root at len(sequence) - 1, a node its depth beyond) and the tree mask
    [N + 1, N + 1]."""
    root = len(sequence) - 1
    rows = to_device([[sequence[-1], *tree.tokens], [root, *(root + d for d in tree.depths)]], device)  # one copy
    return rows[:1], rows[1:], tree_mask(tree.parents)


def keep_path(cache, path: list[int], n: int):
    """After a forward over [root, nodes] written at slots n - 1, n, ...: the cache keeps the root and
    the accepted path (nodes), moved to slots n - 1 .. n - 1 + A. A path of the first A nodes (a
    chain's) is in place already: the cache only forgets the rest."""
    if path == list(range(len(path))):
        cache.rollback(n + len(path))
    else:
        cache.keep([n - 1] + [n + i for i in path], at=n - 1)


def walk_tree(tokens: list[int], children: dict[int, list[int]], logits_at, pick) -> tuple[list[int], int]:
    """Walk a tree by a rule for the token at a row: pick(logits_at(node)) -> token, logits_at(node)
    being what the rule reads for the row after that node's path (its logits [V], or the argmax
    already read). From the root (-1), pick the token after each node's path and go on to the child
    that carries it; return the path (nodes, root excluded) and the token picked where no child did.
    With a sampler's pick (a draw at T > 0), every token is drawn from its row's law given the tokens
    before it, and only the path's rows are drawn (the draft walking its own lookahead,
    drafting/streamed.py). Greedy tree verification, where every row's pick is known at once, runs
    ``tree_rules.greedy_path`` (methods/verify.py: ``walk_tree_picks``)."""
    path, node = [], -1
    while True:
        token = pick(logits_at(node))
        match = [c for c in children.get(node, []) if tokens[c] == token]
        if not match:
            return path, token
        path.append(match[0])
        node = match[0]
