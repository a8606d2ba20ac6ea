"""How many PyTorch operations each method's steps run one by one, outside its stages' bodies.

    python -m mirror_sd.tools.host_ops --methods vanilla,sd,eagle,ss,mirror

On a GPU with CUDA graphs (``--graphs on``) a stage's forward is one graph launch, but every
operation around it (copying a window into the stage's buffers, growing a draft tree, building
masks, picking tokens) is launched by the host one at a time, at some microseconds each whatever
its size. So the count of those operations per step is what makes a method host-bound there, and
it is the same on any device: this runs on the CPU (the stages' bodies run eagerly there, and are
left out of the count) and counts, on every lane's thread, the operations PyTorch dispatches
(views included: they cost the host too). One prompt, T = 0, each method warmed up once first;
Mirror-SD's steps queued, as they are by default where both lanes are CUDA devices.

It also times the host's milliseconds per step outside the stages' replays (``host_ms``), with
queued work on the decoding thread as a CUDA lane runs it: Python, those operations and the
hand-offs to lane threads, on this CPU.
"""
from __future__ import annotations

import argparse
import collections
import threading
import time

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mirror_sd import generate, load_pair
from mirror_sd import devices
from mirror_sd.devices import cpu_worker
from mirror_sd.models import stages

PROMPT = "Explain how a bicycle stays upright."


def as_on_a_gpu(pair):
    """``pair`` with Mirror-SD's steps queued, as they are where both lanes are CUDA devices."""
    pair.queue_steps = "on"
    return pair


_in_body = threading.local()  # .depth: how many stage bodies this thread is inside


class OpCounter(TorchDispatchMode):
    """Counts the operations dispatched on the thread it is entered on, outside stage bodies."""

    def __init__(self, counts: collections.Counter):
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not getattr(_in_body, "depth", 0):
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


_replays: list[tuple[float, float]] = []  # (start, end) of every stage replay, on the perf_counter clock


def replay_outside_the_count(replay):
    def counted(self):
        _in_body.depth = getattr(_in_body, "depth", 0) + 1
        start = time.perf_counter()
        try:
            return replay(self)
        finally:
            _in_body.depth -= 1
            _replays.append((start, time.perf_counter()))
    return counted


def count_ops(pair, method: str, max_new_tokens: int, prompt: str = PROMPT, raw: bool = False,
              workers: int = 2, options: dict | None = None) -> dict:
    """Operations per step of one run of ``method`` with ``options`` (after a warm-up run), and the
    most frequent. Count them with ``Stage.replay`` wrapped in :func:`replay_outside_the_count`."""
    options = options or {}
    generate(pair, prompt, method=method, max_new_tokens=8, raw=raw, **options)
    counts = collections.Counter()
    counters = [OpCounter(counts) for _ in range(workers + 1)]  # the lanes' worker threads and this one
    for i in range(workers):
        cpu_worker(i).submit(counters[i].__enter__).result()
    try:
        with counters[-1]:
            out = generate(pair, prompt, method=method, max_new_tokens=max_new_tokens, raw=raw, **options)
    finally:
        for i in range(workers):
            cpu_worker(i).submit(counters[i].__exit__, None, None, None).result()
    steps = len(out.trace.steps) - 1  # after the prefill
    top = ", ".join(f"{name} {n / steps:.0f}" for name, n in counts.most_common(6))
    return dict(method=method, steps=steps, ops_per_step=round(sum(counts.values()) / steps, 1), most=top)


def queue_on_this_thread(self, kind, fn, *args, trace=None, label="", step=None, tokens=0, after=None, **kwargs):
    """``Lane.queue`` as a CUDA lane runs it, on the calling thread (a CPU lane's goes to its worker)."""
    start = time.perf_counter()
    with torch.inference_mode(), devices.single_threaded():  # no OpenMP pool of its own beside the lanes'
        result = fn(*args, **kwargs)
    return result, devices.Queued(self, trace, kind, label, step, tokens, None, start, time.perf_counter(), None)


def host_ms(pair, method: str, max_new_tokens: int, prompt: str = PROMPT, options: dict | None = None,
            runs: int = 3) -> float:
    """The host's milliseconds per step outside stage replays: from the end of a run's prefill to the
    end of its last step (its spans), less the time inside ``Stage.replay`` then, per step; the
    least of ``runs`` runs (after a warm-up run). With ``Stage.replay`` wrapped in
    :func:`replay_outside_the_count`, and no count running: the host's own work (Python, the
    operations around the stages, the hand-offs between threads) on this CPU, a proxy for what a
    GPU's host spends between its launches. Queued work runs on the calling thread, as on CUDA lanes
    (``queue_on_this_thread``)."""
    options = options or {}
    generate(pair, prompt, method=method, max_new_tokens=8, **options)
    best = float("inf")
    for _ in range(runs):
        _replays.clear()
        out = generate(pair, prompt, method=method, max_new_tokens=max_new_tokens, **options)
        t0, spans = out.trace.t0, out.trace.spans
        begin = t0 + max(s.end for s in spans if s.step == 0)
        end = t0 + max(s.end for s in spans)
        inside = sum(max(0.0, min(b, end) - max(a, begin)) for a, b in _replays)
        best = min(best, 1000 * (end - begin - inside) / (len(out.trace.steps) - 1))
    return round(best, 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="vanilla,sd,eagle,ss,mirror")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    stages.Stage.replay = replay_outside_the_count(stages.Stage.replay)
    pair = as_on_a_gpu(load_pair(target_device="cpu", draft_device="cpu", graphs="on"))
    rows = [count_ops(pair, m, args.max_new_tokens) for m in args.methods.split(",")]
    devices.Lane.queue = queue_on_this_thread
    for row in rows:
        row["host_ms_per_step"] = host_ms(pair, row["method"], args.max_new_tokens)
    print(pd.DataFrame(rows).to_markdown(index=False))


if __name__ == "__main__":
    main()
