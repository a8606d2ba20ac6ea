"""What a draft tree's rows see, and the greedy walk down it, written once as tensor code.

A tree window's rows are [root, nodes]: row 0 the last committed token, node i at row i + 1, a
parent's row before its children's. ``parents`` [W] gives each row's parent row; the root's is
itself, and so is a padding row's (a fixed-shape stage's rows past the tree: no ancestor). Every
shape is fixed by W and no value is read to the host, so the same functions run on the host's
trees (drafting/tree.py: ``tree_mask``; methods/verify.py: ``walk_tree_picks``) and inside a
fixed-shape stage's body (models/eagle_verify.py), and Mirror-SD's branch rule (branches.py) and
rollouts (models/rollout.py) read their windows through ``ancestors`` too.
"""
from __future__ import annotations

import torch


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[W, W] bool: row i sees row j where j is i or one of its ancestors (the tree mask), by pointer
    jumping over parents [W]: after k hops each row knows its ancestors up to 2**k - 1 levels up, and a
    tree of W rows is under W deep, so log2(W) hops do."""
    W = parents.shape[0]
    rows = torch.arange(W, device=parents.device)
    seen, hop = rows[:, None] == rows[None, :], parents
    for _ in range((W - 1).bit_length()):
        seen, hop = seen | seen[hop], hop[hop]
    return seen


def greedy_path(seen: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, picks: torch.Tensor,
                real: torch.Tensor | bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy tree verification (EAGLE-2, temperature 0) over rows [root, nodes]: a node is accepted
    when its token is the target's pick at its parent's row and its parent is accepted. Children of
    one parent carry distinct tokens, so the accepted nodes are one path from the root; the pick at
    its deepest row is the next token (the correction, or the bonus after a leaf).

    seen [W, W]: ``ancestors(parents)``; tokens, parents, picks [W] (picks: the target's token after
    each row's path); real [W]: the rows in use (the rest: padding). Returns the accepted nodes A [1],
    the path's deepest row [1] and the rows [W], the root's and the path's first (in depth order),
    the others after them (their order unused)."""
    W = tokens.shape[0]
    rows = torch.arange(W, device=tokens.device)
    matches = (tokens == picks[parents]) | (rows == 0)  # [W]: a node the target would emit there (the root: kept)
    accepted = real & ~(seen & ~matches[None, :]).any(-1)  # every ancestor, and itself, matches
    depths = seen.sum(-1) - 1  # [W]: ancestors above each row
    deepest = torch.where(accepted, depths, -1).argmax().view(1)  # [1]
    on_path = seen.index_select(0, deepest)[0]  # [W] (an index by a 0-d tensor would read it back)
    path = torch.sort(torch.where(on_path, rows, W + rows)).values.clamp(max=W - 1)  # [W]: its rows first
    return depths.index_select(0, deepest), deepest, path
