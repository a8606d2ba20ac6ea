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

Lossless as any greedy tree verification: every committed token is the target's argmax after the
committed prefix. Trees are greedy only (a deterministic top-k tree has no exact sampling rule):
at T > 0 the engine refuses ``tree`` (``options.refuse_greedy_only``).
"""
from __future__ import annotations

from concurrent.futures import Future

import torch

from ..branches import choose_branches
from ..devices import to_device
from ..drafting.token_by_token import tree_readers
from ..drafting.tree import Tree, grow_trees, tree_mask, tree_window
from . import mirror, mirror_queued
from .verify import accept_tree, walk_tree_picks


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
        kappa, head, positions=positions, mask=mask, parents=window.parents,
        label=mirror.prefix_label(exit_layer, head, T), step=step, tokens=T, alone=True)
    rollouts_done = Future()  # set once the rollouts are done: the suffix widens then (as host_step's)
    suffix = run.target_lane.submit("target-suffix", mirror.target_suffix, run, target_cache, channel, exit_layer,
                                    rollouts_done, positions, mask, label=mirror.suffix_label(pair, exit_layer, T),
                                    step=step, tokens=T)
    _, top_ids, top_logp, window_logp = channel.result()
    rows = mirror.choose_branches(window.tokens, top_ids, top_logp, window_logp, budget, window.parents)
    rolled = run.draft_lane.submit("draft-rollout", roll_out, run, draft_cache, window, rows, gamma,
                                   branching, nodes, label=rollout_label(len(rows), nodes, gamma),
                                   step=step, tokens=len(rows) * nodes)
    rolled.add_done_callback(lambda _: rollouts_done.set_result(None))
    logits = suffix.result()
    branches = mirror.valid_branches(rolled.result())
    path, token, hit = run.target_lane.run("rendezvous", rendezvous, window, logits, run.target_sampler, branches,
                                           label="verify tree + match branch", step=step)
    return path, token, hit, top_ids.tolist(), branches


def queued_tree_step(run, target_cache, draft_cache, window: Tree, step, exit_layer, kappa, head, budget, gamma,
                     branching, nodes):
    """``tree_step`` queued on the lanes' streams from this thread, as ``mirror_queued.queued_step``
    over a chain: the target stream runs the prefix, the early exit, the suffix under the tree mask
    and the target's picks; the draft stream waits for the token channel on a CUDA event, chooses
    the branches on the device (mirror_sd/branches.py, the host's rule) and grows their trees
    there (``roll_out_trees``, as the host's step does, over the same rows). The host reads both
    once, at the end. Returns what ``tree_step`` does."""
    T = len(window.tokens) + 1
    channel_there, channel, logits, suffix = mirror_queued.queue_target(run, target_cache, window.tokens, step,
                                                                        exit_layer, kappa, head, tree=window)
    B = min(budget, T * kappa)

    def choose_and_roll_out():
        r, roots, scores, valid = choose_branches(window.tokens, *channel_there, budget, window.parents)
        return r, roots, scores, valid, roll_out_trees(run, draft_cache, window, r, roots, gamma, branching, nodes)

    (r, roots, scores, valid, trees), rolled = run.draft_lane.queue(
        "draft-rollout", choose_and_roll_out, after=channel.done, label=rollout_label(B, nodes, gamma), step=step,
        tokens=B * nodes)
    picks, verified = run.target_lane.queue("rendezvous", mirror_queued.target_picks, logits,
                                            label="verify tree + match branch", step=step)
    mirror_queued.wait_and_record(channel, suffix, rolled, verified)  # the step's one wait
    rows = torch.stack([r, roots, valid.long()], dim=1).tolist()  # [B, 3]
    branches = [mirror.Branch(row[0], row[1], score, tokens=tree.tokens, tree=tree)
                for row, score, tree in zip(rows, scores.tolist(), trees) if row[2]]
    path, token = walk_tree_picks(window.tokens, window.children(), picks.tolist())
    return path, token, matched(path, token, branches), channel_there[0].tolist(), branches


def rollout_label(branches: int, nodes: int, gamma: int) -> str:
    return f"{branches} branches x tree of {nodes}, depth {gamma}"


def rendezvous(window: Tree, logits: torch.Tensor, sampler, branches: list) -> tuple[list[int], int, int | None]:
    """Verify the tree against the final logits [T, V]; the accepted path, the token after it and the
    branch that outcome picked (None: a miss)."""
    path, token = accept_tree(window, logits, sampler)
    return path, token, matched(path, token, branches)


def matched(path: list[int], token: int, branches: list) -> int | None:
    """The branch rolled out from the accepted path's last row with ``token`` at its root (None: a miss)."""
    return mirror.branch_hit(branches, path[-1] + 1 if path else 0, token)


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
    first = log_probs(mirror._forward_rows(model, cache, ids, positions, mask, rows=B))  # [B, rows]: the roots' children
    root_position = positions[-B:]

    def expand(trees, _nodes, _parents, tokens, depth, mask):  # a node at ``depth`` below its branch's root
        return log_probs(mirror._forward_rows(model, cache, tokens, root_position[trees] + depth, mask, rows=len(tokens)))

    return grow_trees(first, expand, to_ids, gamma, branching, nodes, mask[-B:])


def roll_out(run, cache, window: Tree, branches: list, gamma: int, branching: int, nodes: int) -> list:
    """``roll_out_trees`` for host-chosen branches, their trees into them."""
    trees = roll_out_trees(run, cache, window, *mirror.branch_tensors(branches, run.pair.draft.device), gamma,
                           branching, nodes)
    for branch, tree in zip(branches, trees):
        branch.tree, branch.tokens = tree, tree.tokens
    return branches
