"""How much speculation pays depends on the kind of text: the recorded races of the example prompts
(one per Spec-Bench category, on the CPU their meta names) give each kind's acceptance, so the page can start on a
typical prompt and say after a race how its prompt compares.

Acceptance here is τ (tokens committed per step) averaged over the speculative methods of a race:
every method drafts for the same target, so one prompt's τs rise and fall together.
"""
from __future__ import annotations

import functools
from statistics import mean

from .replay import RECORDED, category_label, load_race


def race_tau(results: dict) -> float | None:
    """Mean τ of the race's speculative methods that finished with numbers (None: none did)."""
    taus = [r.metrics["mean_accepted"] for m, r in results.items()
            if m != "vanilla" and getattr(r, "metrics", None) and r.finished in ("eos", "length")]
    return mean(taus) if taus else None


@functools.cache
def recorded_taus() -> tuple[tuple[str, str, float], ...]:
    """(category, prompt, mean τ) of each top-level recorded race (the CPU its meta names), easiest last."""
    rows = []
    for path in sorted(RECORDED.glob("*.json")):  # the top level only: the subfolders ran on other machines
        prompt, meta, results = load_race(path)
        tau = race_tau(results)
        if tau is not None:
            rows.append((meta.get("category", path.stem), prompt, tau))
    return tuple(sorted(rows, key=lambda row: row[2]))


def typical_prompt(fallback: str) -> str:
    """The example prompt whose drafts accept the middle amount among the recorded races (the lower
    middle of an even count): a first race that shows what speculation usually does."""
    rows = recorded_taus()
    return rows[(len(rows) - 1) // 2][1] if rows else fallback


def acceptance_note(results: dict) -> str:
    """A sentence after a race: this prompt's τ against the recorded example prompts' range."""
    tau, rows = race_tau(results), recorded_taus()
    if tau is None or len(rows) < 2:
        return ""
    (low_kind, _, low), (high_kind, _, high) = rows[0], rows[-1]
    below = sum(t < tau for *_, t in rows)
    place = ("lower than on any" if below == 0 else "higher than on every" if below == len(rows)
             else f"higher than on {below} of the {len(rows)}")
    return (f" **This prompt's drafts:** τ {tau:.2f} averaged over the speculative methods, {place} recorded example "
            f"prompts (from {low:.2f} for {category_label(low_kind)} to {high:.2f} for {category_label(high_kind)}): "
            "how much speculation pays depends on the kind of text, since predictable text is drafted right more "
            "often.")
