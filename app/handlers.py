"""What the page's events do: run the race, draw the views, replay it, step through it.

Each handler returns (or yields) values for the components ui.py wires it to. Only ``race``
reaches the engine, through :func:`app.race.run_race`; the others draw from recorded traces.
"""
from __future__ import annotations

import threading
import time

import gradio as gr

from mirror_sd import MirrorSDError

from . import figures
from .cards import baseline, card_html
from .explain import explain
from .export import export_files
from .race import run_race
from .replay import frame_times, last_step_at
from .tokens import text_html

MAX_PROMPT_CHARS = 20_000  # far beyond any context here; the engine checks the real token limit
AUTO = "auto"  # device choice: this machine's default lanes


class Stops:
    """One stop flag per browser session: the Stop button sets it, the running race polls it."""

    def __init__(self):
        self._flags: dict[str, threading.Event] = {}

    def fresh(self, session: str) -> threading.Event:
        self._flags[session] = threading.Event()
        return self._flags[session]

    def stop(self, session: str):
        if session in self._flags:
            self._flags[session].set()


INT8_NOTE = (" On the CPU, drafting (the draft model, the EAGLE head, the speculative streams) multiplies by int8 "
             "copies of its weights, which is faster here; the target verifies in fp32, so every method still "
             "commits what vanilla decoding would.")


def hardware_notice(pair) -> str:
    """The lanes in use, whether drafting runs in int8, and a plain warning when both lanes are the
    same kind of hardware."""
    target, draft = pair.target_lane, pair.draft_lane
    lanes = f"Target lane: **{target.label}**; draft lane: **{draft.label}**."
    if getattr(pair, "int8_drafting", False):
        lanes += INT8_NOTE
    if target.device.type != draft.device.type:
        return lanes
    where = ""
    if target.device.type == "cpu":
        where = " They are two groups of one CPU's cores."
    elif target.device == draft.device:
        where = (f" They are two CUDA streams of one GPU ({target.device}): the draft's kernels run beside the "
                 "target's on the same chip, sharing its compute units and memory bandwidth.")
    return (f"{lanes} Both lanes are on the same kind of hardware ({target.device.type}): here they stand in for "
            f"the two separate devices Mirror-SD is designed for (a GPU and an NPU).{where}")


def gather_options(specs, values) -> dict[str, dict]:
    """{method: {option: value}} from the Advanced drawer's (method, Option, control) specs and values."""
    options: dict[str, dict] = {}
    for (method, opt, _), value in zip(specs, values):
        if value is not None:
            options.setdefault(method, {})[opt.name] = value
    return options


def make_race(get_pair, stops: Stops, specs, names: list[str]):
    """The Run handler: yields (status, replay button, *cards, results) after every committed step."""

    def race(request: gr.Request, prompt_text, chosen, max_new, temp, top_p, seed, t_dev, d_dev, *option_values):
        idle = (gr.update(),) * len(names)
        try:
            problem = check_prompt(prompt_text, chosen)
            if problem:
                raise MirrorSDError(problem)
            pair = get_pair(target_device=None if t_dev == AUTO else t_dev,
                            draft_device=None if d_dev == AUTO else d_dev)
        except MirrorSDError as e:
            gr.Warning(str(e))
            yield (f"**Cannot run:** {e}", gr.update(), *idle, {})
            return
        stop = stops.fresh(request.session_hash if request else "")
        settings = dict(max_new_tokens=int(max_new), temperature=float(temp), top_p=float(1.0 if top_p is None else top_p),
                        seed=int(seed or 0), options=gather_options(specs, option_values))
        warned, current = set(), {}
        for current in run_race(pair, prompt_text, chosen, stop, **settings):
            for r in current.values():
                if r.error and r.method not in warned:
                    warned.add(r.method)
                    gr.Warning(f"{r.title}: {r.error}")
            yield (race_status(current), gr.update(interactive=False), *cards(current, names), current)
        yield (race_status(current, done=True), gr.update(interactive=True), *cards(current, names), current)

    return race


def check_prompt(prompt_text: str, chosen: list[str]) -> str | None:
    if not chosen:
        return "pick at least one method."
    if not (prompt_text or "").strip():
        return "the prompt is empty: type some text or pick an example."
    if len(prompt_text) > MAX_PROMPT_CHARS:
        return f"the prompt is {len(prompt_text)} characters; keep it under {MAX_PROMPT_CHARS}."
    return None


def cards(current: dict, names: list[str]) -> list:
    rate = baseline(current)
    return [card_html(current[n], rate) if n in current else gr.update() for n in names]


def race_status(current: dict, done: bool = False) -> str:
    if not done and all(r.finished == "waiting" for r in current.values()):
        return "Getting ready: loading the models and a discarded warm-up run of each method (first race only)…"
    running = [i for i, r in enumerate(current.values()) if r.finished == "running"]
    if running and not done:
        r = list(current.values())[running[0]]
        return f"Running **{r.title}** ({running[0] + 1} of {len(current)}); methods run one after another."
    stopped = any(r.finished in ("stopped", "skipped") for r in current.values())
    errors = [f"{r.title}: {r.error}" for r in current.values() if r.error]
    head = "Stopped: the text so far is kept." if stopped else "Done."
    tail = " Errors: " + "; ".join(errors) if errors else ""
    return f"{head} Replay the race below; step through it in **Step-through**.{tail}"


def race_traces(current: dict) -> dict:
    """Traces of the methods that did any work, keyed by title (the figures' row names)."""
    return {r.title: r.trace for r in (current or {}).values() if r.trace.spans}


def views(current):
    """After a race: the timeline, utilisation, export files and the step-through method choice."""
    traces = race_traces(current)
    if not traces:
        return None, None, None, gr.update(choices=[], value=None)
    choices = [(r.title, r.method) for r in current.values() if r.trace.steps]
    files = export_files({r.method: r.trace for r in current.values() if r.trace.spans})
    return (figures.timeline(traces), figures.utilisation(traces), files,
            gr.update(choices=choices, value=choices[-1][1]))


def make_replay(names: list[str]):
    """The Replay handler: every card's text as it stood at each moment of its own measured run."""

    def replay(current):
        traces = race_traces(current)
        if not traces:
            return
        rate, start = baseline(current), time.perf_counter()
        for t in frame_times(list(traces.values()), fps=4):
            time.sleep(max(0.0, t - (time.perf_counter() - start)))
            now = [card_html(current[n], rate, upto=last_step_at(current[n].trace, t)) if n in current
                   else gr.update() for n in names]
            yield (*now, figures.timeline(traces, now_ms=1000 * t))
        yield (*cards(current, names), figures.timeline(traces))

    return replay


def _steps(current, method) -> list:
    return current[method].trace.steps if method in (current or {}) else []


def pick_method(current, method):
    """The step slider's range for the chosen method."""
    steps = _steps(current, method)
    return gr.update(maximum=max(steps[-1].index, 1) if steps else 1, value=0)


def show_step(current, method, index):
    """Every step-through view at one step: sentence, text so far, timeline around the step, tree."""
    if method not in (current or {}):
        return "Run the race first.", "", None, None
    r, index = current[method], int(index)
    step = next((s for s in r.trace.steps if s.index == index), None)
    tree = figures.tree(step, r.pieces, title=f"{r.title}, step {index}") if step else None
    timeline = figures.timeline({r.title: r.trace}, step=index)
    timeline.update_xaxes(range=figures.step_window_ms(r.trace, index))
    return explain(r.trace, index, r.pieces), text_html(r.trace, r.pieces, upto=index, current=index), timeline, tree


def move(current, method, index, delta: int) -> int:
    """The step ``delta`` away, kept within the run."""
    steps = _steps(current, method)
    return min(max(int(index) + delta, 0), steps[-1].index if steps else 0)


def play(current, method, index):
    """Advance one step a second to the end of the run."""
    steps = _steps(current, method)
    for i in range(int(index) + 1, (steps[-1].index if steps else 0) + 1):
        time.sleep(1.0)
        yield i
