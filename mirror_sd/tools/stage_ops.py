"""How many operations each stage's body runs: the kernels its CUDA graph replays.

    python -m mirror_sd.tools.stage_ops --methods vanilla,sd,eagle,ss,mirror

A stage of the embedded pair's size is bound on a GPU by how many kernels it launches, not by its
arithmetic (docs/experiments/ss.md#merged-adapters-in-the-streams-pass). Counting what a body
dispatches, which any device can do, says which stages a GPU will find slow. This runs each method
once on the CPU with graphs on (the stages' bodies run eagerly there; Mirror-SD's steps queued, as
on CUDA lanes), then runs the body of every stage its stage sets made, at its narrowest width, twice
(the first as a capture's warm-up), counting the second run's operations: all of them, and those
that launch work on a GPU (views, reshapes and the like launch none). The CPU does not plan the
tuned kernels a CUDA capture joins (models/tuning.py), so a GPU's counts are lower; the
differences between stages are what this shows.
"""
from __future__ import annotations

import argparse
import collections

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mirror_sd import generate, load_pair
from .host_ops import PROMPT, as_on_a_gpu

NO_KERNEL = {"view", "_unsafe_view", "reshape", "expand", "slice", "select", "unsqueeze", "squeeze", "permute",
             "transpose", "t", "as_strided", "detach", "alias", "unbind", "split", "split_with_sizes", "chunk",
             "narrow", "view_as", "expand_as", "lift_fresh", "_reshape_alias", "unflatten", "flatten"}


class BodyCounter(TorchDispatchMode):
    """Counts the operations dispatched while it is entered, by name."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def body_ops(stage) -> tuple[int, int]:
    """(operations, operations that launch work) in one run of the stage's body on its buffers, after
    one run uncounted (a capture's warm-up: what a body makes once, such as the streams' merged
    layers, is not in its graph)."""
    stage.load_padding()
    with torch.inference_mode():
        stage.body()
        with BodyCounter() as counter:
            stage.body()
    launching = sum(n for name, n in counter.counts.items() if name not in NO_KERNEL)
    return sum(counter.counts.values()), launching


def stage_rows(pair) -> list[dict]:
    """One row per (model, stage name): its narrowest width's operation counts."""
    rows = []
    for model, stages in pair.stage_sets.items():
        who = {id(pair.target): "target", id(pair.draft): "draft"}.get(id(model), type(model).__name__)
        narrowest = {}
        for (name, width), stage in sorted(stages._stages.items(), key=lambda item: -item[0][1]):
            narrowest[name] = (width, stage)  # the widest first, so the narrowest is kept
        for name, (width, stage) in sorted(narrowest.items()):
            ops, launching = body_ops(stage)
            rows.append(dict(model=who, stage=name, width=width, ops=ops, launching=launching))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="vanilla,sd,eagle,ss,mirror")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args(argv)
    pair = as_on_a_gpu(load_pair(target_device="cpu", draft_device="cpu", graphs="on"))
    for method in args.methods.split(","):
        generate(pair, PROMPT, method=method, max_new_tokens=args.max_new_tokens)
    print(pd.DataFrame(stage_rows(pair)).to_markdown(index=False))


if __name__ == "__main__":
    main()
