"""Draft trees, shared by the tree-drafting methods (eagle, ss, sd and mirror with ``tree``, and the
draft checking its streams' lookahead): the nodes, how the verifying model sees them in one forward (tree mask, depth
positions), the best-scoring subtree, the tree of speculative streams' candidates, and the walk
down a tree by a rule for the token at each row.

A tree hangs from a root: the last committed token, which sits at window index 0; node i sits at
window index i + 1. Parents come before their children.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..devices import to_device
from ..trace import DraftTree


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


def grow_fields(first: torch.Tensor, expand, to_ids, depth: int, top_k: int, total_tokens: int) -> torch.Tensor:
    """EAGLE-2's dynamic tree from each of B roots at once, grown on their device with no read to the
    host (so it can run inside a CUDA graph: every shape is fixed by depth, top_k and total_tokens):
    every level of all the trees is one ``expand`` call; returns the kept nodes' fields [B, 4, M]
    (``read_trees``).

    first: log-probs [B, rows] of each root's children. Each tree starts with its root's ``top_k``
    best children. For ``depth - 1`` more levels, the ``top_k`` best nodes of each tree's newest
    level (by summed log-prob along the path; ties to the earlier node) are its frontier, and all
    frontiers are fed together, tree by tree: ``expand(trees, nodes, parents, tokens, depth,
    ancestors)`` gets each row's tree, node index (in its tree, in creation order), parent's (-1:
    the root) and token [R], the frontier's depth (an int) and ancestors [R, R'] (which of the R'
    rows expanded so far, this level's R last, each row sees: its expanded ancestors and itself); it
    writes the rows after those and returns their children's log-probs [R, rows]. Each frontier
    node gets its ``top_k`` best children. The best ``total_tokens`` nodes of each tree are kept
    (scores are sums of log-probs, so a child never outscores its parent; exactly equal scores go to
    the earlier node, the one tie-break of a tree's growth, so the kept set is a tree). to_ids maps
    rows (a tensor on the device) to target ids. Scores are summed in float64.
    """
    B, dev = first.shape[0], first.device
    k = min(top_k, first.shape[-1])
    top = first.topk(k, dim=-1)  # its values, and the children's below, summed in float64
    tokens, scores = [to_ids(top.indices)], [top.values.double()]  # per level: [B, nodes of the level]
    parents = [torch.full((B, k), -1, dtype=torch.long, device=dev)]
    start, columns = 0, (depth - 1) * B * k  # first node of the newest level; expanded rows, all levels
    seen = torch.zeros(B, k, columns, dtype=torch.bool, device=dev)  # per newest node: its expanded ancestors' rows
    rows, trees = torch.arange(B * k, device=dev), torch.arange(B, device=dev)[:, None].expand(B, k).flatten()  # [R]
    for d in range(2, depth + 1):
        frontier = torch.sort(scores[-1], dim=-1, descending=True, stable=True).indices[:, :k]  # [B, k] in the level
        done = (d - 2) * B * k  # rows expanded before this level
        mine = seen.gather(1, frontier[..., None].expand(B, k, columns)).view(B * k, columns)
        mine.scatter_(1, (done + rows)[:, None], True)  # each row sees itself (no host value copied)
        nodes = start + frontier  # [B, k]
        logp = expand(trees, nodes.flatten(), parents[-1].gather(1, frontier).flatten(),
                      tokens[-1].gather(1, frontier).flatten(), d - 1, mine[:, :done + B * k])  # [R, rows]
        child = logp.topk(k, dim=-1)  # [R, k]: each frontier node's children
        start += scores[-1].shape[1]
        tokens.append(to_ids(child.indices).view(B, k * k))
        scores.append((scores[-1].gather(1, frontier)[..., None] + child.values.double().view(B, k, k)).view(B, k * k))
        parents.append(nodes[..., None].expand(B, k, k).reshape(B, k * k))
        seen = mine.view(B, k, 1, columns).expand(B, k, k, columns).reshape(B, k * k, columns)
    return _best_subtrees(tokens, parents, scores, total_tokens)


def _best_subtrees(tokens: list, parents: list, scores: list, total_tokens: int) -> torch.Tensor:
    """The ``total_tokens`` best-scoring nodes of each tree (per level: tokens, parents, scores
    [B, nodes]), re-indexed in creation order: fields [B, 4, M] (token, parent, depth, score; float64).
    A child never outscores its parent and ties go to the earlier node, so the kept set is a tree."""
    depths = torch.cat([torch.full_like(level, d) for d, level in enumerate(tokens, start=1)], dim=1)
    tokens, parents, scores = torch.cat(tokens, dim=1), torch.cat(parents, dim=1), torch.cat(scores, dim=1)
    B, N = tokens.shape
    M = min(total_tokens, N)
    keep = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :M].sort(dim=-1).values  # [B, M]
    index = torch.full_like(tokens, -1).scatter_(1, keep, torch.arange(M, device=keep.device).expand(B, M))
    kept_parents = parents.gather(1, keep)
    kept_parents = torch.where(kept_parents >= 0, index.gather(1, kept_parents.clamp(min=0)), -1)
    return torch.stack([tokens.gather(1, keep).double(), kept_parents.double(), depths.gather(1, keep).double(),
                        scores.gather(1, keep)], dim=1)


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


def stream_fields(logp: torch.Tensor, to_ids, top_k: int, total_tokens: int) -> torch.Tensor:
    """``stream_tree`` grown on the streams' device with no read to the host (inside a stage's
    body: models/stream_draft.py), as ``grow_fields``' fields [1, 4, M]."""
    def expand(_trees, _nodes, _parents, tokens, depth, _ancestors):  # every frontier node: the next stream's
        return logp[depth].expand(tokens.shape[0], -1)

    return grow_fields(logp[:1], expand, to_ids, logp.shape[0], top_k, total_tokens)


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
    """[N + 1, N + 1] bool over [root, nodes]: True where a row may attend (its ancestors and itself)."""
    rows = [[0]]  # per row of [root, nodes]: the columns it sees (the root sees itself)
    for i, p in enumerate(parents):  # parents come first, so their rows are complete
        rows.append(rows[p + 1] + [i + 1])
    mask = torch.zeros(len(rows), len(rows), dtype=torch.bool)
    mask[[r for r, cols in enumerate(rows) for _ in cols], [c for cols in rows for c in cols]] = True  # one write
    return mask


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
    the accepted path (nodes), moved to slots n - 1 .. n - 1 + A."""
    cache.keep([n - 1] + [n + i for i in path], at=n - 1)


def walk_tree(tokens: list[int], children: dict[int, list[int]], logits_at, pick) -> tuple[list[int], int]:
    """Walk a tree by a rule for the token at a row: pick(logits_at(node)) -> token, logits_at(node)
    being what the rule reads for the row after that node's path (its logits [V], or the argmax
    already read). From the root (-1), pick the token after each node's path and go on to the child
    that carries it; return the path (nodes, root excluded) and the token picked where no child did.
    With the target's argmax this is greedy tree verification (methods/verify.py, which reads every
    row's argmax at once); with a sampler's pick (a draw at T > 0), every
    token is drawn from its row's law given the tokens before it (the draft walking its own
    lookahead, drafting/streamed.py)."""
    path, node = [], -1
    while True:
        token = pick(logits_at(node))
        match = [c for c in children.get(node, []) if tokens[c] == token]
        if not match:
            return path, token
        path.append(match[0])
        node = match[0]
