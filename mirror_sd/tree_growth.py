"""Draft trees grown as tensor code, with no read to the host: EAGLE-2's dynamic tree (``grow_fields``)
and the tree of speculative streams' candidates (``stream_fields``).

Every shape is fixed by (depth, top_k, total_tokens), so the same rule runs on the host's forwards
(drafting/tree.py reads its fields into a ``Tree``) and inside a fixed-shape stage's body
(models/eagle_tree.py, models/stream_draft.py). A tree's fields are [B, 4, M]: per kept node its
token, parent (-1: the root), depth and score (the sum of log-probs along its path), in float64.
"""
from __future__ import annotations

import torch


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


def stream_fields(logp: torch.Tensor, to_ids, top_k: int, total_tokens: int) -> torch.Tensor:
    """``stream_tree`` grown on the streams' device with no read to the host (inside a stage's
    body: models/stream_draft.py), as ``grow_fields``' fields [1, 4, M]."""
    def expand(_trees, _nodes, _parents, tokens, depth, _ancestors):  # every frontier node: the next stream's
        return logp[depth].expand(tokens.shape[0], -1)

    return grow_fields(logp[:1], expand, to_ids, logp.shape[0], top_k, total_tokens)
