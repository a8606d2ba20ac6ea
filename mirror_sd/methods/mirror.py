"""Mirror Speculative Decoding (Bhendawade et al., 2025): drafting leaves the critical path.

One step, with the window W = [last committed token, d1 .. d_gamma]:

1. Target lane, layers [0, exit_layer) over W, then the target's own final norm + LM head on those
   hidden states (an early exit; only the rows of the draft's vocabulary when it has a reduced
   one: ``exit_reader``; with a trained exit head (``exit_head``; by default wherever the target has
   one) the hidden states first go through it, models/exit_head.py): the top-kappa tokens and
   log-probs at every window position.
   This token channel is all that crosses to the draft lane (ids and log-probs, O(gamma * kappa)).
2. At the same time, on two lanes:
   - target lane: layers [exit_layer, N) over W -> final logits -> verification (on a CPU whose
     cores the lanes split, it takes the draft lane's cores too once the rollouts are done);
   - draft lane: branch rollouts. Branch (r, v) assumes the target accepts d1..dr and then emits
     v (an early-exit candidate at position r). The draft rolls out gamma tokens after each of the
     ``branch_budget`` most likely branches, all branches batched in one tree per forward: gamma
     forwards token by token, or with ``streams=1`` a single forward, where the draft's main
     stream gives each branch's first token and its speculative streams the rest.
3. Rendezvous: verification gives (accepted A, token c). If branch (A, c) was rolled out, its
   continuation is the next window, ready with no draft time on the critical path (a hit).
   Otherwise the next step starts with a fresh draft on the draft lane (a miss: draft time exposed),
   unless (temperature 0, ``lookup`` > 0) the context holds a continuation to copy (drafting/lookup.py):
   then up to ``lookup`` copied tokens are the next window, with no draft time at all. In a queued
   step (T = 0, on stages) the draft stream also rolls out one more branch, from the target's own
   token at the first rejection, as soon as the target's picks are made (``correction``): a miss
   finds its next window there, made while the host read the verdict, not drafted after it
   (methods/mirror_queued.py).
4. Commit d1..dA + c and roll both KV caches back to the committed length.

With option ``tree`` > 0 (T = 0) the window and every branch's rollout are draft trees instead of
chains, the branches hanging from any row of the window: methods/mirror_tree.py.

All-accepted case (left open by the paper): c is then the bonus token at position gamma, drawn
from the final distribution there; branches (gamma, v) use the early-exit candidates at that
position, so a fully accepted window can hit too.

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

from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

import torch

from .. import branches as branch_rule
from ..devices import to_device
from ..drafting import make_drafter
from ..drafting.lookup import copy_from_context
from ..drafting.tree import Tree, graft, keep_path
from ..models.exit_head import EarlyExit, available_exit_head, exit_head_for
from ..models.forwards import FULL, layers
from ..models.streams import draft_streams, split_forward, split_ranges
from ..sampling import to_target_vocab
from ..trace import Rendezvous, Step
from . import mirror_queued, mirror_tree
from .prefill import prefill_pair
from .verify import verify


@dataclass
class Branch:
    accepted: int  # r: window tokens accepted before the branch point
    root: int  # v: the token the target emits at position r in this hypothesis
    score: float  # early-exit log-probability of this hypothesis
    tokens: list[int] = field(default_factory=list)  # the draft's continuation after root (a tree's nodes)
    q: list[torch.Tensor] = field(default_factory=list)  # its distributions [V] (temperature > 0)
    tree: Tree | None = None  # the continuation as a tree hanging from root (tree windows; None: a chain)
    valid: bool = True  # False: a skipped candidate (an acceptance) rolled out only to keep B rows


def default_exit_layer(num_layers: int) -> int:
    """Three quarters of the way up (22 of SmolLM2-135M's 30 layers): a later exit sees more of the
    target (more hits) and still leaves the draft a suffix to hide under (measured:
    docs/experiments/mirror.md#additions-options-and-sweeps)."""
    return max(1, num_layers * 3 // 4)


def exit_reader(pair, head=None, draft_rows: bool = True) -> EarlyExit:
    """The module that reads the exit layer for the token channel (models/exit_head.py: EarlyExit),
    made once per pair and trained ``head`` (None: the logit lens).

    With a reduced-vocabulary draft (a ``vocab_map``) and ``draft_rows``, it computes only the
    target's LM-head rows of the draft's tokens: a fraction of the work (8,192 of 49,152 rows for
    the shipped draft), while the early-exit candidates it loses are rare tokens (measured:
    docs/experiments/mirror.md#with-copied-windows-and-the-early-exit-over-the-drafts-rows).
    """
    target, vocab_map = pair.target, pair.draft.vocab_map if draft_rows else None
    key = (head, vocab_map is not None)
    if key not in pair.early_exits:
        weight = target.lm_head.weight.detach()
        if vocab_map is not None and pair.early_exit_rows is None:  # [rows, d]: the rows of the draft's tokens
            pair.early_exit_rows = weight[vocab_map.to(target.device)].clone()
        rows = weight if vocab_map is None else pair.early_exit_rows
        pair.early_exits[key] = EarlyExit(target, rows, head, vocab_map)
    return pair.early_exits[key]


def on_target_vocab(pair, logp: torch.Tensor, reader: EarlyExit) -> torch.Tensor:
    """Log-probs over the reader's rows [T, rows] laid out on the target's vocabulary [T, V] (-inf
    for tokens outside the draft's vocabulary)."""
    return to_target_vocab(logp, reader.vocab_map, pair.target.args.vocab_size)


def early_exit(pair, hidden: torch.Tensor) -> torch.Tensor:
    """The logit lens on hidden states [1, T, d] (already through a trained head, if any): the target's
    final norm and LM head (the draft's rows of it, ``exit_reader``): log-probs [T, V]."""
    if pair.target.layer_devices:
        return full_head_exit(pair, hidden)
    reader = exit_reader(pair)
    return on_target_vocab(pair, reader(hidden)[0], reader)


def full_head_exit(pair, hidden: torch.Tensor) -> torch.Tensor:
    """The early exit over the target's whole LM head: log-probs [T, V] of hidden states [1, T, d]."""
    return torch.log_softmax(pair.target.head(hidden)[0], dim=-1)


def choose_exit_head(pair, exit_layer: int, exit_head: int):
    """The trained head (``exit_head`` 1: required; -1: if the pair has one for ``exit_layer``), or None
    for the logit lens (0, or -1 without a head). The target-prefix span's label says which ran."""
    if exit_head == 1:
        return exit_head_for(pair, exit_layer)
    return available_exit_head(pair, exit_layer) if exit_head == -1 else None


def token_channel(run, cache, window: list[int], exit_layer: int, kappa: int, head=None, on_host: bool = True,
                  positions=None, mask=None, parents: list[int] | None = None):
    """Target lane: layers [0, exit_layer) over the window and the early exit, through the trained
    exit head ``head`` first when one is given (its cost is the target prefix's). A tree window
    (methods/mirror_tree.py) brings its positions and tree mask (``tree_window``'s) and its nodes'
    parents; None: a causal chain.

    Returns hidden [1, T, d] (kept on the target lane for the suffix), and what crosses to the
    draft lane: top-kappa ids and log-probs [T, kappa], and the early-exit log-prob of each draft
    token at the row before it (a tree node's: at its parent's row) [T - 1]; read to the host, or
    (``on_host=False``, the queued step) left on the device, unread.
    """
    pair, target = run.pair, run.pair.target
    hidden = layers(target, to_device([window], target.device), cache, 0, exit_layer, positions, mask)  # [1, T, d]
    if target.layer_devices:  # sharded: the plain forwards, the whole LM head
        exit_logp = full_head_exit(pair, hidden if head is None else head(hidden))  # [T, V]
    else:  # one stage of its own on a stage cache
        reader = exit_reader(pair, head)
        exit_logp = on_target_vocab(pair, layers(target, hidden, cache, exit_layer, exit_layer, head=reader)[0], reader)
    top = exit_logp.topk(kappa, dim=-1)
    drafted = to_device(window[1:], exit_logp.device, torch.long)
    rows = to_device([p + 1 for p in parents], exit_logp.device, torch.long) if parents is not None else None
    before = exit_logp[:-1] if rows is None else exit_logp[rows]  # each node's parent row
    window_logp = before.gather(-1, drafted[:, None])[:, 0]
    if not on_host:
        return hidden, top.indices, top.values, window_logp
    return hidden, top.indices.cpu(), top.values.cpu(), window_logp.cpu()


def target_ranges(pair, exit_layer: int, head=None) -> list:
    """The target's layer ranges: the prefill's full forward, the prefix, the early exit (through the
    trained ``head``, if any) and the suffix (with the LM head)."""
    exit_range = [] if pair.target.layer_devices else [(exit_layer, exit_layer, exit_reader(pair, head))]
    return [FULL, *split_ranges(exit_layer), *exit_range]


def target_suffix(run, cache, channel, exit_layer: int, rollouts=None, positions=None, mask=None) -> torch.Tensor:
    """Target lane: layers [exit_layer, N) over the same window -> final logits [T, V].

    channel: the token channel's Future (done: it ran before on this lane), whose hidden states
    [1, T, d] the suffix goes on from. rollouts: a Future done once the draft lane's rollouts are;
    then the rest of the suffix takes the cores the lanes shared (``Lane.widen_when_done``), checked
    before each layer and before the LM head (once, before the whole suffix, on stages).
    positions, mask: a tree window's, as the prefix saw it (None: causal).
    """
    return suffix_logits(run, cache, channel.result()[0], exit_layer, rollouts, positions, mask)


def suffix_logits(run, cache, hidden, exit_layer: int, rollouts=None, positions=None, mask=None) -> torch.Tensor:
    """Layers [exit_layer, N) and the LM head over the prefix's hidden states [1, T, d] -> [T, V]."""
    target, lane = run.pair.target, run.target_lane
    logits = layers(target, hidden, cache, exit_layer, None, positions, mask, head=True,
                    each_layer=lambda: lane.widen_when_done(rollouts))  # [1, T, V]
    cache.length += hidden.shape[1]
    return logits[0]


def choose_branches(draft: list[int], top_ids, top_logp, window_logp, budget: int,
                    parents: list[int] | None = None) -> list[Branch]:
    """The rows the draft rolls out, as branches, best first: the branch rule of mirror_sd/branches.py
    (the one the queued step and the rollout stage run), read to the host once. Where fewer than
    ``min(budget, T * kappa)`` candidates are valid, the skipped ones (acceptances) follow with
    ``valid`` False: every path rolls out the same rows, and only valid branches are ever used."""
    r, roots, scores, valid = branch_rule.choose_branches(draft, top_ids, top_logp, window_logp, budget, parents)
    rows = torch.stack([r, roots, valid.long()], dim=1).tolist()  # [B, 3], one read
    return [Branch(row[0], row[1], score, valid=bool(row[2])) for row, score in zip(rows, scores.tolist())]


def valid_branches(branches: list[Branch]) -> list[Branch]:
    """The branches that are branch points (not acceptances): the ones a step records and may hit."""
    return [b for b in branches if b.valid]


def branch_tensors(branches: list[Branch], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, roots) [B] of host-chosen branches, on ``device``."""
    rows = to_device([[b.accepted for b in branches], [b.root for b in branches]], device, torch.long)
    return rows[0], rows[1]


def tree_layout(run, cache, draft: list[int], r: torch.Tensor, roots: torch.Tensor):
    """The first rollout forward: ids [T], positions [T] and mask [T, base + T] of the committed tokens
    the draft has not seen, the window d1..d_gamma (one causal chain) and every branch root; r and
    roots [B] are the branches' accepted prefixes and roots, on the draft's device, and so is all
    this (laid out there, so the host need not know the branches).

    Also returns ``may_see(owner, depth)``: the [B, base + slots] mask of each branch's newest row,
    given the owner (-1 chain, else branch) and chain depth of every new slot so far. A branch sees
    the committed prefix, the window up to its branch point and its own tokens, nothing else.
    """
    n, base = len(run.sequence), cache.length  # the last committed token is at position n - 1
    chain = run.sequence[base:] + draft  # pending committed tokens + window: one causal chain
    B, C, dev = len(r), len(chain), r.device
    at = dict(dtype=torch.long, device=dev)
    branch = torch.arange(B, **at)
    owner = torch.cat([torch.full((C,), -1, **at), branch])  # per new slot: -1 chain, else branch
    depth = torch.cat([torch.zeros(C - len(draft), **at), torch.arange(1, len(draft) + 1, **at), torch.zeros(B, **at)])

    def may_see(owner, depth):
        sees = ((owner == -1) & (depth <= r[:, None])) | (owner == branch[:, None])
        return torch.cat([torch.ones(B, base, dtype=torch.bool, device=dev), sees], dim=-1)

    chain_rows = torch.cat([torch.ones(C, base, dtype=torch.bool, device=dev),
                            torch.ones(C, C, dtype=torch.bool, device=dev).tril(),
                            torch.zeros(C, B, dtype=torch.bool, device=dev)], dim=-1)
    mask = torch.cat([chain_rows, may_see(owner, depth)])  # [T, base + T]
    positions = torch.cat([torch.arange(n - C + len(draft), n + len(draft), **at), n + r])
    ids = torch.cat([to_device(chain, dev, torch.long), roots])
    return ids, positions, mask, owner, depth, may_see


def rollout(run, cache, draft: list[int], branches: list[Branch], gamma: int) -> list[Branch]:
    """Draft lane: gamma draft tokens after every branch, all branches in one tree per forward
    (``roll_out_tree``), into the branches."""
    r, roots = branch_tensors(branches, run.pair.draft.device)
    picks = roll_out_tree(run, cache, draft, r, roots, gamma, branches)
    if picks is not None:  # one read of every branch's tokens: the host never waits for the device between forwards
        for b, tokens in zip(branches, picks.tolist()):
            b.tokens = tokens
    return branches


def roll_out_tree(run, cache, draft: list[int], r: torch.Tensor, roots: torch.Tensor, gamma: int,
                  branches: list[Branch] | None = None) -> torch.Tensor | None:
    """gamma draft tokens after every branch (r, roots [B] on the draft's device), all branches in one
    tree per forward: forward 1 lays out the tree (``tree_layout``), forward k feeds each branch's
    newest token. At T = 0 returns the picks [B, gamma], left on the device; at T > 0 draws into
    ``branches`` (tokens and their distributions) and returns None."""
    model, sampler = run.pair.draft, run.draft_sampler
    n, B, dev = len(run.sequence), len(r), r.device
    ids, positions, mask, owner, depth, may_see = tree_layout(run, cache, draft, r, roots)
    picks = []  # T = 0: each forward's [B] picks
    for k in range(gamma):
        logits = _forward_rows(model, cache, ids, positions, mask, rows=B)  # [B, V_draft]
        if sampler.greedy:
            picks.append(run.draft_picks(logits))  # [B]
        else:  # every branch's token drawn from its own row, in one call
            q = sampler.probs(run.as_target_vocab(logits))  # [B, V]
            for b, q_b, token in zip(branches, q, sampler.sample_rows(q)):
                b.q.append(q_b)
                b.tokens.append(token)
        if k == gamma - 1:
            break
        ids = picks[-1] if sampler.greedy else to_device([b.tokens[-1] for b in branches], dev, torch.long)
        positions = n + r + k + 1  # [B]
        owner = torch.cat([owner, torch.arange(B, device=dev)])
        depth = torch.cat([depth, torch.zeros(B, dtype=torch.long, device=dev)])
        mask = may_see(owner, depth)
    return torch.stack(picks, dim=1) if picks else None


def rollout_streamed(run, cache, draft: list[int], branches: list[Branch], gamma: int) -> list[Branch]:
    """Like ``rollout``, in one draft forward: the draft's main stream gives each branch's first
    token after its root, and its speculative streams at the root the other gamma - 1."""
    model, sampler = run.pair.draft, run.draft_sampler
    streams = draft_streams(run.pair)
    B, dev = len(branches), model.device
    ids, positions, mask, *_ = tree_layout(run, cache, draft, *branch_tensors(branches, dev))
    main, h0 = split_forward(model, ids[None], cache, streams.first_layer, positions=positions[None], tree_mask=mask)
    cache.length += len(ids)
    roots = torch.arange(cache.length - B, cache.length, device=dev)[None]  # [1, B]: the roots' cache slots
    ahead = streams(model, cache, h0[:, -B:], roots, positions=positions[None, -B:],
                    seen=mask[None, -B:])[0, :, :gamma - 1]  # [B, gamma - 1, V_d]
    logits = run.as_target_vocab(torch.cat([main[0, -B:, None], ahead], dim=1))  # [B, gamma, V]
    for b, rows in zip(branches, logits):
        b.tokens, q = sampler.draw(rows)
        b.q = list(q) if q is not None else []
    return branches


def _forward_rows(model, cache, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rows: int) -> torch.Tensor:
    """Write ids [T] at positions [T] (on the model's device) at the cache's next slots under ``mask``;
    logits of the last ``rows`` tokens only."""
    logits = layers(model, ids[None], cache, 0, None, positions[None], mask, head=True, last=rows)  # [1, rows, V_draft]
    cache.length += len(ids)
    return logits[0]


def rendezvous(draft, q, logits, sampler, branches: list[Branch]):
    """Verify the window against the final logits and look for the branch the outcome picked."""
    verdict = verify(draft, q, logits, sampler)
    return verdict, branch_hit(branches, verdict.accepted, verdict.token)


def branch_hit(branches: list[Branch], accepted: int, token: int) -> int | None:
    """The branch rolled out after ``accepted`` window tokens and ``token``, the outcome (None: a miss)."""
    return next((i for i, b in enumerate(branches) if (b.accepted, b.root) == (accepted, token)), None)


def decode(run, gamma: int, kappa: int, exit_layer: int, branch_budget: int, streams: int = 0, lookup: int = 0,
           exit_head: int = -1, queued: int = -1, tree: int = 0, branching: int = 4, correction: int = 1):
    pair = run.pair
    greedy = run.draft_sampler.greedy
    trees = bool(tree)  # tree windows (methods/mirror_tree.py); temperature 0 only (the engine refuses them at T > 0)
    # a fresh window after a miss: token by token (a tree, with trees), or the draft's streams
    fresh = make_drafter(streams, tree=tree, branching=branching)
    roll_out = rollout_streamed if streams else rollout
    queues = mirror_queued.queues_steps(run, streams, queued)
    exit_layer = exit_layer or default_exit_layer(pair.target.num_layers)
    head = choose_exit_head(pair, exit_layer, exit_head)  # None: the logit lens
    channel, rollouts, corrections = (None,) * 3 if not queues or trees else \
        mirror_queued.step_stages(pair, exit_layer, kappa, head, gamma, branch_budget, lookup, correction)
    step_on = partial(mirror_queued.queued_step, channel_stage=channel, rollouts=rollouts, corrections=corrections) \
        if queues else host_step
    rollout_slots = branch_budget * (1 + branching * (gamma - 1)) + max(tree, lookup) if trees \
        else branch_budget * gamma + lookup
    target_cache, draft_cache, first = prefill_pair(run, extra_draft_slots=rollout_slots,
                                                    target_ranges=[*target_ranges(pair, exit_layer, head),
                                                                   *([channel] if channel else [])],
                                                    draft_ranges=[*fresh.layer_ranges(pair, gamma, greedy),
                                                                  *([rollouts] if rollouts else []),
                                                                  *([corrections] if corrections else [])])
    yield first
    fresh_label = f"fallback draft tree of {tree} tokens, depth {gamma}" if trees else f"fallback draft {gamma} tokens"
    window, q = None, None  # the window: draft tokens, or a Tree with trees
    correction = None  # the last step's correction rollout (queued steps)
    while not run.done:
        step = run.next_step
        n = len(run.sequence)
        draft_cache.rollback(min(draft_cache.length, n - 1))
        copy = copy_from_context(run.sequence, lookup) if window is None and run.draft_sampler.greedy else []
        copied = bool(copy)
        if copied:  # the last step missed, and the context holds a continuation: copy it, no draft work
            window, q = (graft(Tree([], [], [], []), copy) if trees else copy), None  # trees: a one-branch tree
        corrected = correction.window() if window is None and correction is not None else None
        from_correction = corrected is not None
        if from_correction:  # the last step missed, and the draft stream rolled out from its outcome
            window, q = corrected, None
        fallback = window is None
        if fallback:  # the first step, or the last one missed: draft afresh, on the critical path
            proposal, drafted = run.draft_lane.queue("fallback-draft", fresh.propose, run, draft_cache, gamma,
                                                     label=fresh_label, step=step, tokens=gamma)
            drafted.record()  # waits for the draft's stream: the laws q (T > 0) may still be in the making
            window, q = (proposal.tree if trees else proposal.tokens), proposal.q
            draft_cache.rollback(min(draft_cache.length, n - 1))
        if trees:
            tree_step = mirror_tree.queued_tree_step if queues else mirror_tree.tree_step
            path, token, hit, top_ids, branches = tree_step(
                run, target_cache, draft_cache, window, step, exit_layer, kappa, head, branch_budget, gamma, branching,
                tree)
            correction = None  # tree steps roll out no correction
            keep_path(target_cache, path, n)
            keep_path(draft_cache, path, n)  # the rollouts wrote the window's nodes after the sequence
            tokens, origins = window.committed(path, token)
            accepted, proposed, drafted = len(path), window.tokens, window.record(path)
        else:
            last = correction
            verdict, hit, top_ids, branches, correction = step_on(
                run, target_cache, draft_cache, window, q, step, exit_layer, kappa, head, branch_budget, gamma,
                roll_out)
            if last is not None:  # the last step's correction rollout, done before this step's rollouts
                last.work.record()
            tokens, origins = verdict.committed(window)
            accepted, proposed, drafted = verdict.accepted, window, None
            target_cache.rollback(n + accepted)
            draft_cache.rollback(min(draft_cache.length, n + accepted))
        met = Rendezvous(exit_candidates=top_ids, branches=[(b.accepted, b.root, b.tokens) for b in branches],
                         branch_used=hit, fallback=fallback, copied=copied, corrected=from_correction,
                         branch_parents=[b.tree.parents for b in branches] if trees else [])
        committed = run.commit(Step(step, tokens, origins, proposed=proposed, accepted=accepted, tree=drafted,
                                    rendezvous=met))
        if run.done and correction is not None:  # the engine asks for no step after the last: record it now
            correction.work.record()
        yield committed
        if hit is None:
            window, q = None, None
        else:
            window = branches[hit].tree if trees else branches[hit].tokens
            q = torch.stack(branches[hit].q) if branches[hit].q else None


def host_step(run, target_cache, draft_cache, window, q, step, exit_layer, kappa, head, budget, gamma, roll_out):
    """One step on the lanes' threads: the target lane's prefix and early exit, read by the host,
    which chooses the branches and hands them to the draft lane, while the target lane goes on
    with the suffix. Returns the verdict, the branch it hit (or None), the early-exit candidates
    [T][kappa], the branches, and no correction rollout (``mirror_queued.queued_step``'s last: None)."""
    pair = run.pair
    T = len(window) + 1
    channel = run.target_lane.submit(
        "target-prefix", token_channel, run, target_cache, [run.sequence[-1], *window], exit_layer, kappa, head,
        label=prefix_label(exit_layer, head, T), step=step, tokens=T,
        alone=True)  # the draft lane waits for the token channel: the prefix may use its cores too
    # The suffix goes in the target lane's queue now, so it starts as soon as the token channel is
    # done, while this thread reads the channel and lays out the rollouts.
    rollouts_done = Future()  # set once the rollouts (not submitted yet) are done: the suffix widens then
    suffix = run.target_lane.submit("target-suffix", target_suffix, run, target_cache, channel, exit_layer,
                                    rollouts_done, label=suffix_label(pair, exit_layer, T), step=step, tokens=T)
    _, top_ids, top_logp, window_logp = channel.result()
    rows = choose_branches(window, top_ids, top_logp, window_logp, budget)
    rolled = run.draft_lane.submit("draft-rollout", roll_out, run, draft_cache, window, rows, gamma,
                                   label=f"{len(rows)} branches x {gamma} tokens", step=step,
                                   tokens=len(rows) * gamma)
    rolled.add_done_callback(lambda _: rollouts_done.set_result(None))
    logits = suffix.result()
    branches = valid_branches(rolled.result())
    verdict, hit = run.target_lane.run("rendezvous", rendezvous, window, q, logits, run.target_sampler, branches,
                                       label="verify + match branch", step=step)
    return verdict, hit, top_ids.tolist(), branches, None


def prefix_label(exit_layer: int, head, T: int) -> str:
    return f"layers 1-{exit_layer} + {'trained ' if head else ''}early exit, {T} tokens"


def suffix_label(pair, exit_layer: int, T: int) -> str:
    return f"layers {exit_layer + 1}-{pair.target.num_layers}, {T} tokens"
