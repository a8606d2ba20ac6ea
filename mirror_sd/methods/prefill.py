"""The prefill of the two-model methods (sd, mirror): the target and the draft, on their lanes."""
from __future__ import annotations

import torch

from ..executors import Threads
from ..models.forwards import FULL, forward
from ..trace import SpanKind, Step


def prefill_pair(run, extra_draft_slots: int = 0, target_ranges=(FULL,), draft_ranges=(FULL,)):
    """Prefill the target and the draft, each on its lane; commit the target's first token.
    Returns the target's and the draft's caches and the committed step.

    On the lanes' threads (executors.Threads), side by side where the lanes are devices of their own
    (a GPU's two streams, a GPU and the CPU): the draft's prefill costs the target nothing there.
    One after the other, each alone, where both lanes are the CPU's, so that the target's prefill
    gets every core the lanes split (the draft's is a small share of the work).

    extra_draft_slots: room in the draft's cache beyond the sequence and the usual window margin
    (rollout trees, draft trees while they grow, lookahead trees). target_ranges, draft_ranges:
    the layer ranges each model's forwards run (``ModelPair.new_cache``: with stages on, they are
    made before the first step).
    """
    pair = run.pair
    target_cache = pair.new_cache(pair.target, run.cache_slots, target_ranges)
    draft_cache = pair.new_cache(pair.draft, run.cache_slots + extra_draft_slots, draft_ranges)
    n = len(run.prompt_ids)
    target_ids = torch.tensor([run.prompt_ids], device=pair.target.device)  # [1, P]
    draft_ids = torch.tensor([run.prompt_ids[:-1]], device=pair.draft.device)  # last token: fed at step 1
    label = f"prefill {n} tokens"
    together, ex = prefills_side_by_side(pair), Threads()
    target = ex.start(run.target_lane, SpanKind.PREFILL, forward, pair.target, target_ids, target_cache, label=label,
                      step=0, tokens=n)
    if not together:
        target.result()
    if n > 1:
        ex.start(run.draft_lane, SpanKind.PREFILL, forward, pair.draft, draft_ids, draft_cache, label=label, step=0,
                 tokens=n - 1).result()
    token = run.target_sampler.pick(target.result()[0, -1])
    return target_cache, draft_cache, run.commit(Step(0, [token], ["target"]))


def prefills_side_by_side(pair) -> bool:
    """Whether the two prefills run at once: unless both lanes are the CPU's (they split its cores)."""
    return not pair.target_lane.device.type == pair.draft_lane.device.type == "cpu"
