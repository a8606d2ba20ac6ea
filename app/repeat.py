"""A race run several times: each method's numbers as a median and a range, and a note when the machine
looked busy (other visitors' races were waiting, the load average was well above the cores the race
itself keeps busy, or the runs disagree widely).

One run's tokens/s moves by several percent with whatever else the machine does; a median over a few
runs, with its range shown, says how much of a difference between methods is real.
"""
from __future__ import annotations

from statistics import median

WIDE = 0.25  # (highest - lowest) / median tokens/s above this: the runs disagree widely
LOADED = 1.5  # the 1-minute load average above this many times the cores: other work shared the machine


def record(runs: dict[str, list[dict]], current: dict) -> dict[str, list[dict]]:
    """Add one finished race's numbers to ``runs`` ({method: [the engine's metrics of each run]}).
    Methods that failed or were stopped are left out."""
    for name, r in current.items():
        if r.finished in ("eos", "length") and r.metrics:
            runs.setdefault(name, []).append(dict(r.metrics))
    return runs


def middle(result, key: str):
    """A result's number: the median over its repeated runs when there were several, else its own
    (None where the method has no such number; a metric that is not a number, its own)."""
    values = [n[key] for n in result.runs or [] if isinstance(n.get(key), (int, float))]
    return median(values) if len(values) > 1 else result.metrics.get(key)


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, lowest, highest)."""
    return median(values), min(values), max(values)


def wide(runs: dict[str, list[dict]]) -> list[str]:
    """Methods whose tokens/s range over the runs is wide compared with its median."""
    out = []
    for name, numbers in runs.items():
        if len(numbers) > 1:
            mid, low, high = spread([n["tokens_per_s"] for n in numbers])
            if mid and (high - low) / mid > WIDE:
                out.append(name)
    return out


def busy_note(runs: dict[str, list[dict]], others_waited: bool, titles: dict[str, str],
              load: tuple[float, int] | None = None) -> str:
    """One line when the numbers are likely disturbed, else ''. ``load``: (1-minute load average, cores)."""
    if others_waited:
        return ("Note: other visitors' races were waiting while this one ran, so the machine was busy; "
                "speeds may be lower and noisier than on an idle machine.")
    if load and load[0] > LOADED * load[1]:
        return (f"Note: the machine was busy with other work (load average {load[0]:.1f} on {load[1]} cores), "
                "so speeds may be lower and noisier than on an idle machine.")
    noisy = wide(runs)
    if noisy:
        names = ", ".join(titles.get(n, n) for n in noisy)
        return (f"Note: the runs disagree by more than {100 * WIDE:.0f}% for {names}: the machine was probably "
                "busy with other work, so read those numbers as rough.")
    return ""
