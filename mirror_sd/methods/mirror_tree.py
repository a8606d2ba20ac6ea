"""Mirror-SD over draft trees (option ``tree`` > 0, temperature 0): the window is a tree, and so is
every branch's rollout.

A step, with the window a tree of N nodes hanging from the last committed token (row 0; node i at
row i + 1):

1. Target lane: layers [0, exit_layer) over [root, nodes] under the tree mask (each row sees the
   committed prefix, its ancestors and itself; positions by depth) and the early exit: the
   top-kappa candidates at every row, and each node's early-exit log-prob at its parent's row.
2. Branch (r, v) now reads: the target accepts the path to row r and emits v there (v not a child
   of row r: that would be an acceptance). Its score is the early-exit log-prob of that path plus
   v's (``mirror.choose_branches`` with the tree's parents). Then, on two lanes at once:
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

Lossless as any greedy tree verification: every committed token is the target's argmax after the
committed prefix. Trees are greedy only (a deterministic top-k tree has no exact sampling rule):
at T > 0 Mirror-SD rolls out chains.
"""
from __future__ import annotations

from concurrent.futures import Future

import torch

from ..devices import to_device
from ..drafting.token_by_token import tree_readers
from ..drafting.tree import Tree, grow_trees, tree_mask, tree_window
from . import mirror
from .verify import accept_tree


def copied_tree(tokens: list[int]) -> Tree:
    """A window copied from the context (drafting/lookup.py) as a one-branch tree."""
    k = len(tokens)
    return Tree(list(tokens), list(range(-1, k - 1)), list(range(1, k + 1)), [None] * k, copied=list(range(k)))


def tree_step(run, target_cache, draft_cache, window: Tree, step, exit_layer, kappa, head, budget, gamma,
              branching, nodes):
    """One step over a tree window on the lanes' threads (module docstring), as ``mirror.host_step``
    over a chain. Returns the accepted path (nodes), the token after it, the branch it hit (or
    None), the early-exit candidates [T][kappa] and the branches, each with its rolled-out tree."""
    pair = run.pair
    T = len(window.tokens) + 1
    _, positions, mask = tree_window(window, run.sequence, pair.target.device)
    channel = run.target_lane.submit(
        "target-prefix", mirror.token_channel, run, target_cache, [run.sequence[-1], *window.tokens], exit_layer,
        kappa, head, tree=window, label=mirror.prefix_label(exit_layer, head, T), step=step, tokens=T, alone=True)
    rollouts_done = Future()  # set once the rollouts are done: the suffix widens then (as host_step's)
    suffix = run.target_lane.submit("target-suffix", mirror.target_suffix, run, target_cache, channel, exit_layer,
                                    rollouts_done, positions, mask, label=mirror.suffix_label(pair, exit_layer, T),
                                    step=step, tokens=T)
    _, top_ids, top_logp, window_logp = channel.result()
    branches = mirror.choose_branches(window.tokens, top_ids, top_logp, window_logp, budget, window.parents)
    rolled = run.draft_lane.submit("draft-rollout", roll_out_trees, run, draft_cache, window, branches, gamma,
                                   branching, nodes, label=f"{len(branches)} branches x tree of {nodes}, depth {gamma}",
                                   step=step, tokens=len(branches) * nodes)
    rolled.add_done_callback(lambda _: rollouts_done.set_result(None))
    logits = suffix.result()
    branches = rolled.result()
    path, token, hit = run.target_lane.run("rendezvous", rendezvous, window, logits, run.target_sampler, branches,
                                           label="verify tree + match branch", step=step)
    return path, token, hit, top_ids.tolist(), branches


def rendezvous(window: Tree, logits: torch.Tensor, sampler, branches: list) -> tuple[list[int], int, int | None]:
    """Verify the tree against the final logits [T, V]; the accepted path, the token after it and the
    branch that outcome picked (None: a miss)."""
    path, token = accept_tree(window, logits, sampler)
    row = path[-1] + 1 if path else 0
    return path, token, next((i for i, b in enumerate(branches) if (b.accepted, b.root) == (row, token)), None)


def rollout_layout(run, cache, window: Tree, branches: list) -> tuple[list[int], list[int], torch.Tensor]:
    """The rollouts' first draft forward: ids, positions and mask [rows, slots] of the committed tokens
    the draft has not seen (P, causal), the window's nodes (N, under its tree mask) and every
    branch's root (B): the root of branch (r, v) sees the committed prefix, the path to row r and
    itself, at the position after row r."""
    n, base = len(run.sequence), cache.length  # the last committed token is at position n - 1
    pending = run.sequence[base:]
    P, N, B = len(pending), len(window.tokens), len(branches)
    seen = tree_mask(window.parents)[:, 1:]  # [N + 1, N]: the nodes each row of [root, nodes] sees
    rows = [b.accepted for b in branches]
    mask = torch.zeros(P + N + B, base + P + N + B, dtype=torch.bool)
    mask[:, :base] = True
    mask[:P, base:base + P] = torch.ones(P, P, dtype=torch.bool).tril()
    mask[P:, base:base + P] = True  # nodes and roots: every committed token
    mask[P:P + N, base + P:base + P + N] = seen[1:]
    mask[P + N:, base + P:base + P + N] = seen[rows]
    mask[P + N:, base + P + N:].fill_diagonal_(True)
    depth = [0, *window.depths]  # of each row
    positions = [*range(base, n), *(n - 1 + d for d in window.depths), *(n + depth[r] for r in rows)]
    return [*pending, *window.tokens, *(b.root for b in branches)], positions, mask


def roll_out_trees(run, cache, window: Tree, branches: list, gamma: int, branching: int, nodes: int) -> list:
    """Draft lane: a tree of ``nodes`` tokens, ``gamma`` levels deep, from every branch's root, into the
    branches (``tree``, and its tokens), all branches' levels in one forward each."""
    model = run.pair.draft
    log_probs, to_ids = tree_readers(run)
    ids, positions, mask = rollout_layout(run, cache, window, branches)
    B, dev = len(branches), model.device
    ids, positions, mask = (to_device(ids, dev, torch.long), to_device(positions, dev, torch.long),
                            to_device(mask, dev, torch.bool))
    first = log_probs(mirror._forward_rows(model, cache, ids, positions, mask, rows=B))  # [B, rows]: the roots' children
    root_position = positions[-B:]

    def expand(trees, _nodes, _parents, tokens, depth, mask):  # a node at ``depth`` below its branch's root
        return log_probs(mirror._forward_rows(model, cache, tokens, root_position[trees] + depth, mask, rows=len(tokens)))

    for branch, tree in zip(branches, grow_trees(first, expand, to_ids, gamma, branching, nodes, mask[-B:])):
        branch.tree, branch.tokens = tree, tree.tokens
    return branches
