"""Record the app's race on each example prompt, for the app to open with no model (app/replay.py).

    python -m scripts.record_races [--max-new-tokens 48] [--out app/recorded]
    python -m scripts.record_races --options sd:gamma=3 --options mirror:exit_layer=14,branch_budget=4 \
        --label "at best settings" --out app/recorded/cpu-best
    python -m scripts.record_races --from-bench DIR --hardware "NVIDIA H200" --date 2026-11-26 \
        --out app/recorded/nvidia-h200

One race per example prompt (the first prompt of each Spec-Bench category, as the app's examples),
every method at its defaults (or at ``--options``: a method's own settings, as the app's Advanced
drawer sets them, named in the recording and in its label in the app's dropdown), temperature 0,
through ``app.race.run_race`` as the Run button does (a discarded warm-up first). Each race is
written to ``<out>/<category>.json`` with the hardware and the date it ran on, and the load
average at its end (other work on the machine slows every
method; the app says so); a table of each race's wall time is printed (what a visitor to a live
Space waits for one race). Run it alone on the machine for times a class can trust.

``--from-bench DIR`` records no race here: it makes the races from a bench that ran elsewhere with
``--traces`` (gpu-check's graphs-on bench, on a GPU this machine lacks): each example prompt's
first turn, every method's trace as it was measured there, its metrics derived from the trace as
the engine derives them (the wall clock: the end of the run's last span), and the tokens' text
from the embedded tokenizer.
"""
from __future__ import annotations

import argparse
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from app.race import Result, run_race, warm_up
from app.replay import RECORDED, save_race
from app.tokens import collect_pieces
from mirror_sd import METHODS, load_pair
from mirror_sd.devices import cpu_cores, hardware_name
from mirror_sd.engine import compute_metrics
from mirror_sd.models.loading import embedded_model_dir, load_tokenizer
from mirror_sd.tools.bench import DEFAULT_PROMPTS, cpu_model, first_per_category, read_prompts
from mirror_sd.trace import Trace


def hardware(pair) -> str:
    """The machine the race ran on: the GPUs its lanes used, else the CPU's model and cores."""
    gpus = sorted({hardware_name(d) for lane in (pair.target_lane, pair.draft_lane) for d in lane.devices
                   if d.type != "cpu"})
    return ", ".join(gpus) if gpus else f"{cpu_model()}, {cpu_cores()} CPU cores"


def parse_options(given: list[str]) -> dict[str, dict]:
    """{method: {option: value}} from 'method:name=value,name=value' strings, each value checked against
    the method's own option (its type and range)."""
    options: dict[str, dict] = {}
    for text in given:
        method, _, pairs = text.partition(":")
        if method not in METHODS or not pairs:
            raise SystemExit(f"error: --options {text!r}: give METHOD:NAME=VALUE[,NAME=VALUE] with a method of "
                             f"{', '.join(METHODS)}")
        known = {opt.name: opt for opt in METHODS[method].options}
        for pair in pairs.split(","):
            name, _, value = pair.partition("=")
            if name not in known:
                raise SystemExit(f"error: --options {text!r}: {method} has no option {name!r} "
                                 f"(it has {', '.join(known) or 'none'})")
            try:
                options.setdefault(method, {})[name] = known[name].check(float(value))
            except ValueError:
                raise SystemExit(f"error: --options {text!r}: {name} needs a number, got {value!r}") from None
            except Exception as e:  # noqa: BLE001  the option's own range check (MirrorSDError)
                raise SystemExit(f"error: --options {text!r}: {e}") from None
    return options


def settings_text(options: dict[str, dict]) -> str:
    """The settings in words, for the dropdown and the status line: 'mirror exit layer 14, branch budget 4'."""
    return "; ".join(f"{method} " + ", ".join(f"{name.replace('_', ' ')} {value:g}" for name, value in chosen.items())
                     for method, chosen in options.items())


def races_from_bench(bench: Path, meta: dict, decode) -> list[tuple[str, dict, dict[str, Result]]]:
    """(prompt, meta, {method: Result}) per example prompt, from ``bench``/traces (bench --traces)."""
    races = []
    for item in first_per_category(read_prompts(DEFAULT_PROMPTS), 1):
        results = {}
        for method in METHODS:
            path = bench / "traces" / f"{method}-{item['id']}-turn1.json"
            if not path.exists():
                raise SystemExit(f"error: {path} is missing: run the bench with --traces on every method")
            trace = Trace.from_json(path.read_text(encoding="utf-8"))
            new_tokens = sum(len(step.committed) for step in trace.steps)
            wall_s = max(span.end for span in trace.spans)
            finished = "length" if new_tokens >= trace.meta["max_new_tokens"] else "eos"
            results[method] = Result(method, trace, compute_metrics(trace, new_tokens, wall_s), finished=finished,
                                     pieces=collect_pieces(trace, decode))
        first = results["vanilla"].trace.meta
        races.append((item["turns"][0], dict(meta, category=item["category"], prompt_id=item["id"],
                                             max_new_tokens=first["max_new_tokens"],
                                             temperature=first["temperature"], graphs=first.get("graphs")), results))
    return races


def record_from_bench(args):
    tokenizer = load_tokenizer(embedded_model_dir())
    meta = dict(hardware=args.hardware, date=args.date, wall="the end of each run's last span",
                command=f"python -m scripts.record_races --from-bench {args.from_bench}",
                note="Measured in a bench elsewhere (python -m mirror_sd gpu-check), not in this app.")
    for prompt, race_meta, results in races_from_bench(Path(args.from_bench), meta,
                                                       lambda ids: tokenizer.decode(ids, skip_special_tokens=True)):
        path = save_race(f"{args.out}/{race_meta['category']}.json", prompt, results, race_meta)
        print(f"wrote {path} ({path.stat().st_size // 1024} KB)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=48, help="as the app's default (48)")
    parser.add_argument("--out", default=str(RECORDED), help="folder for the JSON files (default app/recorded)")
    parser.add_argument("--from-bench", help="make the races from this bench output's traces/ instead of running")
    parser.add_argument("--hardware", help="with --from-bench: the machine the bench ran on")
    parser.add_argument("--date", help="with --from-bench: the day the bench ran (YYYY-MM-DD)")
    parser.add_argument("--options", action="append", default=[], metavar="METHOD:NAME=VALUE[,NAME=VALUE]",
                        help="a method's own settings for every race (repeat for each method); the others at "
                             "their defaults")
    parser.add_argument("--label", default="at best settings",
                        help="with --options: how the app's dropdown names these races, before the settings")
    args = parser.parse_args()
    if args.from_bench:
        if not (args.hardware and args.date):
            parser.error("--from-bench needs --hardware and --date (where and when the bench ran)")
        return record_from_bench(args)
    options = parse_options(args.options)
    if options and Path(args.out).resolve() == RECORDED.resolve():
        parser.error("--options needs an --out of its own (e.g. app/recorded/cpu-best): the default races stay")
    pair = load_pair()
    date = f"{datetime.now(timezone.utc):%Y-%m-%d}"
    began = time.perf_counter()
    warm_up(pair)  # once, before the first race's clock starts
    print("| prompt | race s | " + " | ".join(f"{m} s" for m in METHODS) + " |")
    print("|---|---:|" + "---:|" * len(METHODS))
    for item in first_per_category(read_prompts(DEFAULT_PROMPTS), 1):
        prompt = item["turns"][0]
        start = time.perf_counter()
        for results in run_race(pair, prompt, list(METHODS), threading.Event(), max_new_tokens=args.max_new_tokens,
                                options=options):
            pass
        race_s = time.perf_counter() - start
        failed = [f"{r.method}: {r.error}" for r in results.values() if r.error or r.finished not in ("eos", "length")]
        if failed:
            raise SystemExit(f"error: {item['id']} not recorded, a method did not finish: {'; '.join(failed)}")
        meta = dict(category=item["category"], prompt_id=item["id"], hardware=hardware(pair), date=date,
                    torch=torch.__version__, dtype=str(pair.dtype), max_new_tokens=args.max_new_tokens,
                    temperature=0.0,
                    race_s=round(race_s, 2), cores=cpu_cores(),
                    load_average=round(os.getloadavg()[0], 2),
                    command="python -m scripts.record_races"
                    + "".join(f" --options {m}:" + ",".join(f"{k}={v:g}" for k, v in o.items())
                              for m, o in options.items()))
        if options:
            meta.update(options=options, settings=f"{args.label}: {settings_text(options)}")
        path = save_race(f"{args.out}/{item['category']}.json", prompt, results, meta)
        walls = " | ".join(f"{r.metrics.get('wall_s', 0):.1f}" for r in results.values())
        print(f"| {item['id']} | {race_s:.1f} | {walls} |  ({path}, {path.stat().st_size // 1024} KB)")
    print(f"recorded in {time.perf_counter() - began:.0f} s, warm-up included")


if __name__ == "__main__":
    main()
