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

1. the branches: the branch rule (mirror_sd/branches.py) over the channel's rows, its rows past T
   (padding) sorted last and never valid;
2. the first forward, W rows: the chain (rows [0, C), causal, at slots base..), padding, and the
   ``budget`` branch roots in the last rows (slots after the chain; root of branch (r, v) at the
   position after window row r, seeing the committed slots, the chain up to row r, and itself);
3. gamma - 1 more forwards of ``budget`` rows, each branch's newest token, seeing what its root saw
   and its own tokens so far.

The greedy picks of each forward's branch rows are the next tokens. A run over padding only
(warm-up, capture) writes scratch slots only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..branches import BranchTable, chain_scores, rank_branches
from ..errors import MirrorSDError
from .chain_draft import greedy_picks
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
        spec, W, B = self.spec, self.width, self.spec.budget
        live, usable, s = C > 0, self.cache.max_slots, self.slot_ids  # padding only: scratch only; s [S]
        n = base + C - (T - 1)  # committed tokens: the chain's first C - (T - 1) are committed
        chain_depth = (s - n + 1).clamp(min=0)  # [S]: a chain slot's window depth (0: committed)
        in_chain = (s >= base) & (s < base + C)
        sees_before_root = (s < base) | (in_chain & (chain_depth <= r[:, None]))  # [B, S]

        # The first forward: the chain (causal), padding, then every branch's root.
        rows = self.rows  # [W]
        b = (rows - (W - B)).clamp(min=0)  # [W]: a root row's branch
        chain, root = rows < C, rows >= W - B
        slots = torch.where(chain, base + rows, torch.where(root, base + C + b, usable + rows))
        slots = torch.where(live, slots, usable + rows)
        positions = torch.where(chain, base + rows, torch.where(root, n + r[b], 0))
        ids = torch.where(root, roots[b], self.x[0])
        sees = torch.where(chain[:, None], s <= (base + rows)[:, None],  # [W, S]
                           sees_before_root[b] | (s == (base + C + b)[:, None]))
        sees = torch.where((chain | root)[:, None] & live, sees, self.padding)
        picks = [greedy_picks(self, ids, positions, sees, slots, spec.vocab_size, last=B)]  # [B]

        # gamma - 1 more: each branch's newest token.
        branch = torch.arange(B, device=s.device)
        after = s - base - C  # [S]: where the branches' slots start
        for k in range(1, spec.gamma):
            own = (after >= 0) & (after % B == branch[:, None]) & (after // B <= k)  # [B, S]
            sees = torch.where(live, sees_before_root | own, s == (usable + branch)[:, None])
            slots = torch.where(live, base + C + k * B + branch, usable + branch)
            picks.append(greedy_picks(self, picks[-1], n + r + k, sees, slots, spec.vocab_size, last=B))
        return BranchTable.columns(r, roots, valid, scores, torch.stack(picks, dim=1))  # [B, 4 + gamma]

    def choose(self, T: torch.Tensor, C: torch.Tensor):
        """The branch rule (mirror_sd/branches.py) over the channel's first T rows (the rest: padding,
        last and never valid): (r, roots, scores, valid) [budget] of the best hypotheses, best first."""
        spec, channel = self.spec, Channel(self.channel, self.spec.kappa)
        row = torch.arange(spec.rows, device=self.channel.device)  # [R]
        drafted = self.x[0].gather(0, (C - (T - 1) + row).clamp(0, self.width - 1))  # [R]: d_{r+1}
        top_ids = channel.top_ids  # [R, kappa]
        scores, skip = chain_scores(top_ids, channel.top_logp, channel.window_logp, drafted, T)
        return rank_branches(scores, skip, top_ids, spec.budget)


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

    stage = RolloutStage

    @property
    def name(self) -> str:
        return f"rollouts {self.budget}x{self.gamma} from {self.rows}x{self.kappa} candidates"

    @property
    def widths(self) -> tuple[int, ...]:
        """The buckets whose first forward holds a chain besides the roots."""
        return tuple(w for w in BUCKETS if w > self.budget)
