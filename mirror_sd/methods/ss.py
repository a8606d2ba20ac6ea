"""Speculative Streaming (Bhendawade et al., 2024), lossless form: the target drafts for itself.

No draft model. The frozen target carries trained speculative streams (models/streams.py) on its
top N_s layers. Each step, on the target lane alone:

1. verify: one target forward over [last committed token, draft_1..draft_g]; the main stream's
   logits verify the draft with the shared rule (verify.py): accepted prefix + correction/bonus;
2. stream: the streams at the last accepted position (its layer-L0 hidden state, kept from that
   forward) re-enter the top N_s layers as g extra rows that see the cache up to that position,
   and propose the next draft: stream j gives the token j places after the correction.

Stream rows only pass through the top N_s layers and only at the accepted position (on a GPU
they would ride in the verify forward at every window position for free; on a CPU every row
costs time, so we run the one that is used). Their keys and values are never stored.

Lossless: the main stream is the target's own computation, untouched by the streams, so at
temperature 0 the committed tokens are vanilla's. At temperature > 0 the draft is a chain whose
token j is drawn from stream j's distribution q_j, which depends only on the committed context:
drawn independently of the earlier draft tokens, it is a valid proposal for the standard
speculative-sampling rule (accept with min(1, p/q), resample from norm(max(0, p - q))), which
makes each committed token exactly target-distributed whatever q is.
"""
from __future__ import annotations

import torch

from ..sampling import to_target_vocab
from ..models.streams import split_forward, target_streams
from ..trace import Step
from .verify import verify


def draft_from_streams(run, streams, cache, h0_row, gamma: int):
    """The next draft: gamma tokens from the streams of one main row h0_row [1, 1, d] whose token sits
    in the cache's last slot. Returns (tokens, q [gamma, V] or None at temperature 0)."""
    at = torch.tensor([[cache.length - 1]], device=h0_row.device)  # [1, 1]
    logits = streams(run.pair.target, cache, h0_row, at)[0, 0, :gamma]  # [gamma, head rows]
    sampler = run.draft_sampler
    if sampler.greedy:
        return streams.to_target_ids(logits.argmax(-1)).tolist(), None
    q = sampler.probs(to_target_vocab(logits, streams.vocab_map, run.pair.target.args.vocab_size))  # [gamma, V]
    return [sampler.sample(q_j) for q_j in q], q


def prefill(run, streams, gamma: int):
    target, lane = run.pair.target, run.pair.target_lane
    cache = target.new_cache(run.cache_slots)
    ids = torch.tensor([run.prompt_ids], device=target.device)  # [1, P]
    n = ids.shape[1]
    logits, h0 = lane.run("prefill", split_forward, target, ids, cache, streams.first_layer,
                          label=f"prefill {n} tokens", step=0, tokens=n)
    cache.length = n
    token = run.target_sampler.pick(logits[0, -1])
    draft, q = lane.run("draft", draft_from_streams, run, streams, cache, h0[:, -1:], gamma,
                        label=f"streams: draft {gamma} tokens", step=0, tokens=gamma)
    return cache, draft, q, run.commit(Step(0, [token], ["target"]))


def decode(run, gamma: int):
    target, lane = run.pair.target, run.pair.target_lane
    streams = target_streams(run.pair)
    cache, draft, q, first = prefill(run, streams, gamma)
    yield first
    while not run.done:
        step = run.next_step
        committed = len(run.sequence)
        window = torch.tensor([[run.sequence[-1], *draft]], device=target.device)  # [1, gamma + 1]
        logits, h0 = lane.run("verify", split_forward, target, window, cache, streams.first_layer,
                              label=f"verify {gamma + 1} tokens", step=step, tokens=gamma + 1)
        verdict = verify(draft, q, logits[0], run.target_sampler)
        tokens, origins = verdict.committed(draft)
        record = run.commit(Step(step, tokens, origins, proposed=draft, accepted=verdict.accepted))
        cache.rollback(committed + verdict.accepted)  # the last committed token + accepted drafts
        if not run.done:
            h0_row = h0[:, verdict.accepted:verdict.accepted + 1]  # [1, 1, d]: the last accepted position
            draft, q = lane.run("draft", draft_from_streams, run, streams, cache, h0_row, gamma,
                                label=f"streams: draft {gamma} tokens", step=step, tokens=gamma)
        yield record
