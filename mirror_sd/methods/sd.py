"""Classic draft-model speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each step the draft proposes gamma tokens on the draft lane; the target scores all gamma + 1
positions in one forward on the target lane; ``verify`` accepts a prefix and adds the correction
or bonus token. Both KV caches are rolled back to what was committed. The draft sits on the
critical path: draft and target take turns (the serial barrier that Mirror-SD removes).

The draft proposes autoregressively (gamma draft forwards), or with ``streams=1`` in one forward:
its main stream gives the first token and its trained speculative streams (models/streams.py) the
other gamma - 1. At T > 0 that window is still a valid proposal: token j is drawn from a law that
depends only on the committed prefix, and verify records it (the argument of methods/ss.py).
"""
from __future__ import annotations

import torch

from ..errors import MirrorSDError
from ..models.streams import draft_streams, split_forward
from ..trace import Step
from .verify import verify


def prefill(run, extra_draft_slots: int = 0):
    """Prefill the target, then the draft, each alone on its lane; commit the target's first token.

    One after the other, so that on a CPU whose cores the lanes split (Mirror-SD) the target's
    prefill gets them all: the draft's is about a tenth of the work. Side by side, the target ran
    on one core of two, and Mirror-SD's prefills took 1.6 s against vanilla's 1.1 on the 12 bench
    prompts. extra_draft_slots: room in the draft's cache beyond the sequence (Mirror-SD's rollout trees).
    """
    pair = run.pair
    target_cache = pair.target.new_cache(run.cache_slots)
    draft_cache = pair.draft.new_cache(run.cache_slots + extra_draft_slots)
    n = len(run.prompt_ids)
    target_ids = torch.tensor([run.prompt_ids], device=pair.target.device)  # [1, P]
    draft_ids = torch.tensor([run.prompt_ids[:-1]], device=pair.draft.device)  # last token: fed at step 1
    label = f"prefill {n} tokens"
    logits = pair.target_lane.run("prefill", pair.target, target_ids, target_cache, label=label, step=0,
                                  tokens=n, alone=True)
    if n > 1:
        pair.draft_lane.run("prefill", pair.draft, draft_ids, draft_cache, label=label, step=0, tokens=n - 1,
                            alone=True)
    token = run.target_sampler.pick(logits[0, -1])
    return target_cache, draft_cache, run.commit(Step(0, [token], ["target"]))


def draft_window(run, cache, gamma: int):
    """Draft gamma tokens after the committed sequence: returns (tokens, q [gamma, V] or None).

    The draft first catches up on committed tokens it has not seen (1 or 2), then autoregresses;
    its cache ends holding the sequence and tokens[:-1] (the last drafted token is never fed).
    """
    draft, sampler = run.pair.draft, run.draft_sampler
    pending = run.sequence[cache.length:]
    ids = torch.tensor([pending], device=draft.device)  # [1, pending]
    tokens, q = [], []
    for i in range(gamma):
        logits = run.as_target_vocab(draft(ids, cache)[0, -1])  # [V]
        if sampler.greedy:
            tokens.append(int(logits.argmax()))
        else:
            q.append(sampler.probs(logits))
            tokens.append(sampler.sample(q[-1]))
        ids = torch.tensor([[tokens[-1]]], device=draft.device)
    return tokens, (torch.stack(q) if q else None)


def streamed_window(run, cache, gamma: int):
    """Like draft_window, in one draft forward: the main stream's next token, then streams 1..gamma-1
    at the same position. The draft's cache ends holding exactly the committed sequence."""
    draft, sampler = run.pair.draft, run.draft_sampler
    streams = draft_streams(run.pair)
    pending = run.sequence[cache.length:]
    ids = torch.tensor([pending], device=draft.device)  # [1, pending]
    main, h0 = split_forward(draft, ids, cache, streams.first_layer)  # [1, pending, V_d], [1, pending, d]
    cache.length += len(pending)
    at = torch.tensor([[cache.length - 1]], device=draft.device)  # [1, 1]
    ahead = streams(draft, cache, h0[:, -1:], at)[0, 0, :gamma - 1]  # [gamma - 1, V_d]
    return sampler.draw(run.as_target_vocab(torch.cat([main[0, -1:], ahead])))  # from logits [gamma, V]


def check_streams(pair, options):
    """streams=1 needs a draft with trained streams, enough of them for gamma."""
    if options.get("streams"):
        trained = draft_streams(pair).num_streams
        if options["gamma"] > trained + 1:
            raise MirrorSDError(f"gamma must be at most {trained + 1} with streams=1 (the draft's {trained} "
                                f"trained streams + its main stream), got {options['gamma']}")


def decode(run, gamma: int, streams: int = 0):
    pair = run.pair
    target_cache, draft_cache, first = prefill(run)
    propose, how = (streamed_window, "in one forward, streams") if streams else (draft_window, "")
    yield first
    while not run.done:
        step = run.next_step
        committed = len(run.sequence)
        draft, q = pair.draft_lane.run("draft", propose, run, draft_cache, gamma,
                                       label=f"draft {gamma} tokens {how}".strip(), step=step, tokens=gamma)
        window = torch.tensor([[run.sequence[-1], *draft]], device=pair.target.device)  # [1, gamma + 1]
        logits = pair.target_lane.run("verify", pair.target, window, target_cache, label=f"verify {gamma + 1} tokens",
                                      step=step, tokens=gamma + 1)
        verdict = verify(draft, q, logits[0], run.target_sampler)
        tokens, origins = verdict.committed(draft)
        target_cache.rollback(committed + verdict.accepted)  # last committed + accepted drafts
        draft_cache.rollback(min(draft_cache.length, committed + verdict.accepted))
        yield run.commit(Step(step, tokens, origins, proposed=draft, accepted=verdict.accepted))
