"""Vanilla autoregressive decoding: the reference every other method must reproduce.

One target forward per token, with a KV cache, on the target lane: queued on its stream from the
decoding thread (on a GPU, one graph launch a token on stages), and read once, as the token is picked.
"""
from __future__ import annotations

import torch

from ..executors import Streams
from ..models.forwards import forward
from ..trace import SpanKind, Step


def decode(run, note: str = ""):
    """Decode from the committed sequence: the prompt, or the prompt and what another method committed
    before its draft lane failed (``engine.on_draft_failure``, with ``note`` " (target only)" in the
    span labels). At temperature 0 it commits what vanilla would after that prefix."""
    target, lane, sampler = run.pair.target, run.target_lane, run.target_sampler
    cache = run.pair.new_cache(target, run.cache_slots)
    ids = torch.tensor([run.sequence], device=target.device)  # [1, P + committed]
    logits = lane.run(SpanKind.PREFILL, forward, target, ids, cache, label=f"prefill {ids.shape[1]} tokens{note}",
                      step=run.next_step, tokens=ids.shape[1])
    token = sampler.pick(logits[0, -1])
    yield run.commit(Step(run.next_step, [token], ["target"]))
    ex = Streams()  # its phases follow one another: queued, each read when needed
    while not run.done:
        step = run.next_step
        logits = ex.start(lane, SpanKind.DECODE, decode_one, target, token, cache, label=f"decode 1 token{note}",
                          step=step, tokens=1).result()  # the step's one wait for the device
        token = sampler.pick(logits[0, -1])
        yield run.commit(Step(step, [token], ["target"]))


def decode_one(target, token: int, cache) -> torch.Tensor:
    """The target's logits [1, 1, V] for ``token`` written after the cache's slots. (The token's copy
    onto a GPU blocks, but the stream is idle: the last step's pick waited for it.)"""
    return forward(target, torch.tensor([[token]], device=target.device), cache)  # [1, 1] ids
