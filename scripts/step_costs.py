"""What each kind of decoding step costs and commits, from a bench folder written with ``--traces``.

    python -m mirror_sd bench --methods vanilla,sd,mirror --out BENCH --traces BENCH/traces
    python -m scripts.step_costs BENCH

Each trace's steps (``Trace.step_costs``: a step's wall time runs to the next step's first span, so
the host's gaps count) are grouped by method and kind: Mirror-SD's by where their window came from
(a hit's branch, a copy from the context, a fresh fallback draft) and by their outcome (hit or
miss); every other method's steps are one kind. The table says which kinds of step pay for
themselves: milliseconds per committed token, beside vanilla's; and how much of a step no lane
worked (idle: the host's own time, choosing, launching and reading).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mirror_sd.trace import step_cost_table
from scripts.whatif_check import read_runs


def step_costs(runs: list[dict]) -> pd.DataFrame:
    """Per (method, step kind) over every run's traces: ``trace.step_cost_table``."""
    return step_cost_table(trace for r in runs for trace in r["traces"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="a bench --out folder, run with --traces BENCH/traces")
    args = parser.parse_args(argv)
    table = step_costs(read_runs(args.bench))
    print(table.to_markdown(floatfmt=("", "d", ".2f", ".1f", ".2f", ".1f")))


if __name__ == "__main__":
    main()
