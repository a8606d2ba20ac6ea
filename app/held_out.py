"""The what-if model checked against measured runs it was not fitted on: the app's six races recorded
on an H200 (app/recorded/nvidia-h200/), each method's speedup over vanilla as measured in the race and
as modelled on the ``h200-embedded`` profile, which was fitted on other prompts of the same bench
(mirror_sd/tools/profiles/h200-embedded.json says which). ``python -m scripts.h200_held_out`` prints
it and writes docs/whatif-h200-held-out.csv; the What if tab shows it under that profile.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from mirror_sd.tools import whatif

from .replay import RECORDED, load_race

RACES = RECORDED / "nvidia-h200"
PROFILE = "h200-embedded"  # the profile these races check


def runs(folder: Path = RACES, profile: str = PROFILE) -> pd.DataFrame:
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


@functools.cache
def held_out_table(folder: Path = RACES, profile: str = PROFILE) -> pd.DataFrame:
    """Per race and method, then per method pooled over the races (race "pooled"): race, method,
    measured_speedup, modelled_speedup, error (modelled / measured - 1). Computed once per folder and
    profile (re-timing the races takes a second or two); callers read it, never change it."""
    df = runs(folder, profile).drop(columns="trace")
    per_race = pd.concat([df[["race", "method"]], speedups(df)], axis=1)
    pooled = df.groupby("method", sort=False).sum(numeric_only=True)
    pooled = speedups(pooled).reset_index().assign(race="pooled")
    return pd.concat([per_race, pooled], ignore_index=True)[
        ["race", "method", "measured_speedup", "modelled_speedup", "error"]]


def pooled(profile: str = PROFILE) -> pd.DataFrame:
    """Per method, pooled over the six races: measured and modelled speedup and the error."""
    table = held_out_table(profile=profile)
    return table[table.race == "pooled"].set_index("method")


def worst(profile: str = PROFILE, limit: float = 0.15) -> pd.DataFrame:
    """The (race, method) pairs the model misses by more than ``limit``."""
    table = held_out_table(profile=profile)
    return table[(table.race != "pooled") & (table.error.abs() > limit)]


def largest_gap(race: str, method: str, profile: str = PROFILE) -> tuple[str, float, float]:
    """Where the model misses one race's run most: the piece of work whose measured time exceeds its
    modelled time the most, as (kind, measured ms, modelled ms)."""
    _, _, results = load_race(RACES / f"{race}.json")
    prof = whatif.load_profile(profile)
    work, ms = max(whatif.measured_work([results[method].trace]), key=lambda p: p[1] - p[0].ms(prof))
    return str(work.kind), ms, work.ms(prof)
