"""A draft's greedy chain as one fixed-shape stage: gamma draft forwards in one graph.

At T = 0 the classic draft (drafting/token_by_token.py: ``draft_window``) catches up on the
committed tokens it has not seen, then feeds each of its picks back for the next, gamma forwards in
all; each pick already stays on the device, but each forward is a stage of its own, loaded and
read by the host. A :class:`ChainDraftStage` runs the catch-up (a causal window, laid out as every
stage lays one out) and the gamma - 1 one-token forwards after it in its body, so the host copies
the unseen tokens in, replays one graph and reads the gamma picks. Sd's drafts and Mirror-SD's
fallback drafts are such chains; sd's stage gives them as a one-branch tree, left on the device
for the target's tree verification stage (``ChainDraft.as_tree``). A run over padding only
(warm-up, capture) writes scratch slots only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import MirrorSDError
from ..sampling import draft_argmax
from .llama import Transformer
from .stages import OwnStage, SlotWriter, Stage
from .tuned import run_layers


class ChainDraftStage(Stage):
    """The unseen committed tokens (up to ``width``), then gamma - 1 more forwards of one pick each."""

    def __init__(self, model: Transformer, width: int, cache, spec: ChainDraft):
        super().__init__(model, width, cache)
        self.spec = spec

    def run(self, x, positions=None, mask=None) -> torch.Tensor:
        """The gamma picks [gamma] (target ids) after the T tokens x [1, T] written after the cache's
        slots (a causal window); with the spec's ``as_tree``, as a one-branch tree's fields
        [1, 4, gamma] (``tree_growth.grow_fields``' layout) for the tree verification stage to
        read. The cache's length does not move: the window and the first gamma - 1 picks take
        T + gamma - 1 slots after it (the last pick is never fed)."""
        if positions is not None or mask is not None:
            raise MirrorSDError("a chain draft's window is causal: no positions or mask")
        T = len(x[0]) if isinstance(x, list) else x.shape[1]
        if self.cache.length + T + self.spec.gamma - 1 > self.cache.max_slots:
            raise MirrorSDError(f"KV cache full: {self.cache.length} + {T} + {self.spec.gamma - 1} draft tokens > "
                                f"{self.cache.max_slots} slots")
        with torch.inference_mode():
            self.load(x)
            self.replay()
        return self.out

    def body(self) -> torch.Tensor:
        model, V = self.model, self.spec.vocab_size
        logits = super().body()[0]  # [W, V_draft]: the window's rows
        layout = self.layout()
        T, start = layout.rows, layout.start  # [1] each
        live, usable, s = T > 0, self.cache.max_slots, self.slot_ids  # padding only: scratch slot 0 only

        def feed(pick: torch.Tensor, k: int) -> torch.Tensor:  # pick k [1], at slot and position start + T + k - 1
            slot = start + T + k - 1  # [1]
            sees = torch.where(live, s <= slot, s == usable)[None]  # [1, S]
            return draft_logits(self, pick, slot, sees, torch.where(live, slot, usable))

        first = logits.index_select(0, (T - 1).clamp(min=0))  # [1, V_draft]: the window's last row
        picks = greedy_chain(first, feed, self.spec.gamma, model.vocab_map, V)[0]  # [gamma]
        if not self.spec.as_tree:
            return picks
        depths = torch.arange(1, self.spec.gamma + 1, device=picks.device)  # each pick the child of the one before
        return torch.stack([picks, depths - 2, depths, torch.zeros_like(depths)])[None].double()  # [1, 4, gamma]


def greedy_chain(logits: torch.Tensor, feed, gamma: int, vocab_map, vocab_size: int) -> torch.Tensor:
    """A greedy draft chain from each of B rows, the rule both paths run (drafting/token_by_token.py:
    ``draft_window``; models/rollout.py: the rollouts; and their stages): the draft's pick (target
    ids, ``draft_argmax``) at each row's logits [B, V_draft], fed back for the next, gamma picks in
    all: ``feed(picks [B], k)`` writes pick k's rows and returns their logits [B, V_draft]. Nothing
    is read to the host. Returns picks [B, gamma]."""
    picks = [draft_argmax(logits, vocab_map, vocab_size)]  # [B]
    for k in range(1, gamma):
        picks.append(draft_argmax(feed(picks[-1], k), vocab_map, vocab_size))
    return torch.stack(picks, dim=-1)


def draft_logits(stage: Stage, ids, positions, sees, slots, last: int = 1) -> torch.Tensor:
    """A draft stage's body running the draft over rows ids [R] at positions [R], seeing ``sees``
    [R, S] of the cache's slots and writing ``slots`` [R]: the logits [last, V_draft] of the last
    ``last`` rows. How a chain draft and Mirror-SD's rollouts feed picks back inside one graph."""
    model = stage.model
    win = stage.rows_window(positions, sees)
    h = run_layers(model.model.layers, model.embed(ids.view(1, -1)), SlotWriter(stage.cache, slots), win, 0)
    return model.head(h[:, -last:])[0]


@dataclass(frozen=True)
class ChainDraft(OwnStage):
    """A draft stage set's forward: a greedy chain of ``gamma`` tokens after the unseen committed ones.
    Give it to ``ModelPair.new_cache`` among the draft's ranges to make (capture) its stages at warm-up."""

    gamma: int
    vocab_size: int  # the target's (the picks are target ids)
    as_tree: bool = False  # the picks as a one-branch tree's fields (sd's steps read once: methods/sd.py)

    stage = ChainDraftStage

    @property
    def name(self) -> str:
        return f"chain draft of {self.gamma}" + (" as a tree" if self.as_tree else "")
