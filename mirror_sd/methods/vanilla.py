"""Vanilla autoregressive decoding: the reference every other method must reproduce.

One target forward per token, with a KV cache, on the target lane.
"""
from __future__ import annotations

import torch

from ..trace import Step


def decode(run):
    target, lane, sampler = run.pair.target, run.target_lane, run.target_sampler
    cache = target.new_cache(run.cache_slots)
    ids = torch.tensor([run.prompt_ids], device=target.device)  # [1, P]
    logits = lane.run("prefill", target, ids, cache, label=f"prefill {ids.shape[1]} tokens", step=0,
                      tokens=ids.shape[1])
    token = sampler.pick(logits[0, -1])
    yield run.commit(Step(0, [token], ["target"]))
    while not run.done:
        step = run.next_step
        ids = torch.tensor([[token]], device=target.device)  # [1, 1]
        logits = lane.run("decode", target, ids, cache, label="decode 1 token", step=step, tokens=1)
        token = sampler.pick(logits[0, -1])
        yield run.commit(Step(step, [token], ["target"]))
