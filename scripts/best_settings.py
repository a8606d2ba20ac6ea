"""Each method's best measured setting in one GPU run's folder, and issue 32's goals at those settings.

    python -m scripts.best_settings docs/gpu/h200-2026-11-27

The folder is what a GPU session commits (docs/gpu/<card>-<date>/): gpu-check's graphs-on bench at
the default settings (``bench-graphs-on/summary.csv``) and the sweeps of ``scripts.gpu_bundle``'s
later call (``sweeps/*/sweep.csv``, one row per value, with its method and fixed options; an older
sweep's folder name says them: ``<method>-<option>[-<note>]``). Every bench row and
sweep row of a method is a setting it was measured at; its best is the fastest against vanilla.
Each sweep times vanilla beside its own values, so a speedup is against that sweep's vanilla runs.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mirror_sd.tools.gpu_check import goals_table

COLUMNS = ["speedup", "tokens_per_s", "mean_accepted", "hit_rate", "overlap", "equal_to_vanilla"]


def measured_settings(folder: Path) -> pd.DataFrame:
    """One row per (method, setting) in ``folder``: its bench's defaults, then every sweep value."""
    bench = pd.read_csv(folder / "bench-graphs-on" / "summary.csv")
    frames = [bench.assign(setting="defaults")[["method", "setting", *COLUMNS]]]
    for csv in sorted(folder.glob("sweeps/*/sweep.csv")):
        sweep = pd.read_csv(csv)
        option = sweep.columns[0]
        if "fixed" in sweep:  # the sweep says its method and the options it fixed
            method, fixed = sweep["method"].iloc[0], sweep["fixed"].iloc[0]
            fixed = fixed if isinstance(fixed, str) else ""  # an empty column reads as NaN
        else:  # an older sweep: the folder's name says them, <method>-<option>[-<note>]
            method, _, note = csv.parent.name.partition("-")
            fixed = note.removeprefix(option).strip("-")
        setting = sweep[option].map(lambda v: f"{option} {v:g}" + (f" ({fixed})" if fixed else ""))
        frames.append(sweep.assign(method=method, setting=setting)[["method", "setting", *COLUMNS]])
    return pd.concat(frames, ignore_index=True)


def best_settings(folder: Path) -> pd.DataFrame:
    """Each method's fastest measured setting (vanilla: the bench's), one row per method."""
    settings = measured_settings(folder)
    best = settings.loc[settings.groupby("method")["speedup"].idxmax()]
    order = ["vanilla", "sd", "eagle", "ss", "mirror"]
    return best.set_index("method").reindex([m for m in order if m in set(best["method"])])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a GPU run's folder, such as docs/gpu/h200-2026-11-27")
    args = parser.parse_args(argv)
    best = best_settings(args.folder)
    print(best[["setting", "speedup", "mean_accepted", "hit_rate", "overlap"]].round(3).to_markdown())
    print()
    print("\n".join(goals_table(best)))


if __name__ == "__main__":
    main()
