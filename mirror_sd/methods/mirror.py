"""Mirror Speculative Decoding (Bhendawade et al., 2025): drafting leaves the critical path.

One step (``step``), with the window W = [last committed token, d1 .. d_gamma]:

1. token channel (target lane): layers [0, exit_layer) over W, then the early exit: the target's
   own final norm + LM head on those hidden states (``early_exit``; only the rows of the draft's
   vocabulary when it has a reduced one: ``exit_reader``; through a trained exit head first where
   the pair has one for the exit layer: models/exit_head.py). The top-kappa tokens and log-probs at every row, and each draft
   token's log-prob, are all that crosses to the draft lane (models/channel.py: ``Channel``).
2. At the same time, on two lanes:
   - target suffix (target lane): layers [exit_layer, N) over W -> final logits;
   - branch rollouts (draft lane): branch (r, v) assumes the target accepts d1..dr and then emits v
     (an early-exit candidate at row r). The ``branch_budget`` most likely branches
     (mirror_sd/branches.py) each get gamma draft tokens, all branches batched in one tree per
     forward: gamma forwards token by token, or with ``streams=1`` one forward, the draft's main
     stream giving each branch's first token and its speculative streams the rest.
3. rendezvous: verification gives (accepted A, token c). If branch (A, c) was rolled out, its
   continuation is the next window, ready with no draft time on the critical path (a hit).
   Otherwise the next step starts with a fresh draft (a miss: draft time exposed), unless
   (temperature 0, ``lookup`` > 0) the context holds a continuation to copy (drafting/lookup.py),
   or (a queued step on the draft's stages) the draft lane rolled out the branch of the target's
   own outcome as soon as its picks were made (the correction rollout).
4. commit d1..dA + c and roll both KV caches back to the committed length.

With option ``tree`` > 0 (T = 0) the window and every branch's rollout are draft trees instead of
chains, the branches hanging from any row of the window (methods/mirror_rollouts.py). The step is
the same: a chain window is a tree of one path, verified by the same walk.
All-accepted case (left open by the paper): c is the bonus token at row gamma, and branches
(gamma, v) use the early-exit candidates there, so a fully accepted window can hit too.

How the phases run (two lanes overlapping on threads, or queued on CUDA streams with one wait per
step), how many CPU cores each takes, and whether the correction rollout runs at all (queued steps
only) are the executor's business (mirror_sd/executors.py); this module is the whole algorithm.
Where the pair's caches have fixed-shape stages, the channel and the rollouts each run as one
(models/channel.py, models/rollout.py), with the same rules.

Why this is lossless. Every committed token comes from ``verify`` against the target's unchanged
final distribution, with the standard rules (greedy match at T = 0; speculative sampling at
T > 0). Mirror-SD only changes *which* draft tokens are verified and *when* they were made. At
T > 0 speculative sampling needs the window tokens to be draws from the draft's law q given the
committed prefix, with q recorded. A used branch's continuation was sampled from q given exactly
the prefix that was committed (the accepted tokens + c), with the draft lane's own random stream.
Whether a branch is used depends on (A, c) and on the early-exit candidates. Neither depends on
that branch's own samples: (A, c) comes from the target's stream and the previous window, and the
candidates are a deterministic function of the window. So, given the committed prefix, the window
is a draw from q, and the usual proof applies unchanged. A fresh fallback draft is a draw from q
as well. tests/test_distribution.py checks this with a chi-square test against the exact law.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..branches import Branch, BranchTable, branch_hit
from ..devices import to_device
from ..drafting import make_drafter
from ..drafting.lookup import copy_from_context
from ..drafting.tree import Tree, graft, keep_path, tree_window
from ..executors import executor_for, work
from ..models.channel import Channel, TokenChannel, channel_of
from ..models.exit_head import EarlyExit, available_exit_head
from ..models.forwards import FULL, LayerRange, layers, read, staged_for
from ..models.rollout import Rollouts
from ..models.stages import MAX_WIDTH
from ..models.streams import split_ranges
from ..sampling import to_target_vocab
from ..trace import Rendezvous, SpanKind, Step
from .mirror_rollouts import (chain, roll_out_chain_window, roll_out_correction, roll_out_tree_window,
                              rollout_stage_fits)
from .prefill import prefill_pair
from .verify import verify, walk_tree_picks


@dataclass(frozen=True)
class Settings:
    """A Mirror-SD run's options (methods/__init__.py), the exit layer resolved."""

    gamma: int  # draft tokens per window (a tree window's depth)
    kappa: int  # early-exit candidates per window row
    exit_layer: int
    budget: int  # branches rolled out per step
    streams: int = 0  # 1: each rollout in one forward of the draft's speculative streams
    lookup: int = 0  # after a miss, copy up to this many tokens from the context
    tree: int = 0  # tree windows of this many nodes (0: chains)
    branching: int = 4  # with tree: children per expanded node (2, 3 and 4 measured alike: a fixed rule)


@dataclass
class Context:
    """What a step works with: the run, how its phases run, both caches, the settings, the exit head
    (None: the logit lens) and the fixed-shape stages the caches were made with (None: none)."""

    run: object
    ex: object  # executors.Threads or executors.Streams
    target_cache: object
    draft_cache: object
    s: Settings
    head: object
    channel_stage: TokenChannel | None = None
    rollout_stage: Rollouts | None = None
    correction_stage: Rollouts | None = None


@dataclass
class Outcome:
    """A step's result: the accepted path, the token after it, the branch it hit (None: a miss), the
    early-exit candidates [T][kappa], the branches, and the correction rollout (None: none)."""

    path: list[int]  # accepted nodes (a chain: 0 .. A - 1)
    token: int
    hit: int | None
    top_ids: list[list[int]]
    branches: list[Branch]
    correction: Correction | None = None


def default_exit_layer(num_layers: int) -> int:
    """Three quarters of the way up (22 of SmolLM2-135M's 30 layers): a later exit sees more of the
    target (more hits) and still leaves the draft a suffix to hide under (docs/experiments/mirror.md)."""
    return max(1, num_layers * 3 // 4)


def exit_reader(pair, head=None, draft_rows: bool = True) -> EarlyExit:
    """The module that reads the exit layer for the token channel (models/exit_head.py: EarlyExit),
    made once per pair, with trained ``head`` (None: the logit lens). With a reduced-vocabulary
    draft (a ``vocab_map``) and ``draft_rows``, it computes only the target's LM-head rows of the
    draft's tokens (8,192 of 49,152 for the shipped draft): the candidates it loses are rare tokens."""
    target, vocab_map = pair.target, pair.draft.vocab_map if draft_rows else None
    key = (head, vocab_map is not None)
    if key not in pair.early_exits:
        weight = target.lm_head.weight.detach()
        if vocab_map is not None and pair.early_exit_rows is None:  # [rows, d]: the rows of the draft's tokens
            pair.early_exit_rows = weight[vocab_map.to(target.device)].clone()
        rows = weight if vocab_map is None else pair.early_exit_rows
        pair.early_exits[key] = EarlyExit(target, rows, head, vocab_map)
    return pair.early_exits[key]


def early_exit(pair, hidden: torch.Tensor, head=None, cache=None, exit_layer: int = 0) -> torch.Tensor:
    """The early exit on the exit layer's hidden states [1, T, d]: through the trained ``head`` (None:
    none, the logit lens), then the target's own final norm and LM head, as log-probs [T, V] on the
    target's vocabulary (-inf outside a reduced-vocabulary draft's). A sharded target reads its whole
    LM head; one on a single device ``exit_reader``'s rows, as a stage of its own where ``cache``
    (at ``exit_layer``) has stages."""
    target = pair.target
    if target.layer_devices:
        return torch.log_softmax(target.head(hidden if head is None else head(hidden))[0], dim=-1)
    reader = exit_reader(pair, head)
    logp = reader(hidden) if cache is None else read(target, hidden, cache, exit_layer, reader)
    return to_target_vocab(logp[0], reader.vocab_map, target.args.vocab_size)


# -- the phases ---------------------------------------------------------------------------------------

def token_channel(ctx: Context, window: Tree) -> tuple[torch.Tensor, Channel]:
    """Target lane: layers [0, exit_layer) over [last committed token, *window] and the early exit;
    a tree window under its tree mask, each node's log-prob read at its parent's row. Returns the
    hidden states [1, T, d] (kept for the suffix) and the :class:`Channel`, sent on to the draft's
    device. On the target's channel stage where it has one (chains): one replay."""
    run, s, cache = ctx.run, ctx.s, ctx.target_cache
    pair, target = run.pair, run.pair.target
    ids = [run.sequence[-1], *window.tokens]
    stages = staged_for(target, cache, ctx.channel_stage) if ctx.channel_stage else None
    if stages is not None:
        hidden, channel = stages.run(ctx.channel_stage.name, [ids])
        return hidden, channel.to(pair.draft.device)
    positions, mask = tree_rows(ctx, window)
    hidden = layers(target, to_device([ids], target.device), cache, LayerRange(0, s.exit_layer), positions, mask)  # [1, T, d]
    exit_logp = early_exit(pair, hidden, ctx.head, cache, s.exit_layer)  # [T, V]
    rows = to_device([p + 1 for p in window.parents], exit_logp.device, torch.long) if s.tree else None
    channel = channel_of(exit_logp, to_device(window.tokens, exit_logp.device, torch.long), s.kappa, rows)
    return hidden, channel.to(pair.draft.device)


def target_suffix(ctx: Context, prefix: tuple[torch.Tensor, Channel], window: Tree, each_layer=None) -> torch.Tensor:
    """Target lane: layers [exit_layer, N) and the LM head over the prefix's hidden states [1, T, d]
    -> final logits [T, V]. each_layer(): called between layers (executors.Threads.overlap)."""
    cache, hidden = ctx.target_cache, prefix[0]
    positions, mask = tree_rows(ctx, window)
    logits = layers(ctx.run.pair.target, hidden, cache, LayerRange(ctx.s.exit_layer, lm_head=True), positions, mask,
                    each_layer=each_layer)  # [1, T, V]
    cache.length += hidden.shape[1]
    return logits[0]


def tree_rows(ctx: Context, window: Tree) -> tuple:
    """What a target forward over [last committed token, *window] takes besides the ids: positions
    and tree mask with tree windows (option ``tree``), (None, None) with chains (a causal window)."""
    return tree_window(window, ctx.run.sequence, ctx.run.pair.target.device)[1:] if ctx.s.tree else (None, None)


def roll_out(ctx: Context, window: Tree, prefix: tuple[torch.Tensor, Channel], keep: bool) -> BranchTable:
    """Draft lane: the branches' rollouts (methods/mirror_rollouts.py), trees with option ``tree``;
    ``keep``: as in ``roll_out_on_stage``."""
    if ctx.s.tree:
        return roll_out_tree_window(ctx, window, prefix)
    return roll_out_chain_window(ctx, window.tokens, prefix, keep)


def target_picks(logits: torch.Tensor) -> torch.Tensor:
    """The target's argmax at each row of the final logits [T, V] -> [T]: at T = 0 all that verifying needs."""
    return logits.argmax(-1)


@dataclass
class Correction:
    """The rollout of the branch of a step's own outcome (``roll_out_correction``), on the draft lane:
    read only if the next step needs its window (after a miss without a copy)."""

    phase: object  # its executors.Phase, whose value is the one-branch BranchTable
    outcome: tuple[int, int]  # the step's verdict: (accepted, token)

    def window(self) -> list[int] | None:
        """The tokens after the outcome: the next window after a miss (None if the stage chose another
        branch, which its channel rules out)."""
        fixed = self.phase.result().read()
        return fixed[0].tokens if branch_hit(fixed, *self.outcome) == 0 else None


def correction_fits(ctx: Context, window: Tree) -> bool:
    """Whether the step rolls out its correction: the draft's stages hold the step's rollouts and the
    correction (made for queued steps at T = 0 over chains: ``make_context``)."""
    return all(rollout_stage_fits(ctx, window.tokens, spec) for spec in (ctx.rollout_stage, ctx.correction_stage))


# -- one step -----------------------------------------------------------------------------------------

def step(ctx: Context, window: Tree, q: torch.Tensor | None, index: int) -> Outcome:
    """One step (module docstring): the token channel, then at once the suffix on the target lane and
    the branches' rollouts on the draft lane, then the rendezvous. ``window``: a draft tree (a chain is
    a one-path tree); ``q``: its tokens' laws at T > 0 (chains only), None at T = 0."""
    run, ex, s = ctx.run, ctx.ex, ctx.s
    target, draft, T = run.target_lane, run.draft_lane, len(window.tokens) + 1
    base = ctx.draft_cache.length  # the rollouts (and the correction) start here
    correcting = correction_fits(ctx, window)  # decided before the rollouts move the cache
    prefix = ex.start(target, SpanKind.TARGET_PREFIX, token_channel, ctx, window, label=prefix_label(s, ctx.head, T),
                      step=index, tokens=T)
    B = min(s.budget, T * s.kappa)
    suffix, rolled = ex.overlap(
        work(target, SpanKind.TARGET_SUFFIX, target_suffix, ctx, prefix, window, label=suffix_label(run.pair, s, T),
             step=index, tokens=T),
        work(draft, SpanKind.DRAFT_ROLLOUT, roll_out, ctx, window, prefix, correcting, label=rollout_label(B, s),
             step=index, tokens=B * (s.tree or s.gamma)))
    verifying = dict(label=f"verify {'tree ' if s.tree else ''}+ match branch", step=index)
    if run.target_sampler.greedy:  # the picks, queued before the step's one wait
        picks = ex.start(target, SpanKind.RENDEZVOUS, target_picks, suffix, **verifying)
        fixing = ex.aside(work(draft, SpanKind.CORRECTION_ROLLOUT, roll_out_correction, ctx, window.tokens, picks, base,
                               label=f"correction: 1 branch x {s.gamma} tokens", step=index, tokens=s.gamma)) \
            if correcting else None
        ex.finish(prefix, suffix, rolled, picks)  # the step's one wait
        path, token = walk_tree_picks(window.tokens, window.parents, picks.result())
    else:  # a sampled chain
        ex.finish(prefix, suffix, rolled)
        verdict = ex.start(target, SpanKind.RENDEZVOUS, verify, window.tokens, q, suffix, run.target_sampler,
                           **verifying).result()
        path, token, fixing = list(range(verdict.accepted)), verdict.token, None
    branches = rolled.result().read()
    row = path[-1] + 1 if path else 0  # the window row after the accepted path
    return Outcome(path, token, branch_hit(branches, row, token), prefix.result()[1].top_ids.tolist(), branches,
                   Correction(fixing, (row, token)) if fixing is not None else None)


def target_ranges(pair, exit_layer: int, head=None) -> list:
    """The target's layer ranges: the prefill's full forward, the prefix, the early exit (through the
    trained ``head``, if any; on one device's target) and the suffix (with the LM head)."""
    exit_range = [] if pair.target.layer_devices else [LayerRange.read_at(exit_layer, exit_reader(pair, head))]
    return [FULL, *split_ranges(exit_layer), *exit_range]


def prefix_label(s: Settings, head, T: int) -> str:
    return f"layers 1-{s.exit_layer} + {'trained ' if head else ''}early exit, {T} tokens"


def suffix_label(pair, s: Settings, T: int) -> str:
    return f"layers {s.exit_layer + 1}-{pair.target.num_layers}, {T} tokens"


def rollout_label(B: int, s: Settings) -> str:
    if s.tree:
        return f"{B} branches x tree of {s.tree}, depth {s.gamma}"
    return f"{B} branches x {s.gamma} tokens"


# -- the decode loop ----------------------------------------------------------------------------------

def make_context(run, s: Settings) -> Context:
    """The step's context: the executor (executors.executor_for; steps queue only at T = 0, token by
    token, on one device's target), the exit head (the pair's trained head for the exit layer where
    it has one, else the logit lens) and the stages a greedy chain step runs on where the caches have
    stages (the token channel, the rollouts, and for queued steps the correction)."""
    pair, greedy = run.pair, run.draft_sampler.greedy
    plain_lanes = not s.streams and not pair.target.layer_devices
    ex = executor_for(run, possible=greedy and plain_lanes)
    head = available_exit_head(pair, s.exit_layer)
    ctx = Context(run, ex, None, None, s, head)
    if greedy and plain_lanes and not s.tree:
        rows = max(s.gamma, s.lookup) + 1  # the most a window has, with the token before it
        vocab, B = pair.target.args.vocab_size, min(s.budget, rows * s.kappa)
        ctx.channel_stage = TokenChannel(s.exit_layer, s.kappa, exit_reader(pair, head), vocab)
        ctx.rollout_stage = Rollouts(B, s.gamma, s.kappa, rows, vocab) if B < MAX_WIDTH else None
        # Only a queued step rolls out its correction (the executor's ``aside``): its stage is made there only.
        ctx.correction_stage = Rollouts(1, s.gamma, 1, rows, vocab) if ctx.rollout_stage and ex.queued else None
    return ctx


def decode(run, gamma: int, kappa: int, exit_layer: int, branch_budget: int, streams: int = 0, lookup: int = 0,
           tree: int = 0):
    pair = run.pair
    s = Settings(gamma, kappa, exit_layer or default_exit_layer(pair.target.num_layers), branch_budget, streams,
                 lookup, tree)
    ctx = make_context(run, s)
    fresh = make_drafter(streams, tree=tree, branching=s.branching)  # a fresh window after a miss
    rollout_slots = s.budget * (1 + s.branching * (gamma - 1)) + max(tree, lookup) if tree else s.budget * gamma + lookup
    stages = [stage for stage in (ctx.rollout_stage, ctx.correction_stage) if stage]
    channel_stages = [ctx.channel_stage] if ctx.channel_stage else []
    ctx.target_cache, ctx.draft_cache, first = prefill_pair(
        run, extra_draft_slots=rollout_slots,
        target_ranges=[*target_ranges(pair, s.exit_layer, ctx.head), *channel_stages],
        draft_ranges=[*fresh.layer_ranges(pair, gamma, run.draft_sampler.greedy), *stages])
    yield first
    target_cache, draft_cache = ctx.target_cache, ctx.draft_cache
    fresh_label = f"fallback draft tree of {tree} tokens, depth {gamma}" if tree else f"fallback draft {gamma} tokens"
    window, q = None, None  # the next window (a Tree: a chain is a one-path tree) and its laws at T > 0
    correction = None  # the last step's correction rollout
    while not run.done:
        index = run.next_step
        n = len(run.sequence)
        draft_cache.rollback(min(draft_cache.length, n - 1))
        copy = copy_from_context(run.sequence, lookup) if window is None and run.draft_sampler.greedy else []
        copied = bool(copy)
        if copied:  # the last step missed, and the context holds a continuation: copy it, no draft work
            window, q = graft(Tree([], [], [], []), copy), None
        corrected = correction.window() if window is None and correction is not None else None
        from_correction = corrected is not None
        if from_correction:  # the last step missed, and the draft lane rolled out from its outcome
            window, q = chain(corrected), None
        fallback = window is None
        if fallback:  # the first step, or the last one missed: draft afresh, on the critical path
            proposal = ctx.ex.start(run.draft_lane, SpanKind.FALLBACK_DRAFT, fresh.propose, run, draft_cache, gamma,
                                    label=fresh_label, step=index, tokens=gamma).result()
            window, q = (proposal.tree if tree else chain(proposal.tokens)), proposal.q
            draft_cache.rollback(min(draft_cache.length, n - 1))
        last = correction
        out = step(ctx, window, q, index)
        if last is not None:  # the last step's correction rollout, done before this step's rollouts
            last.phase.result()
        correction = out.correction
        if tree:  # the forwards wrote the window's nodes after the sequence: keep the accepted path
            keep_path(target_cache, out.path, n)
            keep_path(draft_cache, out.path, n)
        else:
            target_cache.rollback(n + len(out.path))
            draft_cache.rollback(min(draft_cache.length, n + len(out.path)))
        tokens, origins = window.committed(out.path, out.token)
        met = Rendezvous(exit_candidates=out.top_ids, branches=[(b.accepted, b.root, b.tokens) for b in out.branches],
                         branch_used=out.hit, fallback=fallback, copied=copied, corrected=from_correction,
                         branch_parents=[b.tree.parents for b in out.branches] if tree else [])
        committed = run.commit(Step(index, tokens, origins, proposed=window.tokens, accepted=len(out.path),
                                    tree=window.record(out.path) if tree else None, rendezvous=met))
        if run.done and correction is not None:  # the engine asks for no step after the last: record it now
            correction.phase.result()
        yield committed
        if out.hit is None:
            window, q = None, None
        else:
            used = out.branches[out.hit]
            window = used.tree if tree else chain(used.tokens)
            q = torch.stack(used.q) if used.q else None
