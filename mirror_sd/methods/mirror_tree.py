"""Mirror-SD over draft trees (option ``tree`` > 0, temperature 0): the window is a tree, and so is
every branch's rollout.

A step, with the window a tree of N nodes hanging from the last committed token (row 0; node i at
row i + 1):

1. Target lane: layers [0, exit_layer) over [root, nodes] under the tree mask (each row sees the
   committed prefix, its ancestors and itself; positions by depth) and the early exit: the
   top-kappa candidates at every row, and each node's early-exit log-prob at its parent's row.
2. Branch (r, v) now reads: the target accepts the path to row r and emits v there (v not a child
   of row r: that would be an acceptance). Its score is the early-exit log-prob of that path plus
   v's (mirror_sd/branches.py, with the tree's parents). Then, on two lanes at once:
   - target lane: the suffix over the same rows, under the same mask;
   - draft lane: from the root v of each of the ``branch_budget`` best branches, the draft grows
     a tree as sd's tree draft does (EAGLE-2's dynamic tree, drafting/token_by_token.py:
     ``draft_tree``), gamma levels deep, ``branching`` children per expanded node, keeping the
     ``tree`` best nodes; every branch's level in one forward (``tree.grow_trees``): gamma draft
     forwards per step, as for chains.
3. Rendezvous: greedy tree verification (``verify.accept_tree``) gives the accepted path and the
   token c after it. If branch (the row where the path ends, c) was rolled out, its tree is the
   next window (a hit); otherwise a fresh tree draft or a copied chain is (a miss, as for chains).
4. Both caches keep the root and the accepted path (``tree.keep_path``).

The step itself is ``mirror.tree_step``; this module lays out and grows the rollouts' trees.

Lossless as any greedy tree verification: every committed token is the target's argmax after the
committed prefix. Trees are greedy only (a deterministic top-k tree has no exact sampling rule):
at T > 0 the engine refuses ``tree`` (``options.refuse_greedy_only``).
"""
from __future__ import annotations

import torch

from ..branches import BranchTable, choose_branches
from ..devices import to_device
from ..drafting.token_by_token import tree_readers
from ..drafting.tree import Tree, grow_trees, tree_mask
from ..models.forwards import forward_rows


def roll_out(ctx, window: Tree, prefix) -> BranchTable:
    """Draft lane: the branches over the tree window (mirror_sd/branches.py, with the tree's parents)
    from the token channel (``prefix``: the target prefix's hidden states and channel), and from each
    branch's root a tree grown ``gamma`` levels deep (``roll_out_trees``)."""
    channel, s = prefix[1], ctx.s
    r, roots, scores, valid = choose_branches(window.tokens, channel.top_ids, channel.top_logp, channel.window_logp,
                                              s.budget, window.parents)
    trees = roll_out_trees(ctx.run, ctx.draft_cache, window, r, roots, s.gamma, s.branching, s.tree)
    return BranchTable(BranchTable.columns(r, roots, valid, scores), trees=trees)


def rollout_label(branches: int, nodes: int, gamma: int) -> str:
    return f"{branches} branches x tree of {nodes}, depth {gamma}"


def rollout_layout(run, cache, window: Tree, r: torch.Tensor, roots: torch.Tensor):
    """The rollouts' first draft forward, laid out on the draft's device (where r and roots [B], the
    branches' rows and root tokens, lie): ids [rows], positions [rows] and mask [rows, slots] of
    the committed tokens the draft has not seen (P, causal), the window's nodes (N, under its tree
    mask) and every branch's root (B): the root of branch (r, v) sees the committed prefix, the
    path to row r and itself, at the position after row r."""
    n, base, dev = len(run.sequence), cache.length, r.device  # the last committed token is at position n - 1
    pending = run.sequence[base:]
    P, N, B = len(pending), len(window.tokens), len(r)
    seen = tree_mask(window.parents)[:, 1:]  # [N + 1, N]: the nodes each row of [root, nodes] sees
    known = torch.zeros(P + N, base + P + N + B, dtype=torch.bool)  # the rows the host knows: pending, nodes
    known[:, :base] = True
    known[:P, base:base + P] = torch.ones(P, P, dtype=torch.bool).tril()
    known[P:, base:base + P] = True  # nodes (and roots, below): every committed token
    known[P:, base + P:base + P + N] = seen[1:]
    root_rows = torch.cat([torch.ones(B, base + P, dtype=torch.bool, device=dev), to_device(seen, dev)[r],
                           torch.eye(B, dtype=torch.bool, device=dev)], dim=1)  # [B, slots]
    mask = torch.cat([to_device(known, dev), root_rows])
    row_depth = to_device([0, *window.depths], dev, torch.long)
    positions = torch.cat([to_device([*range(base, n), *(n - 1 + d for d in window.depths)], dev, torch.long),
                           n + row_depth[r]])
    return torch.cat([to_device([*pending, *window.tokens], dev, torch.long), roots]), positions, mask


def roll_out_trees(run, cache, window: Tree, r: torch.Tensor, roots: torch.Tensor, gamma: int, branching: int,
                   nodes: int) -> list[Tree]:
    """Draft lane: a tree of ``nodes`` tokens, ``gamma`` levels deep, from the root of every branch (r,
    roots [B] on the draft's device), all branches' levels in one forward each; read to the host
    once, at the end (``tree.grow_trees``)."""
    model, B = run.pair.draft, len(r)
    log_probs, to_ids = tree_readers(run)
    ids, positions, mask = rollout_layout(run, cache, window, r, roots)
    first = log_probs(forward_rows(model, cache, ids, positions, mask, rows=B))  # [B, rows]: the roots' children
    root_position = positions[-B:]

    def expand(trees, _nodes, _parents, tokens, depth, mask):  # a node at ``depth`` below its branch's root
        return log_probs(forward_rows(model, cache, tokens, root_position[trees] + depth, mask, rows=len(tokens)))

    return grow_trees(first, expand, to_ids, gamma, branching, nodes, mask[-B:])
