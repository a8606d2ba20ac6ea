"""The draft lane's work in a Mirror-SD step (methods/mirror.py): the branches' rollouts.

From the token channel the draft lane chooses the branches (mirror_sd/branches.py) and rolls each
out, all branches in one batch per draft forward. The first forward (``rollout_layout``) writes the
committed tokens the draft has not seen, the window and every branch's root; a root sees the
committed prefix, the window's path to its branch point and itself, at the position after it.

* chains (``roll_out_chain_window``): gamma tokens after each root, one forward per token
  (``roll_out_chains``), or with the draft's speculative streams in one (``roll_out_streamed``);
  on the draft's rollout stage the choice and every forward are one replay (``roll_out_on_stage``;
  models/rollout.py), and in queued steps one more one-branch rollout follows the target's picks
  (``roll_out_correction``);
* trees (``roll_out_tree_window``, option ``tree`` > 0, temperature 0): from each root the draft
  grows a tree as sd's tree draft does (EAGLE-2's dynamic tree), gamma levels deep, ``branching``
  children per expanded node, keeping the ``tree`` best nodes; every branch's level in one forward
  (``tree.grow_trees``). A tree window's branch (r, v) hangs from any row r of the window, and a hit
  hands the next step its tree. Trees are greedy only (a deterministic top-k tree has no exact
  sampling rule): at T > 0 the engine refuses ``tree``.
"""
from __future__ import annotations

import torch

from ..branches import BranchTable, choose_branches
from ..devices import to_device
from ..drafting.token_by_token import tree_readers
from ..drafting.tree import Tree, grow_trees, tree_mask
from ..models.channel import Channel
from ..models.forwards import forward_rows, staged, staged_for
from ..models.chain_draft import greedy_chain
from ..models.rollout import Rollouts, first_forward, later_forward
from ..models.stages import MAX_WIDTH
from ..models.streams import draft_streams, split_forward


def roll_out_chain_window(ctx, window: list[int], prefix: tuple[torch.Tensor, Channel],
                          keep: bool = False) -> BranchTable:
    """Draft lane, a chain window: the branches from the token channel (``prefix``: the target
    prefix's hidden states and channel) and gamma draft tokens after each (``roll_out_chains``, or
    with ``streams`` ``roll_out_streamed``); on the draft's rollout stage where it holds the step, the
    choice and every forward in one replay (``keep``: as in ``roll_out_on_stage``). Nothing read to
    the host at T = 0."""
    run, cache, channel = ctx.run, ctx.draft_cache, prefix[1]
    if rollout_stage_fits(ctx, window, ctx.rollout_stage):
        return roll_out_on_stage(ctx, window, channel, ctx.rollout_stage, keep)
    r, roots, scores, valid = choose_branches(window, channel.top_ids, channel.top_logp, channel.window_logp,
                                              ctx.s.budget)
    roll = roll_out_streamed if ctx.s.streams else roll_out_chains
    tokens, drawn = roll(run, cache, window, r, roots, ctx.s.gamma)
    return BranchTable(BranchTable.columns(r, roots, valid, scores, tokens), drawn=drawn)


def roll_out_tree_window(ctx, window: Tree, prefix: tuple[torch.Tensor, Channel]) -> BranchTable:
    """Draft lane, a tree window: the branches over the tree (with its parents) from the token
    channel, and from each branch's root a tree grown ``gamma`` levels deep (``roll_out_trees``)."""
    channel, s = prefix[1], ctx.s
    r, roots, scores, valid = choose_branches(window.tokens, channel.top_ids, channel.top_logp, channel.window_logp,
                                              s.budget, window.parents)
    trees = roll_out_trees(ctx.run, ctx.draft_cache, window, r, roots, s.gamma, s.branching, s.tree)
    return BranchTable(BranchTable.columns(r, roots, valid, scores), trees=trees)


def chain(tokens: list[int]) -> Tree:
    """A chain window as a one-branch tree: token i the parent of token i + 1."""
    return Tree(tokens, list(range(-1, len(tokens) - 1)), list(range(1, len(tokens) + 1)), [None] * len(tokens))


def rollout_layout(run, cache, window: Tree, r: torch.Tensor, roots: torch.Tensor):
    """The rollouts' first draft forward (``models.rollout.first_forward``, the rule the rollout stage
    runs), laid out on the draft's device (where r and roots [B], the branches' rows and root tokens,
    lie): ids [rows], positions [rows] and mask [rows, slots] of the committed tokens the draft has
    not seen (P, causal), the window's nodes (N, under its tree mask) and every branch's root (B):
    the root of branch (r, v) sees the committed prefix, the path to row r and itself, at the
    position after row r."""
    base, dev = cache.length, r.device
    pending = run.sequence[base:]
    P, C, B = len(pending), len(pending) + len(window.tokens), len(r)
    known = to_device([*pending, *window.tokens, 0, *window.depths], dev, torch.long)  # one copy: the chain, depths
    ids, positions, _, mask, _ = first_forward(torch.arange(base + C + B, device=dev), torch.arange(C + B, device=dev),
                                               base, P, C, r, roots, torch.cat([known[:C], roots]),
                                               to_device(tree_mask(window.parents), dev), known[C:])
    return ids, positions, mask


def roll_out_chains(run, cache, draft: list[int], r: torch.Tensor, roots: torch.Tensor, gamma: int):
    """gamma draft tokens after every branch (r, roots [B] on the draft's device), all branches in one
    batch per forward: forward 1 lays out the window and the roots (``rollout_layout``), forward k
    feeds each branch's newest token, which sees what its root saw and its branch's tokens
    (``models.rollout.later_forward``). At T = 0: (picks [B, gamma], left on the device, None;
    ``greedy_chain``, the rule the rollout stage runs); at T > 0 each branch's tokens are drawn from
    its own row: (None, [(tokens, laws)] per branch)."""
    model, sampler = run.pair.draft, run.draft_sampler
    base, B, dev = cache.length, len(r), r.device
    ids, positions, mask = rollout_layout(run, cache, chain(draft), r, roots)
    C = len(ids) - B
    views = torch.cat([mask[-B:], mask.new_zeros(B, (gamma - 1) * B)], dim=1)  # the roots' views, every slot
    slots = torch.arange(views.shape[1], device=dev)

    def feed(tokens: torch.Tensor, k: int) -> torch.Tensor:  # forward k + 1: [B] -> their logits [B, V_draft]
        sees = later_forward(slots, base, C, k, views)[0][:, :cache.length + B]
        return forward_rows(model, cache, tokens, positions[-B:] + k, sees, rows=B)

    logits = forward_rows(model, cache, ids, positions, mask, rows=B)  # [B, V_draft]
    if sampler.greedy:
        return greedy_chain(logits, feed, gamma, model.vocab_map, run.pair.target.args.vocab_size), None
    drawn = [([], []) for _ in range(B)]
    for k in range(gamma):  # every branch's token drawn from its own row, in one call
        q = sampler.probs(run.as_target_vocab(logits))  # [B, V]
        for (tokens, laws), q_b, token in zip(drawn, q, sampler.sample_rows(q)):
            tokens.append(token)
            laws.append(q_b)
        if k < gamma - 1:
            logits = feed(to_device([tokens[-1] for tokens, _ in drawn], dev, torch.long), k + 1)
    return None, drawn


def roll_out_streamed(run, cache, draft: list[int], r: torch.Tensor, roots: torch.Tensor, gamma: int):
    """Like ``roll_out_chains``, in one draft forward: the draft's main stream gives each branch's first
    token after its root, and its speculative streams at the root the other gamma - 1. Returns
    (None, [(tokens, laws)] per branch), the laws empty at T = 0."""
    model, sampler, B = run.pair.draft, run.draft_sampler, len(r)
    streams = draft_streams(run.pair)
    ids, positions, mask = rollout_layout(run, cache, chain(draft), r, roots)
    main, h0 = split_forward(model, ids[None], cache, streams.first_layer, positions=positions[None], tree_mask=mask)
    cache.length += len(ids)
    root_slots = torch.arange(cache.length - B, cache.length, device=model.device)[None]  # [1, B]
    ahead = streams(model, cache, h0[:, -B:], root_slots, positions=positions[None, -B:],
                    seen=mask[None, -B:])[0, :, :gamma - 1]  # [B, gamma - 1, V_d]
    logits = run.as_target_vocab(torch.cat([main[0, -B:, None], ahead], dim=1))  # [B, gamma, V]
    drawn = []
    for rows in logits:
        tokens, q = sampler.draw(rows)
        drawn.append((tokens, list(q) if q is not None else []))
    return None, drawn


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


def rollout_stage_fits(ctx, window: list[int], spec: Rollouts | None) -> bool:
    """Whether the draft's stage for ``spec`` holds this step: the draft on stages, the window within
    the channel rows it was made for, the chain and every root within its widest forward."""
    run, cache = ctx.run, ctx.draft_cache
    unseen = len(run.sequence) - cache.length + len(window)  # committed tokens the draft has not seen, the window
    return (spec is not None and staged_for(run.pair.draft, cache, spec) is not None
            and len(window) < spec.rows and unseen + spec.budget <= MAX_WIDTH)


def roll_out_on_stage(ctx, window: list[int], channel: Channel, spec: Rollouts, keep: bool = False) -> BranchTable:
    """The branch choice and rollouts in one replay of the draft's stage for ``spec`` (models/rollout.py);
    the cache moves past the chain and the rollouts' slots, as ``roll_out_chains`` moves it. The table
    is the stage's output, read before the stage's next replay; ``keep``: a copy, for a step whose
    correction replays a stage (which may reuse the memory) before the host reads the table."""
    run, cache = ctx.run, ctx.draft_cache
    unseen = run.sequence[cache.length:] + list(window)  # committed tokens the draft has not seen, then the window
    table = staged(run.pair.draft, cache).run(spec.name, [unseen], rows=len(unseen) + spec.budget, channel=channel)
    cache.length += len(unseen) + spec.gamma * spec.budget
    return BranchTable(table.table.clone() if keep else table.table)


def roll_out_correction(ctx, window: list[int], picks: torch.Tensor, base: int) -> BranchTable:
    """Draft lane, once the target's picks [T] are made: the one branch of the step's own outcome,
    rolled out from the draft cache's ``base`` slots. Its channel holds the picks alone, one
    candidate per row, all scored alike: the rows whose pick is the window's next token are
    acceptances, skipped, so the branch chosen is the first row where the target's pick differs, or
    the bonus row: the outcome (A, c) of verifying."""
    picks = picks.to(ctx.run.pair.draft.device, non_blocking=True)
    if picks.is_cuda:  # made on the target's stream: keep its memory until this stream has read it
        picks.record_stream(torch.cuda.current_stream(picks.device))
    zeros = torch.zeros(len(picks), 1, dtype=torch.float64, device=picks.device)
    ctx.draft_cache.length = base
    return roll_out_on_stage(ctx, window, Channel.of(picks[:, None], zeros, zeros[:-1, 0]), ctx.correction_stage)
