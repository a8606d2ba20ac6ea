"""The prefill of the two-model methods (sd, mirror): the target, then the draft, on their lanes."""
from __future__ import annotations

import torch

from ..models.forwards import FULL, forward
from ..trace import Step


def prefill_pair(run, extra_draft_slots: int = 0, extra_target_slots: int = 0, target_ranges=(FULL,),
                 draft_ranges=(FULL,)):
    """Prefill the target, then the draft, each alone on its lane; commit the target's first token.
    Returns the target's and the draft's caches and the committed step.

    One after the other, so that on a CPU whose cores the lanes split the target's prefill gets them
    all (the draft's is a small share of the work). extra_draft_slots, extra_target_slots: room in
    the caches beyond the sequence and the usual window margin (rollout trees, lookahead trees,
    windows past gamma). target_ranges, draft_ranges: the layer ranges each model's forwards run
    (``ModelPair.new_cache``: with stages on, they are made before the first step).
    """
    pair = run.pair
    target_cache = pair.new_cache(pair.target, run.cache_slots + extra_target_slots, target_ranges)
    draft_cache = pair.new_cache(pair.draft, run.cache_slots + extra_draft_slots, draft_ranges)
    n = len(run.prompt_ids)
    target_ids = torch.tensor([run.prompt_ids], device=pair.target.device)  # [1, P]
    draft_ids = torch.tensor([run.prompt_ids[:-1]], device=pair.draft.device)  # last token: fed at step 1
    label = f"prefill {n} tokens"
    logits = run.target_lane.run("prefill", forward, pair.target, target_ids, target_cache, label=label, step=0,
                                 tokens=n, alone=True)
    if n > 1:
        run.draft_lane.run("prefill", forward, pair.draft, draft_ids, draft_cache, label=label, step=0, tokens=n - 1,
                           alone=True)
    token = run.target_sampler.pick(logits[0, -1])
    return target_cache, draft_cache, run.commit(Step(0, [token], ["target"]))
