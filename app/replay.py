"""Replay of a finished race, side by side, at the speed each method was measured to decode; and
recorded races: races of the example prompts saved in ``app/recorded/`` that open with no model
(those in a subfolder ran on another machine: ``nvidia-h200/``, made from gpu-check's bench on an
H200 by ``python -m scripts.record_races --from-bench``).

A step counts as committed when its last span ends (its rendezvous or verification), so the
replay shows every method's text growing exactly as fast as it grew in its own run.

A recorded race is one JSON file: the prompt, where and when it ran (``meta``: hardware, date,
settings) and per method its trace (``Trace.to_dict``), the engine's metrics and the text of every
token the trace mentions, so the cards, the timeline and the step-through draw it with no
tokenizer and no model. ``python -m scripts.record_races`` writes them.
"""
from __future__ import annotations

import json
from pathlib import Path

from mirror_sd.trace import Trace

from .cards import baseline, card_html
from .lanes import lanes_line, one_processor
from .page import Page
from .race import Result

RECORDED = Path(__file__).parent / "recorded"
STEP_KEYS = ("index", "committed", "origins")  # a step's fields with no default: always saved


def commit_times(trace: Trace) -> dict[int, float]:
    """Step index -> seconds since the run began when the step's last span ended."""
    times: dict[int, float] = {}
    for s in trace.spans:
        if s.step is not None:
            times[s.step] = max(times.get(s.step, 0.0), s.end)
    return times


def last_step_at(trace: Trace, t: float) -> int:
    """The last step committed by time ``t`` (seconds), or -1 before the first."""
    times = commit_times(trace)
    done = [s.index for s in trace.steps if times.get(s.index, float("inf")) <= t]
    return max(done, default=-1)


def frame_times(traces: list[Trace], fps: float = 8.0) -> list[float]:
    """Replay clock readings (seconds) from 0 to the end of the slowest run, ``fps`` per second."""
    end = max((s.end for t in traces for s in t.spans), default=0.0)
    n = int(end * fps) + 1
    return [i / fps for i in range(n)] + [end]


def save_race(path: str | Path, prompt: str, results: dict[str, Result], meta: dict) -> Path:
    """Write a finished race (``{method: Result}``, as ``app.race.run_race`` yields it) as one compact
    JSON file: span times to the microsecond, and a step's fields left out where they hold their
    defaults (``Step.from_dict`` restores them)."""
    methods = {}
    for name, r in results.items():
        trace = r.trace.to_dict()
        for span in trace["spans"]:
            span["start"], span["end"] = round(span["start"], 6), round(span["end"], 6)
        trace["steps"] = [{k: v for k, v in step.items() if k in STEP_KEYS or v not in (None, [], 0)}
                          for step in trace["steps"]]
        methods[name] = dict(trace=trace, metrics=r.metrics, finished=r.finished, error=r.error,
                             pieces={str(k): v for k, v in r.pieces.items()})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(prompt=prompt, meta=meta, methods=methods), separators=(",", ":")))
    return path


def load_race(path: str | Path) -> tuple[str, dict, dict[str, Result]]:
    """A recorded race: (prompt, meta, {method: Result}), ready for the cards and the step-through."""
    data = json.loads(Path(path).read_text())
    results = {name: Result(name, Trace.from_dict(m["trace"]), metrics=m["metrics"], finished=m["finished"],
                            error=m.get("error"), pieces={int(k): v for k, v in m["pieces"].items()})
               for name, m in data["methods"].items()}
    for r in results.values():
        r.seen_steps, r.busy = len(r.trace.steps), busy_then(data["meta"])
        r.trace.meta["recording"] = recording(data["meta"])  # the cards' tooltips and the exports' names say it
        r.trace.meta["prompt"] = data["prompt"]  # as a live race's traces carry it (the exports name it)
    return data["prompt"], data["meta"], results


def recording(meta: dict) -> dict:
    """What a recorded race's traces carry of its recording: the machine, the day, the prompt's category."""
    return {key: meta.get(key) for key in ("hardware", "date", "category")}


def machine_and_date(meta: dict) -> str:
    """Where and when a recorded race ran, as its name and its cards say it: "AMD EPYC, 2 CPU cores,
    2026-11-27". Not this server: the recordings were measured on other machines."""
    return f"{meta.get('hardware', 'unknown hardware')}, {meta.get('date', 'an unknown date')}"


def recorded_machines(folder: str | Path = RECORDED) -> list[str]:
    """The machines the recorded races ran on, each once, in the dropdown's order."""
    machines = [json.loads(path.read_text())["meta"].get("hardware", "unknown hardware")
                for path in sorted(Path(folder).glob("*.json")) + sorted(Path(folder).glob("*/*.json"))]
    return list(dict.fromkeys(machines))


def busy_then(meta: dict) -> str:
    """Why a recorded race's speeds are rough: other work shared the machine (a load average above its
    cores), or ''."""
    load, cores = meta.get("load_average"), meta.get("cores")
    return (f" Other work shared the machine then (load average {load:g} on {cores} cores): its times are "
            "longer and noisier than a quiet machine's.") if load and cores and load > cores else ""


def recorded_races(folder: str | Path = RECORDED) -> list[tuple[str, str]]:
    """(label, path) of every recorded race in ``folder``, for a dropdown, each naming the machine and
    the day it ran on (none ran on this server): "qa: Why is the sky blue? (on AMD EPYC, 2 CPU cores,
    2026-11-27)"; races in a subfolder after them, with their settings where they are not the defaults
    ("..., at best settings: mirror exit layer 14, branch budget 4)", for ``cpu-best/``)."""
    folder, races = Path(folder), []
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*/*.json")):
        data = json.loads(path.read_text())
        meta = data["meta"]
        prompt = " ".join(data["prompt"].split())
        short = prompt if len(prompt) <= 60 else prompt[:57] + "…"
        notes = [f"on {machine_and_date(meta)}"] + ([meta["settings"]] if meta.get("settings") else [])
        races.append((f"{category_label(meta.get('category', path.stem))}: {short} ({', '.join(notes)})", str(path)))
    return races


def category_label(category: str) -> str:
    """A Spec-Bench category as the page names a race of it: the app races a prompt's first turn only,
    so a multi-turn prompt's race is its opening turn, not a conversation."""
    return "multi-turn, first turn" if category == "multi-turn" else category


def recorded_on(meta: dict) -> str:
    """'Recorded on <hardware>, <date>', the settings it ran with, and whether other work shared the
    machine then (a load average above its cores)."""
    busy = busy_then(meta)
    graphs = ", every forward a CUDA graph" if meta.get("graphs") == "on" else ""
    settings = (f"{meta['settings']} (every other option at its default)" if meta.get("settings")
                else "each method's default options")
    note = f" {meta['note']}" if meta.get("note") else ""
    dtype = f", the target in {meta['dtype']}" if meta.get("dtype") else ""
    return (f"Recorded on {meta.get('hardware', 'unknown hardware')}, {meta.get('date', 'an unknown date')}: "
            f"at most {meta.get('max_new_tokens')} new tokens, temperature {meta.get('temperature', 0.0)}, "
            f"{settings}{graphs}{dtype}.{note}{busy} Nothing runs now: step through it in **Step-through**, "
            f"or **Replay** it.")


def recorded_devices(meta: dict, results: dict[str, Result]) -> str:
    """The device line for a recorded race: the machine and the lanes it ran on, from the recording (its
    traces' lane labels, e.g. 'draft, NPU role, cuda:0, 2nd stream'), not this server's."""
    metas = [r.trace.meta for r in results.values()]
    labels = {role: next((m[f"{role}_lane"] for m in metas if m.get(f"{role}_lane")), None)
              for role in ("target", "draft")}
    if not labels["target"]:  # a recording without lane labels in its meta: its spans' lanes
        lanes = {role: label for r in results.values() for label, role in r.trace.lanes.items()}
        labels = {role: lanes.get(role) for role in ("target", "draft")}
    known = [label for label in labels.values() if label]
    shared = one_processor(known)
    note = ""
    if shared == "cpu":
        note = " Both lanes are two groups of one CPU's cores."
    elif shared and shared.startswith("cuda"):
        note = " Both lanes are two CUDA streams of one GPU: the draft's kernels ran beside the target's."
    return (f"Recorded on **{meta.get('hardware', 'unknown hardware')}**. {lanes_line(known) or 'Lanes not recorded.'}"
            f"{note} Nothing runs on this server while a recorded race is open; a live race (**Run**) runs on this "
            "server's own lanes.")


def open_recorded(path, rejected=False) -> Page:
    """Open the recorded race at ``path``: its prompt, status, replay button, cards and results, the Run
    handler's outputs and the prompt's, with no model loaded and nothing decoded (nothing changes when
    none is picked)."""
    import gradio as gr

    if not path:
        return Page()
    prompt, meta, results = load_race(path)
    rate = baseline(results)
    cards = {n: card_html(r, rate, rejected=bool(rejected)) for n, r in results.items()}
    return Page(prompt=prompt, status=recorded_on(meta), replay=gr.update(interactive=True), cards=cards,
                results=results)


def open_recorded_devices(path):
    """The device line for the recorded race at ``path`` (unchanged when none is picked)."""
    import gradio as gr

    if not path:
        return gr.update()
    _, meta, results = load_race(path)
    return recorded_devices(meta, results)
