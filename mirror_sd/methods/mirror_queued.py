"""Mirror-SD steps queued on the lanes' CUDA streams from one thread, which waits for the GPU once a step.

``mirror.host_step`` runs a step on the lanes' threads and the host reads the token channel before
it lays out the rollouts. Where both lanes are CUDA devices (``queues_steps``; T = 0, chain or tree
windows, one device's target), a step is instead queued whole, and nothing in it waits for the host:

* target stream: the prefix and early exit (the token channel), sent on to the draft's device,
  then the suffix and the target's picks (``target_picks``: at T = 0 all that verifying needs);
* draft stream: waits for the token channel on a CUDA event, then chooses the branches on the
  device (mirror_sd/branches.py, the rule the host's step runs too) and rolls them out; on stages the channel is one stage
  (models/channel.py) and the choice with the rollouts another (models/rollout.py);
* then, with ``correction``, the draft stream waits for the picks and rolls out the branch of the
  step's own outcome (``roll_out_correction``): a miss's next window, made while the host reads
  the verdict, not drafted after it (:class:`Correction`, read only if the next step needs it).

The host waits once (``wait_and_record``), reads the picks and the branches, and verifies and
matches them itself (``verify.verdict_of_picks``, ``mirror.branch_hit``). On CPU lanes the same
work runs in turn, each part on its lane's worker.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..branches import choose_branches
from ..drafting.tree import Tree, tree_window
from ..models.channel import TokenChannel, pack, unpack
from ..models.forwards import staged, staged_for
from ..models.rollout import Rollouts
from ..models.stages import MAX_WIDTH
from . import mirror
from .verify import verdict_of_picks


def step_stages(pair, exit_layer: int, kappa: int, head, gamma: int, budget: int, lookup: int, correction: int):
    """A queued chain step's stages, for the caches to make: the token channel on the target (queued
    steps run on one device's target: ``queues_steps``), the branch choice with the rollouts on the
    draft (None where the branches outgrow the widest stage), and with ``correction`` the one-branch
    correction rollout."""
    rows = max(gamma, lookup) + 1  # the most a window has, with the token before it
    vocab = pair.target.args.vocab_size
    channel = TokenChannel(exit_layer, kappa, mirror.exit_reader(pair, head), vocab)
    branches = min(budget, rows * kappa)
    rollouts = Rollouts(branches, gamma, kappa, rows, vocab) if branches < MAX_WIDTH else None
    corrections = Rollouts(1, gamma, 1, rows, vocab) if rollouts and correction else None
    return channel, rollouts, corrections


@dataclass
class Correction:
    """A queued step's correction rollout (``roll_out_correction``), queued on the draft's stream: read
    only if the next step needs its window; ``work.record()`` puts its span in the trace once it is done."""
    table: torch.Tensor  # [1, 4 + gamma], on the draft's device
    work: object  # its ``devices.Queued``
    outcome: tuple[int, int]  # the step's verdict: (accepted, token)

    def window(self) -> list[int] | None:
        """The rollout's tokens after the outcome: the next window after a miss (None if the stage
        chose another branch, which its channel rules out)."""
        self.work.record()  # waits for the rollout
        fixed = branches_of(self.table)
        return fixed[0].tokens if mirror.branch_hit(fixed, *self.outcome) == 0 else None


def queues_steps(run, streams: int, queued: int) -> bool:
    """Whether steps are queued on the lanes' streams (``queued_step``; over tree windows,
    ``mirror_tree.queued_tree_step``): always with ``queued`` 1, never with 0, and with -1 where
    both lanes are CUDA devices; at T = 0, token by token, on one device's target."""
    pair = run.pair
    possible = run.draft_sampler.greedy and not streams and not pair.target.layer_devices
    cuda = pair.target_lane.device.type == "cuda" and pair.draft_lane.device.type == "cuda"
    return possible and (queued == 1 or (queued == -1 and cuda))


def target_picks(logits: torch.Tensor) -> torch.Tensor:
    """The target's argmax at each row of the final logits [T, V] -> [T]: at T = 0 all that verifying
    needs of the device. A queued step queues it right after the suffix, so it runs while the
    rollouts may still run and the step's one wait reads it with them."""
    return logits.argmax(-1)


def queued_step(run, target_cache, draft_cache, window, q, step, exit_layer, kappa, head, budget, gamma, roll_out=None,
                channel_stage: TokenChannel | None = None, rollouts: Rollouts | None = None,
                corrections: Rollouts | None = None):
    """One step queued on the lanes' streams from this thread, which waits for the GPU once, at the
    rendezvous: the target stream runs the prefix, the early exit, the suffix and the target's picks
    (``target_picks``) back to back; the draft stream waits for the token channel on a CUDA event
    (``Lane.queue``'s ``after``), then chooses the branches and rolls them out, all on the device.
    The host then reads the picks and the branches, and verifies and matches them itself. On stages
    the token channel is one stage (``channel_stage``, models/channel.py) and the draft's work
    another (``rollouts``, models/rollout.py); else ``mirror.token_channel``, ``branches.choose_branches``
    and ``mirror.roll_out_tree``.
    With ``corrections`` (a one-branch stage, on the rollouts' stage path) the draft stream then rolls
    out the branch of the target's own outcome, its picks' first rejection (``roll_out_correction``),
    which the host reads only if the next step needs it: after a miss without a copy.
    T = 0, token by token (``queues_steps``; so ``roll_out`` is not needed). On CPU lanes the same
    work runs in turn, each part on its lane's worker. Returns what ``host_step`` does, the last the
    correction rollout (a :class:`Correction`; None without one)."""
    channel_there, channel, logits, suffix = queue_target(run, target_cache, window, step, exit_layer, kappa, head,
                                                          channel_stage=channel_stage)
    packed = isinstance(channel_there, torch.Tensor)  # from the channel's stage (``models.channel.pack``)
    B = min(budget, (len(window) + 1) * kappa)
    base = draft_cache.length  # the rollouts' and the correction's chain starts here
    on_stage = rollouts_fit(run, draft_cache, window, rollouts)
    correcting = on_stage and rollouts_fit(run, draft_cache, window, corrections)

    def choose_and_roll_out():  # the branches [B', 4 + gamma]: r, root, valid, score, tokens (``RolloutStage.run``)
        if on_stage:
            table = roll_out_on_stage(run, draft_cache, window, channel_there if packed else pack(*channel_there),
                                      rollouts)
            return table.clone() if correcting else table  # the correction's stage may reuse the memory
        top = unpack(channel_there, kappa) if packed else channel_there
        r, roots, scores, valid = choose_branches(window, *top, budget)
        picks = mirror.roll_out_tree(run, draft_cache, window, r, roots, gamma)  # [B, gamma]
        columns = [torch.stack([r, roots, valid.long()], dim=1).double(), scores[:, None], picks.double()]
        return torch.cat(columns, dim=1)

    table, rolled = run.draft_lane.queue("draft-rollout", choose_and_roll_out, after=channel.done,
                                         label=f"{B} branches x {gamma} tokens", step=step, tokens=B * gamma)
    picks, verified = run.target_lane.queue("rendezvous", target_picks, logits, label="verify + match branch",
                                            step=step)
    fixes, fixing = run.draft_lane.queue(
        "correction-rollout", roll_out_correction, run, draft_cache, window, picks, base, corrections,
        after=verified.done, label=f"correction: 1 branch x {gamma} tokens", step=step, tokens=gamma) \
        if correcting else (None, None)
    wait_and_record(channel, suffix, rolled, verified)  # the step's one wait
    branches = branches_of(table)
    verdict = verdict_of_picks(window, picks.tolist())
    hit = mirror.branch_hit(branches, verdict.accepted, verdict.token)
    top_ids = [[int(v) for v in row[:kappa]] for row in channel_there.tolist()] if packed else channel_there[0].tolist()
    correction = Correction(fixes, fixing, (verdict.accepted, verdict.token)) if correcting else None
    return verdict, hit, top_ids, branches, correction


def branches_of(table: torch.Tensor) -> list[mirror.Branch]:
    """The valid branches of a rollout table [B, 4 + gamma] (``RolloutStage.run``), best first."""
    return [mirror.Branch(int(row[0]), int(row[1]), row[3], tokens=[int(t) for t in row[4:]])
            for row in table.tolist() if row[2]]


def roll_out_correction(run, cache, window: list[int], picks: torch.Tensor, base: int,
                        corrections: Rollouts) -> torch.Tensor:
    """On the draft stream, once the target's picks [T] are made: the one branch of the step's own
    outcome, rolled out on the ``corrections`` stage from the draft cache's ``base`` slots; its table
    [1, 4 + gamma]. Its channel holds the picks alone, one candidate per row, all scored alike: the
    rows whose pick is the window's next token are acceptances, skipped, so the branch chosen is the
    first row where the target's pick differs, or the bonus row: the outcome (A, c) of verifying."""
    picks = picks.to(run.pair.draft.device, non_blocking=True)
    if picks.is_cuda:  # made on the target's stream: keep its memory until this stream has read it
        picks.record_stream(torch.cuda.current_stream(picks.device))
    zeros = torch.zeros(len(picks), 1, dtype=torch.float64, device=picks.device)
    cache.length = base
    return roll_out_on_stage(run, cache, window, pack(picks[:, None], zeros, zeros[:-1, 0]), corrections)


def rollouts_fit(run, cache, window: list[int], rollouts: Rollouts | None) -> bool:
    """Whether the draft's stage for ``rollouts`` holds this step: the draft on stages, the window
    within the channel rows it was made for, the chain and every root within its widest forward."""
    chain = len(run.sequence) - cache.length + len(window)
    return (rollouts is not None and staged_for(run.pair.draft, cache, rollouts) is not None
            and len(window) < rollouts.rows and chain + rollouts.budget <= MAX_WIDTH)


def roll_out_on_stage(run, cache, window: list[int], channel, rollouts: Rollouts) -> torch.Tensor:
    """A queued step's branch choice and rollouts in one replay of the draft's stage for ``rollouts``
    (models/rollout.py), from the token channel packed (models/channel.py) on the draft's device;
    the table ``RolloutStage.run`` gives. The cache moves past the chain and the
    rollouts' slots, as ``mirror.roll_out_tree`` moves it."""
    stages = staged(run.pair.draft, cache)
    chain = run.sequence[cache.length:] + list(window)  # committed tokens the draft has not seen, then the window
    table = stages.run(rollouts.name, [chain], rows=len(chain) + rollouts.budget, channel=channel)
    cache.length += len(chain) + rollouts.gamma * rollouts.budget
    return table


def queue_target(run, target_cache, window: list[int], step, exit_layer, kappa, head, tree: Tree | None = None,
                 channel_stage: TokenChannel | None = None):
    """The target lane's part of a queued step, queued on its stream: the prefix and early exit over
    the window (the draft tokens, or ``tree``'s nodes), the token channel sent on to the draft's
    device, then the suffix. Returns the channel there (top ids, top log-probs, window log-probs;
    from ``channel_stage``'s stage, for a chain on the target's stages: the three packed in one
    tensor, models/channel.py), the prefix's ``Queued`` (its ``done`` event is what the draft
    stream waits for), the final logits [T, V] (once the suffix is done) and the suffix's ``Queued``."""
    pair, draft_device = run.pair, run.pair.draft.device
    T = len(window) + 1
    positions, mask = tree_window(tree, run.sequence, pair.target.device)[1:] if tree is not None else (None, None)
    stages = staged_for(pair.target, target_cache, channel_stage) if channel_stage is not None and tree is None \
        else None

    def token_channel_to_draft():  # the channel, sent on to the draft's device (off CUDA: read, so done)
        if stages is not None:  # one stage: the prefix and the channel, packed
            hidden, packed = stages.run(channel_stage.name, [[run.sequence[-1], *window]])
            return hidden, packed.to(draft_device, non_blocking=draft_device.type == "cuda")
        hidden, *channel = mirror.token_channel(run, target_cache, [run.sequence[-1], *window], exit_layer, kappa, head,
                                         on_host=False, positions=positions, mask=mask,
                                         parents=tree.parents if tree is not None else None)
        return hidden, [t.to(draft_device, non_blocking=draft_device.type == "cuda") for t in channel]

    (hidden, channel_there), channel = run.target_lane.queue(
        "target-prefix", token_channel_to_draft, label=mirror.prefix_label(exit_layer, head, T), step=step, tokens=T)
    logits, suffix = run.target_lane.queue("target-suffix", mirror.suffix_logits, run, target_cache, hidden,
                                           exit_layer, None, positions, mask,
                                           label=mirror.suffix_label(pair, exit_layer, T), step=step, tokens=T)
    return channel_there, channel, logits, suffix


def wait_and_record(*queued_work):
    """The host's one wait of a queued step (for the target's work and the rollouts), and their spans."""
    for queued in queued_work:
        queued.record()  # waits for the work first
