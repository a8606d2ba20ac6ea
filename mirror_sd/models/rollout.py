"""Mirror-SD's draft-lane work in a step, as one fixed-shape stage: one graph per step.

In a greedy chain step on the draft's stages (methods/mirror_rollouts.py: ``roll_out_on_stage``) the
draft lane gets the token channel (the target's top-kappa candidates at each window row, their
log-probs, and the window tokens' own log-probs; packed in one tensor, models/channel.py), chooses
the ``budget`` most likely branches (mirror_sd/branches.py) and rolls out ``gamma`` draft tokens
after each, all branches in one batch per forward (``roll_out_chains``). Every shape in that is fixed by (budget,
gamma, kappa, the window's most rows) and the bucket of the draft's first forward, and none of it
needs the host until the branches are read. Run an operation at a time it is some hundred launches
from the host per step; a :class:`RolloutStage` runs all of it in its body, so the host copies the
chain and the channel in, replays one graph and reads one table.

The body, for a draft cache of ``base`` committed slots, a chain of C tokens (the committed tokens
the draft has not seen, then the window's L = T - 1 draft tokens) and a channel of T rows:

1. the branches: the branch rule (mirror_sd/branches.py: ``branch_scores`` by the spec's scoring)
   over the channel's rows, its rows past T (padding) sorted last and never valid;
2. the first forward (``first_forward``), W rows: the chain (rows [0, C), causal, at slots base..),
   padding, and the ``budget`` branch roots in the last rows (slots after the chain; root of branch
   (r, v) at the position after window row r, seeing the committed slots, the chain up to row r,
   and itself);
3. gamma - 1 more forwards (``later_forward``) of ``budget`` rows, each branch's newest token,
   seeing what its root saw and its own tokens so far.

The greedy picks of each forward's branch rows are the next tokens (``chain_draft.greedy_chain``).
The host's rollouts (methods/mirror_rollouts.py) run the same functions over the window's own
rows, a forward at a time. A run over padding only (warm-up, capture) writes scratch slots only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..branches import SCORINGS, BranchTable, branch_scores, rank_branches, scoring
from ..errors import MirrorSDError
from ..tree_rules import ancestors
from .chain_draft import draft_logits, greedy_chain
from .channel import Channel
from .llama import Transformer
from .stages import BUCKETS, Layout, OwnStage, Stage, copy_into


class RolloutStage(Stage):
    """Branch choice and rollouts (module docstring); ``width``: the first forward's rows."""

    def __init__(self, model: Transformer, width: int, cache, spec: Rollouts):
        if width <= spec.budget:
            raise MirrorSDError(f"a rollout stage of {spec.budget} branches needs more than {spec.budget} rows, "
                                f"got {width}")
        super().__init__(model, width, cache)  # self.x: the chain's ids
        self.spec, device = spec, model.device
        self.channel = torch.zeros(spec.rows, 2 * spec.kappa + 1, dtype=torch.float64, device=device)  # T used
        self.channel_rows = torch.zeros(1, dtype=torch.long, device=device)  # T

    def run(self, x, positions=None, mask=None, channel: Channel | None = None) -> BranchTable:
        """The branches, best first, with the gamma tokens rolled out after each root (target ids):
        a :class:`BranchTable` (a view of the stage's output: read it before the next replay).
        x: [chain], the C tokens after the draft cache's slots (committed ones it has not seen, then
        the window's); ``channel``: the token channel of the window's T rows, on the draft's device.
        The cache's length does not move: the rollouts take C + gamma * budget slots after it."""
        if positions is not None or mask is not None:
            raise MirrorSDError("a rollout stage lays out its own rows: no positions or mask")
        chain = x[0]
        spec, C, T = self.spec, len(chain), channel.packed.shape[0]
        base = self.cache.length
        if not 1 <= C <= self.width - spec.budget or not 1 <= T <= spec.rows:
            raise MirrorSDError(f"a rollout stage of width {self.width} holds a chain of 1 to "
                                f"{self.width - spec.budget} tokens and 1 to {spec.rows} channel rows, got {C} and {T}")
        if base + C + spec.gamma * spec.budget > self.cache.max_slots:
            raise MirrorSDError(f"KV cache full: {base} + {C} + {spec.gamma} x {spec.budget} rollout tokens > "
                                f"{self.cache.max_slots} slots")
        with torch.inference_mode():
            copy_into(self.x[0, :C], chain)
            copy_into(self.channel[:T], channel.packed)
            self.channel_rows.fill_(T)
            self.window.fill_(Layout(base, C).code)
            self.replay()
        return BranchTable(self.out)

    def load_padding(self):
        super().load_padding()
        self.channel_rows.fill_(1)

    def body(self) -> torch.Tensor:
        layout = self.layout()
        C, base = layout.rows, layout.start  # [1] each: the chain's tokens, the draft's committed slots
        T = self.channel_rows
        r, roots, scores, valid = self.choose(T, C)  # [B] each
        spec, B, rows = self.spec, self.spec.budget, self.rows
        live, usable, s = C > 0, self.cache.max_slots, self.slot_ids  # padding only: scratch only; s [S]
        parents = (torch.arange(spec.rows, device=s.device) - 1).clamp(min=0)  # [R]: a chain, one path
        depths = torch.arange(spec.rows, device=s.device)  # [R]: window row r at depth r

        # The first forward: the chain, padding, then every branch's root (``first_forward``).
        ids, positions, slots, sees, used = first_forward(s, rows, base, C - (T - 1), C, r, roots, self.x[0],
                                                          ancestors(parents), depths)
        slots, positions = torch.where(used & live, slots, usable + rows), torch.where(used, positions, 0)
        sees = torch.where(used[:, None] & live, sees, self.padding)
        views = sees[-B:]  # [B, S]: what each root sees

        def feed(tokens: torch.Tensor, k: int) -> torch.Tensor:  # forward k + 1: each branch's newest token
            sees, slots = later_forward(s, base, C, k, views)
            branch = torch.arange(B, device=s.device)
            sees = torch.where(live, sees, s == (usable + branch)[:, None])
            slots = torch.where(live, slots, usable + branch)
            return draft_logits(self, tokens, positions[-B:] + k, sees, slots, last=B)

        first = draft_logits(self, ids, positions, sees, slots, last=B)  # [B, V_draft]
        picks = greedy_chain(first, feed, spec.gamma, self.model.vocab_map, spec.vocab_size)  # [B, gamma]
        return BranchTable.columns(r, roots, valid, scores, picks)  # [B, 4 + gamma]

    def choose(self, T: torch.Tensor, C: torch.Tensor):
        """The branch rule (mirror_sd/branches.py) over the channel's first T rows (the rest: padding,
        last and never valid): (r, roots, scores, valid) [budget] of the best hypotheses, best first."""
        spec, channel = self.spec, Channel(self.channel, self.spec.kappa)
        row = torch.arange(spec.rows, device=self.channel.device)  # [R]
        tokens = self.x[0].gather(0, (C - T + row).clamp(0, self.width - 1))  # [R]: row r's draft token d_r
        parents = (row - 1).clamp(min=0)  # [R]: a chain, row r + 1 the child of row r
        node_logp = torch.cat([channel.window_logp.new_zeros(1), channel.window_logp])  # [R]
        top_ids = channel.top_ids  # [R, kappa]
        scores, skip = branch_scores(top_ids, channel.top_logp, tokens, parents, node_logp, T, SCORINGS[spec.scoring])
        return rank_branches(scores, skip, top_ids, spec.budget)


def first_forward(s, rows, base, P, C, r, roots, chain, ancestors, depths):
    """The rollouts' first draft forward, one rule for the host's (methods/mirror_rollouts.py:
    ``rollout_layout``) and a stage's body: W = len(rows) rows, the chain's C first (the P committed
    tokens the draft has not seen, causal, then the window's nodes under the window's tree mask), the
    B branches' roots last (row W - B + b for branch b), any rows between them padding.

    s [S]: the cache's slot ids; base: its committed slots (the chain goes to base.., root b to
    base + C + b); P, C: ints, or [1] tensors in a stage; r, roots [B]: the branches' window rows and
    root tokens; chain [W]: the chain's ids in its first C rows; ancestors [R, R] and depths [R] over
    the window's rows [root, nodes] (tree_rules.ancestors; the root at depth 0). The root of branch
    (r, v) sees the committed slots, the window's path to row r and itself, at the position after
    row r. Returns ids [W], positions [W], slots [W], sees [W, S] and used [W] (the chain's and the
    roots' rows: the others' slots and views are the caller's)."""
    W, B, R = rows.shape[0], r.shape[0], ancestors.shape[0]
    n = base + P  # committed tokens: the last one is the window's root, at position n - 1
    b = (rows - (W - B)).clamp(min=0)  # [W]: a root row's branch
    chain_row, root = rows < C, rows >= W - B
    window_row = torch.where(root, r[b], (rows - P + 1).clamp(0, R - 1))  # [W]: each row's window row (0: committed)
    x = s - base  # [S]: each slot's place in the chain
    committed = x < P
    in_window = ancestors[window_row[:, None], (x - P + 1).clamp(0, R - 1)[None, :]]  # [W, S]
    causal = x[None, :] <= torch.where(root, C, rows)[:, None]  # a root sees every committed token
    sees = ((x < 0) | ((x < C) & torch.where(committed, causal, in_window))
            | (root[:, None] & (x == C + b[:, None])))  # [W, S]
    depth = depths[window_row]  # [W]
    positions = torch.where(root, n + depth, torch.where(rows < P, base + rows, n - 1 + depth))
    slots = torch.where(root, base + C + b, base + rows)
    return torch.where(root, roots[b], chain), positions, slots, sees, chain_row | root


def later_forward(s, base, C, k: int, views):
    """Forward k + 1 of the rollouts (k >= 1), one rule for both paths: each branch's newest token,
    written at slot base + C + k B + b, sees what its root saw (views [B, S]: the first forward's
    root rows) and its branch's own tokens so far. Returns sees [B, S] and slots [B]."""
    B = views.shape[0]
    branch = torch.arange(B, device=s.device)
    after = s - base - C  # [S]: where the branches' slots start
    own = (after >= 0) & (after % B == branch[:, None]) & (after // B <= k)  # [B, S]
    return views | own, base + C + k * B + branch


@dataclass(frozen=True)
class Rollouts(OwnStage):
    """A draft stage set's forward: a queued step's branch choice and rollouts at these settings.
    Give it to ``ModelPair.new_cache`` among the draft's ranges to make (capture) its stages at
    warm-up."""

    budget: int  # branches rolled out: at most rows * kappa
    gamma: int  # draft tokens after each root
    kappa: int  # candidates per window row
    rows: int  # the most rows a window (and so the channel) has
    vocab_size: int  # the target's (the picks are target ids)
    scoring: str = field(default_factory=scoring)  # the branch scoring (branches.SCORINGS), the setting at hand

    stage = RolloutStage

    @property
    def name(self) -> str:
        scored = "" if self.scoring == "step-end" else f", scored by {self.scoring}"
        return f"rollouts {self.budget}x{self.gamma} from {self.rows}x{self.kappa} candidates" + scored

    @property
    def widths(self) -> tuple[int, ...]:
        """The buckets whose first forward holds a chain besides the roots."""
        return tuple(w for w in BUCKETS if w > self.budget)
