"""Classic draft-model speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each step a drafter (``mirror_sd/drafting``: option ``streams`` picks token by token, the draft's
streams in one forward, or the draft checking its streams' lookahead) proposes gamma tokens on the
draft lane; the target scores all gamma + 1 positions in one forward on the target lane;
``verify`` accepts a prefix and adds the correction or bonus token. Both KV caches are rolled back
to what was committed. The draft sits on the critical path: draft and target take turns (the
serial barrier that Mirror-SD removes).
"""
from __future__ import annotations

import torch

from ..drafting import make_drafter
from ..models.forwards import forward
from ..trace import Step
from .prefill import prefill_pair
from .verify import verify


def check(pair, options):
    make_drafter(**_drafter_options(options)).check(pair, options["gamma"])


def _drafter_options(options: dict) -> dict:
    return {name: value for name, value in options.items() if name != "gamma"}


def decode(run, gamma: int, **drafter_options):
    pair = run.pair
    drafter = make_drafter(**drafter_options)
    extra_draft, past_gamma = drafter.extra_slots(pair)
    target_cache, draft_cache, first = prefill_pair(run, extra_draft_slots=extra_draft, extra_target_slots=past_gamma,
                                                    draft_ranges=drafter.layer_ranges(pair))
    yield first
    label = f"draft {'≥' if past_gamma else ''}{gamma} tokens{drafter.how}"
    while not run.done:
        step = run.next_step
        committed = len(run.sequence)
        proposal = run.draft_lane.run("draft", drafter.propose, run, draft_cache, gamma, label=label, step=step,
                                      tokens=gamma)
        draft = proposal.tokens
        window = torch.tensor([[run.sequence[-1], *draft]], device=pair.target.device)  # [1, len(draft) + 1]
        logits = run.target_lane.run("verify", forward, pair.target, window, target_cache,
                                     label=f"verify {len(draft) + 1} tokens", step=step, tokens=len(draft) + 1)
        verdict = verify(draft, proposal.q, logits[0], run.target_sampler)
        tokens, origins = verdict.committed(draft)
        target_cache.rollback(committed + verdict.accepted)  # last committed + accepted drafts
        draft_cache.rollback(min(draft_cache.length, committed + verdict.accepted))
        drafter.settle(proposal, verdict.accepted)
        yield run.commit(Step(step, tokens, origins, proposed=draft, accepted=verdict.accepted, draft=proposal.work))
