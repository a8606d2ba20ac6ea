"""The what-if model's held-out check, taken apart: from a bench folder written with ``--traces``.

    python -m mirror_sd bench --methods vanilla,sd,eagle,ss,mirror --out BENCH --traces BENCH/traces
    python -m scripts.whatif_check BENCH

Refits the profile on half the prompts exactly as the bench's own check does
(``whatif.held_out_check``), prints its table, then, over the held-out half, each method's measured
and modelled milliseconds per span kind ("_wall": the run from its first span to its last), so a
method the model misprices shows which of its stages is off.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mirror_sd.tools import whatif
from mirror_sd.trace import Trace


def read_runs(folder: Path) -> list[dict]:
    """The bench's runs (results.csv) with their traces (traces/METHOD-ID-turnK.json)."""
    runs = []
    for r in pd.read_csv(folder / "results.csv").itertuples():
        files = sorted((folder / "traces").glob(f"{r.method}-{r.id}-turn*.json".replace("/", "_")))
        runs.append(dict(method=r.method, id=r.id, category=r.category, new_tokens=r.new_tokens, wall_s=r.wall_s,
                         traces=[Trace.from_json(f.read_text()) for f in files]))
    return runs


def by_kind(runs: list[dict], profile) -> pd.DataFrame:
    """Measured and modelled ms per (method, span kind) over the given runs."""
    rows = []
    for r in runs:
        for trace in r["traces"]:
            rows += [dict(method=r["method"], kind=w.kind, measured=ms, modelled=w.ms(profile))
                     for w, ms in whatif.measured_work([trace])]
            rows.append(dict(method=r["method"], kind="_wall", measured=1000 * whatif.measured_seconds(trace),
                             modelled=1000 * whatif.modelled_seconds(trace, profile)))
    table = pd.DataFrame(rows).groupby(["method", "kind"], sort=False).sum()
    table["modelled / measured"] = table.modelled / table.measured
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="a bench --out folder, run with --traces BENCH/traces")
    args = parser.parse_args(argv)
    runs = read_runs(args.bench)
    profile, table = whatif.held_out_check(runs)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    print(f"\nthe host's time fitted: {profile.step_ms:.3f} ms per step, {profile.phase_ms:.3f} ms per phase")
    held = whatif.held_out_ids(runs)
    print()
    print(by_kind([r for r in runs if r["id"] in held], profile).to_markdown(floatfmt=(".1f", ".1f", ".1f", ".3f")))


if __name__ == "__main__":
    main()
