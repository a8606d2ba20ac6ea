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
    """Add one finished race's numbers to ``runs`` ({method: [numbers of each run]}): tokens/s, tau and
    speedup over vanilla in that same race. Methods that failed or were stopped are left out."""
    vanilla = current.get("vanilla")
    base = vanilla.metrics.get("tokens_per_s") if vanilla and vanilla.finished in ("eos", "length") else None
    for name, r in current.items():
        if r.finished not in ("eos", "length") or not r.metrics:
            continue
        tps = r.metrics["tokens_per_s"]
        runs.setdefault(name, []).append(dict(tokens_per_s=tps, tau=r.metrics["mean_accepted"],
                                              speedup=tps / base if base else None))
    return runs


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
