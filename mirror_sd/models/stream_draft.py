"""Speculative Streaming's greedy draft as one fixed-shape stage: the streams' pass in one graph.

At T = 0 an ``ss`` step drafts from the streams of the last accepted row (methods/ss.py:
``draft_from_streams``): their rows are that row's layer-L0 hidden state plus each stream's
embedding (and the step's next token, for streams trained to see it), at the positions after
it; each sees the committed slots and the streams before it; they run the top layers with the
streams' adapters, and the streams' head gives each one's log-probs, whose top candidates make the
draft tree (``tree_growth.stream_fields``). Laid out by the host, that is some forty launches a
step; a :class:`StreamDraftStage` does all of it in its body, so the host copies one hidden state
in, fills two numbers and replays one graph; the tree stays on the device for the verification
stage (methods/verify.py: ``draft_and_verify_on_stages``), or is read once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import MirrorSDError
from ..tree_growth import stream_fields
from .llama import Transformer
from .stages import Layout, OwnStage, Stage, bucket
from .streams import Streams
from .tuned import run_layers


class StreamDraftStage(Stage):
    """The streams' rows of one main row through the top layers, then their draft tree."""

    def __init__(self, model: Transformer, width: int, cache, spec: StreamDraft):
        streams = spec.streams
        if width < streams.num_streams:
            raise MirrorSDError(f"a stream draft of {streams.num_streams} streams needs a width of at least that, "
                                f"got {width}")
        super().__init__(model, width, cache, layers=(streams.first_layer, model.num_layers), head=False,
                         streams=streams)
        self.spec = spec
        self.h0 = torch.zeros(1, 1, model.args.hidden_size, dtype=model.dtype, device=model.device)
        self.next_id = torch.zeros(1, 1, dtype=torch.long, device=model.device)

    def run(self, h0: torch.Tensor, positions=None, mask=None, next_id: int = 0) -> torch.Tensor:
        """The draft tree's fields [1, 4, M] (``tree_growth.stream_fields``) of the streams of main
        row h0 [1, 1, d] (its layer-L0 hidden state), whose token sits in the cache's last slot;
        ``next_id``: the token after it, already committed (streams that see it)."""
        if positions is not None or mask is not None:
            raise MirrorSDError("a stream draft lays out its own rows: no positions or mask")
        with torch.inference_mode():
            self.h0.copy_(h0)
            self.next_id.fill_(next_id)
            self.window.fill_(Layout(self.cache.length, 1).code)
            self.replay()
        return self.out

    def body(self) -> torch.Tensor:
        model, streams, spec = self.model, self.spec.streams, self.spec
        G, W, s = streams.num_streams, self.width, self.slot_ids  # s [S]: every slot's id
        layout = self.layout()
        T, start = layout.rows, layout.start  # [1] each
        at = (start - 1).clamp(min=0)  # [1]: the main row's slot and position
        live = T > 0  # a run over padding only (warm-up, capture): every row sees its own scratch slot only
        next_ids = self.next_id if streams.config.next_token_rank else None
        rows, positions = streams.inputs(model, self.h0, at.view(1, 1), G, next_ids)  # [1, G, d], [1, G]
        if W > G:  # padding rows after the streams'
            rows = torch.cat([rows, rows.new_zeros(1, W - G, rows.shape[-1])], dim=1)
            positions = torch.cat([positions, positions.new_zeros(1, W - G)], dim=1)
        r = self.rows[:, None]  # [W, 1]: stream r + 1's row; its keys and values sit in scratch slot r
        streams_so_far = (s >= self.scratch(0)) & (s <= self.scratch(r))  # [W, S]: streams 1..r+1's scratch slots
        sees = (s <= at) | streams_so_far  # [W, S]: the committed slots up to the main row's, and those
        mask = torch.where((r < G) & live, sees, self.padding)
        win = self.rows_window(positions, mask)
        h = run_layers(streams.layers_for(model, *self.layers), rows, self.writer, win, self.layers[0])  # [1, W, d]
        logp = torch.log_softmax(streams.logits(model, h)[0, :spec.gamma], dim=-1)  # [gamma, head rows]
        return stream_fields(logp, streams.to_target_ids, spec.top_k, spec.total_tokens)


@dataclass(frozen=True)
class StreamDraft(OwnStage):
    """A target stage set's forward: the streams' pass of one row and its draft tree at these
    settings. Give it to ``ModelPair.new_cache`` among the target's ranges to make (capture) its
    stage at warm-up."""

    streams: Streams
    gamma: int  # the streams whose candidates are read (the first gamma)
    top_k: int  # candidates per stream
    total_tokens: int  # nodes kept

    stage = StreamDraftStage

    @property
    def name(self) -> str:
        return f"stream draft {self.gamma}x{self.top_k}, {self.total_tokens} kept"

    @property
    def widths(self) -> tuple[int, ...]:
        return (bucket(self.streams.num_streams),)  # one row per stream
