"""Where the decoding thread's time goes, line by line, sampled while the methods decode.

    python -m mirror_sd.tools.host_samples --methods vanilla,eagle,mirror --graphs on

On a GPU with CUDA graphs a step is host-bound wherever the GPU idles between its stages: the
traces show those gaps (the bench's step costs), not what the host did in them. This samples the
decoding thread's stack every ``--period-ms`` while each method decodes the bench's prompts (one
per category, T = 0, after one warm-up run) on this machine's default devices, and charges each
sample to the innermost line of the engine's own code (``mirror_sd/``) on that stack: the line
that was running, or that was waiting in PyTorch, CUDA or a lock. Per method it prints each line's
share of the decoding time and its milliseconds per step; a line waiting for the GPU
(``Queued.record``'s synchronize) is the GPU's time, the others the host's. A sample that finds the
thread outside the engine (the bench loop, Python's import machinery) is charged to "(outside)".

The thread switch interval is set to the period while sampling, so that the sampler gets the
interpreter lock that often even while the decoding thread runs Python; that slows the decoding
somewhat, the same for every method.
"""
from __future__ import annotations

import argparse
import collections
import sys
import threading
import time
from pathlib import Path

import pandas as pd

from mirror_sd import generate, load_pair
from mirror_sd.tools.bench import DEFAULT_PROMPTS, first_per_category, read_prompts

ENGINE, SAMPLER = str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve())  # this file is no engine line
OUTSIDE = "(outside)"
AS_FOUND_BEST = {"mirror exit 14": ("mirror", dict(exit_layer=14, branch_budget=4))}  # the H200's best so far


def innermost_engine_line(frame) -> str:
    """'path:line function' of the innermost frame in mirror_sd/ on ``frame``'s stack, or OUTSIDE."""
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(ENGINE) and path != SAMPLER:
            return f"{path[len(ENGINE) + 1:]}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return OUTSIDE


class StackSampler:
    """Counts, every ``period_s``, the innermost engine line of ``thread_id``'s stack (a context manager)."""

    def __init__(self, thread_id: int, period_s: float):
        self.thread_id, self.period_s = thread_id, period_s
        self.counts: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stack-sampler", daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            frame = sys._current_frames().get(self.thread_id)
            self.counts[innermost_engine_line(frame)] += 1
            time.sleep(self.period_s)

    def __enter__(self):
        self._interval = sys.getswitchinterval()
        sys.setswitchinterval(self.period_s)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._interval)


def sample_method(pair, method: str, prompts: list, max_new_tokens: int, options: dict | None = None,
                  period_s: float = 0.0002, top: int = 15) -> pd.DataFrame:
    """The ``top`` lines of one method's decoding by share of samples, with ms per step (the
    runs' wall time over their decoding steps, times the share), and the rest summed in one row."""
    options = options or {}
    generate(pair, prompts[0], method=method, max_new_tokens=8, **options)  # warm-up: captures, first calls
    steps = 0
    with StackSampler(threading.get_ident(), period_s) as sampler:
        start = time.perf_counter()
        for prompt in prompts:
            out = generate(pair, prompt, method=method, max_new_tokens=max_new_tokens, **options)
            steps += len(out.trace.steps) - 1  # after the prefill
        wall_ms = 1000 * (time.perf_counter() - start)
    total, most = sum(sampler.counts.values()), sampler.counts.most_common(top)
    rows = [dict(line=line, share=n / total, ms_per_step=wall_ms * n / total / steps) for line, n in most]
    rest = total - sum(n for _, n in most)
    rows.append(dict(line="(every other line)", share=rest / total, ms_per_step=wall_ms * rest / total / steps))
    return pd.DataFrame(rows).round(3)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="vanilla,eagle,mirror,mirror exit 14",
                        help=f"methods, and settings named in {sorted(AS_FOUND_BEST)}")
    parser.add_argument("--graphs", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--period-ms", type=float, default=0.2)
    args = parser.parse_args(argv)
    pair = load_pair(graphs=args.graphs)
    prompts = [item["turns"][0] for item in first_per_category(read_prompts(DEFAULT_PROMPTS), 1)]  # first turns
    for name in args.methods.split(","):
        method, options = AS_FOUND_BEST.get(name, (name, {}))
        table = sample_method(pair, method, prompts, args.max_new_tokens, options, args.period_ms / 1000)
        print(f"\n## {name} ({pair.target_lane.label}; {pair.draft_lane.label})\n")
        print(table.to_markdown(index=False))


if __name__ == "__main__":
    main()
