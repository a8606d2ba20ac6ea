"""What each kind of decoding step costs and commits, from a bench folder written with ``--traces``.

    python -m mirror_sd bench --methods vanilla,sd,mirror --out BENCH --traces BENCH/traces
    python -m scripts.step_costs BENCH

A step's wall time runs from its first span's start to the next step's first span (so the host's
gaps between steps count); the last step of a turn runs to its own last span. Mirror-SD's steps are
told apart by where their window came from (a hit's branch, a copy from the context, a fresh
fallback draft) and by their outcome (hit or miss); every other method's steps are one kind. The
table says which kinds of step pay for themselves: milliseconds per committed token, beside
vanilla's.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from scripts.whatif_check import read_runs


def step_kind(step) -> str:
    """'all' for a method without rendezvous; else 'WINDOW -> OUTCOME' for a Mirror-SD step."""
    r = step.rendezvous
    if r is None:
        return "all"
    window = "copied" if r.copied else "fallback" if r.fallback else "hit's branch"
    return f"{window} -> {'hit' if r.hit else 'miss'}"


def step_rows(method: str, trace) -> list[dict]:
    """One row per decoding step: its kind, wall milliseconds and committed tokens."""
    starts, ends = {}, {}
    for s in trace.spans:
        if s.step:  # step 0 is the prefill
            starts[s.step] = min(starts.get(s.step, s.start), s.start)
            ends[s.step] = max(ends.get(s.step, s.end), s.end)
    order = sorted(starts)
    rows = []
    for step in trace.steps:
        if step.index not in starts:
            continue
        i = order.index(step.index)
        end = starts[order[i + 1]] if i + 1 < len(order) else ends[step.index]
        rows.append(dict(method=method, kind=step_kind(step), ms=1000 * (end - starts[step.index]),
                         tokens=len(step.committed)))
    return rows


def step_costs(runs: list[dict]) -> pd.DataFrame:
    """Per (method, step kind): steps, share of the method's steps, ms per step, tokens per step, ms
    per token."""
    rows = [row for r in runs for trace in r["traces"] for row in step_rows(r["method"], trace)]
    frame = pd.DataFrame(rows)
    table = frame.groupby(["method", "kind"], sort=False).agg(steps=("ms", "size"), ms=("ms", "sum"),
                                                                tokens=("tokens", "sum"))
    table["share"] = table.steps / table.groupby(level="method").steps.transform("sum")
    table["ms per step"] = table.ms / table.steps
    table["tokens per step"] = table.tokens / table.steps
    table["ms per token"] = table.ms / table.tokens
    return table[["steps", "share", "ms per step", "tokens per step", "ms per token"]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="a bench --out folder, run with --traces BENCH/traces")
    args = parser.parse_args(argv)
    table = step_costs(read_runs(args.bench))
    print(table.to_markdown(floatfmt=("", "d", ".2f", ".1f", ".2f", ".1f")))


if __name__ == "__main__":
    main()
