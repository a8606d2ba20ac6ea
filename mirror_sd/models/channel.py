"""Mirror-SD's token channel as one fixed-shape stage: the target prefix, the early exit and what
crosses to the draft, in one graph.

A step's token channel (methods/mirror.py: ``token_channel``) runs the target's layers [0, exit)
over the window, reads the exit (``EarlyExit``: a trained head if any, the final norm, the LM-head
rows of the draft's vocabulary, log_softmax), lays the log-probs over the target's vocabulary, and
takes the top-kappa candidates at every row and the log-prob of each window token at the row
before it. Run an operation at a time, the part after the prefix is some twenty launches from the
host; a :class:`ChannelStage` runs all of it in its body, over a causal window (a chain), and
packs what crosses into one tensor (:class:`Channel`), so the draft's device receives it in one copy.
The prefix's hidden states stay in the stage for the suffix.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import MirrorSDError
from ..sampling import to_target_vocab
from .llama import Transformer
from .stages import OwnStage, Stage


class ChannelStage(Stage):
    """The prefix and the token channel over a causal window of up to ``width`` tokens."""

    def __init__(self, model: Transformer, width: int, cache, spec: TokenChannel):
        super().__init__(model, width, cache, layers=(0, spec.exit_layer), head=False)
        self.spec = spec

    def run(self, x, positions=None, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        """For the T window tokens x [1, T] (the last committed one first), a causal window written
        after the cache's slots: the prefix's hidden states [1, T, d] (a view of the stage's output:
        use it before the next replay of a stage of this set) and the :class:`Channel` (a copy). The
        cache's length does not move."""
        if positions is not None or mask is not None:
            raise MirrorSDError("the token channel's stage takes a chain: no positions or mask")
        with torch.inference_mode():
            T = self.load(x)
            self.replay()
            hidden, packed = self.out
            return hidden[:, :T], Channel(packed[:T].clone(), self.spec.kappa)

    def body(self):
        h = super().body()  # [1, W, d]: layers [0, exit_layer) over the window
        spec = self.spec
        logp = to_target_vocab(spec.reader(h)[0], spec.reader.vocab_map, spec.vocab_size)  # [W, V]
        return h, channel_of(logp, self.x[0, 1:], spec.kappa).packed  # past row T - 1: padding's


@dataclass(frozen=True)
class TokenChannel(OwnStage):
    """A target stage set's forward: layers [0, exit_layer) and the token channel through ``reader``
    (models/exit_head.py: EarlyExit). Give it to ``ModelPair.new_cache`` among the target's ranges
    to make (capture) its stages at warm-up."""

    exit_layer: int
    kappa: int
    reader: torch.nn.Module
    vocab_size: int  # the target's

    stage = ChannelStage

    @property
    def name(self) -> str:
        return f"token channel: layers 0-{self.exit_layer}, {self.reader.stage_name}, top {self.kappa}"


@dataclass(frozen=True)
class Channel:
    """The token channel: all that crosses from the target lane to the draft lane in a Mirror-SD step,
    O(T kappa) numbers in one tensor, so that another device receives it in one copy.

    packed [T, 2 kappa + 1] (float64, ids exact): the early exit's top-kappa ids [T, kappa], their
    log-probs [T, kappa], and each draft token's log-prob at the row before it (a tree node's: at its
    parent's row) [T - 1], with a last row of 0 after them."""

    packed: torch.Tensor
    kappa: int

    @classmethod
    def of(cls, top_ids: torch.Tensor, top_logp: torch.Tensor, window_logp: torch.Tensor) -> Channel:
        window_logp = torch.cat([window_logp, window_logp.new_zeros(top_ids.shape[0] - window_logp.shape[0])])
        packed = torch.cat([top_ids.double(), top_logp.double(), window_logp.double()[:, None]], dim=1)
        return cls(packed, top_ids.shape[1])

    @property
    def top_ids(self) -> torch.Tensor:  # [T, kappa]
        return self.packed[:, :self.kappa].long()

    @property
    def top_logp(self) -> torch.Tensor:  # [T, kappa]
        return self.packed[:, self.kappa:2 * self.kappa].float()

    @property
    def window_logp(self) -> torch.Tensor:  # [T - 1]
        return self.packed[:-1, 2 * self.kappa].float()

    def to(self, device: torch.device) -> Channel:
        """The channel on ``device``, copied without waiting where it goes to a GPU."""
        return Channel(self.packed.to(device, non_blocking=device.type == "cuda"), self.kappa)


def channel_of(exit_logp: torch.Tensor, drafted: torch.Tensor, kappa: int,
               parent_rows: torch.Tensor | None = None) -> Channel:
    """The token channel from the early exit's log-probs [T, V] over a window whose draft tokens are
    ``drafted`` [T - 1]: the top-kappa candidates at every row, and each draft token's log-prob at
    the row before it, or (a tree window) at its parent's row (``parent_rows`` [T - 1])."""
    top = exit_logp.topk(kappa, dim=-1)
    before = exit_logp[:-1] if parent_rows is None else exit_logp[parent_rows]  # [T - 1, V]
    return Channel.of(top.indices, top.values, before.gather(-1, drafted[:, None])[:, 0])
