"""Record the app's race on each example prompt, for the app to open with no model (app/replay.py).

    python -m scripts.record_races [--max-new-tokens 48] [--out app/recorded]

One race per example prompt (the first prompt of each Spec-Bench category, as the app's examples),
every method at its defaults, temperature 0, through ``app.race.run_race`` as the Run button does
(a discarded warm-up first). Each race is written to ``<out>/<category>.json`` with the hardware
and the date it ran on, and the load average at its end (other work on the machine slows every
method; the app says so); a table of each race's wall time is printed (what a visitor to a live
Space waits for one race). Run it alone on the machine for times a class can trust.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import datetime, timezone

import torch

from app.race import run_race, warm_up
from app.replay import RECORDED, save_race
from mirror_sd import METHODS, load_pair
from mirror_sd.bench import DEFAULT_PROMPTS, cpu_model, first_per_category, read_prompts
from mirror_sd.devices import cpu_cores, hardware_name


def hardware(pair) -> str:
    """The machine the race ran on: the GPUs its lanes used, else the CPU's model and cores."""
    gpus = sorted({hardware_name(d) for lane in (pair.target_lane, pair.draft_lane) for d in lane.devices
                   if d.type != "cpu"})
    return ", ".join(gpus) if gpus else f"{cpu_model()}, {cpu_cores()} CPU cores"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48, help="as the app's default (48)")
    parser.add_argument("--out", default=str(RECORDED), help="folder for the JSON files (default app/recorded)")
    args = parser.parse_args()
    pair = load_pair()
    date = f"{datetime.now(timezone.utc):%Y-%m-%d}"
    warm_up(pair)  # once, before the first race's clock starts
    print("| prompt | race s | " + " | ".join(f"{m} s" for m in METHODS) + " |")
    print("|---|---:|" + "---:|" * len(METHODS))
    for item in first_per_category(read_prompts(DEFAULT_PROMPTS), 1):
        prompt = item["turns"][0]
        start = time.perf_counter()
        for results in run_race(pair, prompt, list(METHODS), threading.Event(), max_new_tokens=args.max_new_tokens):
            pass
        race_s = time.perf_counter() - start
        meta = dict(category=item["category"], prompt_id=item["id"], hardware=hardware(pair), date=date,
                    torch=torch.__version__, max_new_tokens=args.max_new_tokens, temperature=0.0,
                    race_s=round(race_s, 2), cores=cpu_cores(),
                    load_average=round(os.getloadavg()[0], 2),
                    command="python -m scripts.record_races")
        path = save_race(f"{args.out}/{item['category']}.json", prompt, results, meta)
        walls = " | ".join(f"{r.metrics.get('wall_s', 0):.1f}" for r in results.values())
        print(f"| {item['id']} | {race_s:.1f} | {walls} |  ({path}, {path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
