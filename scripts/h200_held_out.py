"""The what-if model on the app's six recorded H200 races: each method's speedup over vanilla as measured
in the race and as modelled on the ``h200-embedded`` profile.

    python -m scripts.h200_held_out [--profile h200-embedded] [--by-kind]

For each race (``app/recorded/nvidia-h200/*.json``) and method: the measured speedup, the method's
tokens/s over vanilla's in the same race (what the app's cards show: tokens over the recording's
``wall_s``), the modelled one (``whatif.summary``: vanilla modelled on the profile for the same prompt
and tokens, over the method's trace re-timed on it) and the model's relative error (modelled /
measured - 1); then per method pooled over the six races (summed tokens over summed seconds, both
sides). Prints a markdown table and writes ``docs/whatif-h200-held-out.csv``. ``--by-kind`` adds
each method's measured and modelled ms per span kind (``scripts.whatif_check.by_kind``).

The profile's stage costs come from gpu-check's replays, not from these runs; what it fitted (each
stage's ``context_ms``, EAGLE's ``eagle_head_eager``, the host's ``step_ms`` and ``phase_ms``:
``scripts.derive_h200_context``) it fitted on the graphs-on bench's ``-02`` prompts only, and these
races are that bench's ``-01`` prompts (``scripts.record_races --from-bench``): the whole profile is
held out here.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from app.replay import RECORDED, load_race
from mirror_sd.tools import whatif

RACES = RECORDED / "nvidia-h200"
CSV = Path(__file__).resolve().parents[1] / "docs" / "whatif-h200-held-out.csv"


def runs(folder: Path = RACES, profile: str = "h200-embedded") -> pd.DataFrame:
    """One row per (race, method): tokens, measured wall seconds, modelled seconds and modelled vanilla
    seconds, with vanilla's measured seconds in the same race."""
    prof, rows = whatif.load_profile(profile), []
    for path in sorted(folder.glob("*.json")):
        _, _, results = load_race(path)
        vanilla = results["vanilla"].metrics
        for method in (m for m in whatif.PLANS if m in results):
            r = results[method]
            s = whatif.summary(r.trace, prof)
            rows.append(dict(race=path.stem, method=method, tokens=r.metrics["new_tokens"], wall_s=r.metrics["wall_s"],
                             vanilla_tokens=vanilla["new_tokens"], vanilla_wall_s=vanilla["wall_s"],
                             modelled_s=s["seconds"], modelled_vanilla_s=s["vanilla_seconds"], trace=r.trace))
    return pd.DataFrame(rows)


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Measured and modelled speedup of summed rows (one run, or a method's runs pooled)."""
    measured = (df.tokens / df.wall_s) / (df.vanilla_tokens / df.vanilla_wall_s)
    modelled = (df.tokens / df.modelled_s) / (df.tokens / df.modelled_vanilla_s)
    return pd.DataFrame({"measured_speedup": measured, "modelled_speedup": modelled,
                         "error": modelled / measured - 1})


def held_out_table(folder: Path = RACES, profile: str = "h200-embedded") -> pd.DataFrame:
    """Per race and method, then per method pooled over the races (race "pooled"): race, method,
    measured_speedup, modelled_speedup, error (modelled / measured - 1)."""
    df = runs(folder, profile).drop(columns="trace")
    per_race = pd.concat([df[["race", "method"]], speedups(df)], axis=1)
    pooled = df.groupby("method", sort=False).sum(numeric_only=True)
    pooled = speedups(pooled).reset_index().assign(race="pooled")
    return pd.concat([per_race, pooled], ignore_index=True)[
        ["race", "method", "measured_speedup", "modelled_speedup", "error"]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-embedded", help="a shipped profile's name or a profile .json")
    parser.add_argument("--by-kind", action="store_true", help="also measured and modelled ms per span kind")
    args = parser.parse_args(argv)
    table = held_out_table(profile=args.profile)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    if args.profile == "h200-embedded":
        table.to_csv(CSV, index=False, float_format="%.4f")
        print(f"\nwritten: {CSV}")
    if args.by_kind:
        from scripts.whatif_check import by_kind

        rows = [dict(method=r.method, traces=[r.trace]) for r in runs(profile=args.profile).itertuples()]
        kinds = by_kind(rows, whatif.load_profile(args.profile))
        kinds.index = [f"{method} {getattr(kind, 'value', kind)}" for method, kind in kinds.index]
        print()
        print(kinds.to_markdown(floatfmt=(".1f", ".1f", ".1f", ".3f")))


if __name__ == "__main__":
    main()
