"""What the page's events do: run the race, draw the views, replay it, step through it.

The race's handlers return (or yield) a :class:`app.page.Page` naming the outputs they set, which ui.py
maps onto its components; the others return values for the components ui.py wires them to. Only
``race`` reaches the engine, through :func:`app.race.run_race`; the others draw from recorded traces.
"""
from __future__ import annotations

import inspect
import logging
import os
import threading
import time

import gradio as gr

from mirror_sd import MirrorSDError
from mirror_sd.devices import cpu_cores
from mirror_sd.trace import Trace

from . import estimate, figures, presets
from .cards import baseline, card_html
from .explain import explain
from .export import export_race
from .fair import fair_share, skipped_runs
from .inputs import settle_all
from .lanes import lanes_line, one_processor
from .loading import in_background, loading_message
from .page import Page
from .predict import SKIP, fastest, next_step, reveal, reveal_hit, why
from .prompt_kinds import acceptance_note
from .prompt_cost import prompt_line, short_refusal, speeds_of, too_long
from .race import TIMED_TOKENS, WARM_TOKENS, Refused, Result, is_warm, race_order, run_race, warm_up
from .repeat import busy_note, record
from .replay import frame_times, last_step_at
from .tokens import text_html
from .waiting import Line

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 20_000  # far beyond any context here; the engine checks the real token limit
AUTO = "auto"  # device choice: this machine's default lanes


def lane_devices(target_device: str | None, draft_device: str | None) -> dict[str, str | None]:
    """The Advanced drawer's device choices as ``load_pair``'s arguments: "auto" (or none) is None, this
    machine's default for that lane."""
    return {"target_device": None if target_device in (None, AUTO) else target_device,
            "draft_device": None if draft_device in (None, AUTO) else draft_device}


class Stops:
    """One stop flag per browser session: the Stop button sets it, the running race polls it. A session
    whose tab closed stays stopped: a race it had queued never starts."""

    def __init__(self):
        self._flags: dict[str, threading.Event] = {}
        self._gone: set[str] = set()

    def fresh(self, session: str) -> threading.Event:
        self._flags[session] = threading.Event()
        if session in self._gone:
            self._flags[session].set()
        return self._flags[session]

    def stop(self, session: str):
        if session in self._flags:
            self._flags[session].set()

    def leave(self, session: str):
        """The session's tab closed: stop its race, and any it had queued."""
        self._gone.add(session)
        self.stop(session)

    def gone(self, session: str) -> bool:
        return session in self._gone


INT8_NOTE = (" On the CPU, drafting (the draft model, the EAGLE head, the speculative streams) multiplies by int8 "
             "copies of its weights, which is faster here; the target verifies in its own dtype, so every method "
             "still commits what vanilla decoding would.")


def hardware_notice(pair) -> str:
    """The models where they are not the embedded pair, the lanes in use, the dtype and why
    (models/auto_dtype.py), whether drafting runs in int8, and a plain warning when both lanes are
    the same kind of hardware."""
    target, draft = pair.target_lane, pair.draft_lane
    models = "" if getattr(pair, "embedded_target", True) else (
        f"Models: target **{pair.target_name}**, draft **{pair.draft_name or 'none'}**. ")
    lanes = models + lanes_line([target.label, draft.label])
    if getattr(pair, "dtype", None) is not None:
        lanes += f" Weights: **{pair.dtype}**."
    if getattr(pair, "int8_drafting", False):
        lanes += INT8_NOTE
    if target.device.type != draft.device.type:
        return lanes
    shared, where = one_processor([target.label, draft.label]), ""
    if shared == "cpu":
        where = " They are two groups of one CPU's cores."
    elif shared:
        where = (f" They are two CUDA streams of one GPU ({shared}): the draft's kernels run beside the "
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


RACE_INPUTS = ["prompt_text", "methods", "max_new", "temperature", "top_p", "seed", "target_device", "draft_device",
               "runs", "show_rejected"]  # the Run event's API parameters, then one per method option


def option_name(method: str, opt) -> str:
    """An option's API parameter name, e.g. 'mirror_gamma'."""
    return f"{method}_{opt.name}"


def named(fn, names: list[str]):
    """``fn(request, *values)`` with a signature naming each value, so the API shows real parameter names."""
    params = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    fn.__signature__ = inspect.Signature(params)
    return fn


def settle_boxes(max_new, temperature, top_p, seed, runs):
    """Before a race: each setting brought into range, the boxes showing the values used, and a message
    for every value changed ('' when none was)."""
    used, messages = settle_all(max_new=max_new, temperature=temperature, top_p=top_p, seed=seed, runs=runs)
    for m in messages:
        gr.Warning(m)
    note = " ".join(messages)
    return (used["max_new"], used["temperature"], used["top_p"], used["seed"], used["runs"],
            f"**Settings changed:** {note}" if note else "")


def make_race(get_pair, stops: Stops, specs, line: Line):
    """The Run handler: yields pages (status, replay button, cards, results) while the models load, and after
    every committed step of every run; the visitor holds a place in ``line`` until their race ends. A race
    that starts with others waiting behind it is cut to a fair share (``app.fair``); every race run to its
    end calibrates the estimate of the next (``app.estimate``)."""

    def race(request: gr.Request, *values):
        given = dict(zip(RACE_INPUTS, values))
        session = request.session_hash if request else ""
        if stops.gone(session):  # the visitor left while their race waited in the queue
            line.leave(session)
            return
        stop = stops.fresh(session)  # from here on, Stop ends this race: the loading and warm-up included
        used, messages = settle_all(**{k: given[k] for k in ("max_new", "temperature", "top_p", "seed", "runs")})
        settled = ("**Settings changed:** " + " ".join(messages) + " ") if messages else ""
        line.join(session)
        try:
            pair = yield from _load(get_pair, given, stop)
            if pair is None:
                return
            line.start(session)
            cold, began = not is_warm(pair), time.perf_counter()
            started = began  # the race's own time, after the one-off warm-up: what the estimate learns
            for _ in in_background(lambda: warm_up(pair), tick_s=0.25):  # once per pair; measures the speeds
                if stop.is_set():  # the one-off warm-up goes on for the server; this race ends now
                    yield not_run(given, "skipped", STOPPED_BEFORE)
                    return
                yield Page(status=settled + race_status({}, cold=cold, waited_s=time.perf_counter() - began))
                started = time.perf_counter()
            settled += share(pair, given, used, line, session)
            problem = length_problem(pair, given["prompt_text"], given["methods"], used["max_new"], used["runs"])
            if problem:
                yield not_run(given, "refused", f"**Cannot run:** {problem}")
                return
            settings = dict(max_new_tokens=used["max_new"], temperature=used["temperature"], top_p=used["top_p"],
                            seed=used["seed"], options=gather_options(specs, values[len(RACE_INPUTS):]))
            finished, current, ran = yield from _runs(pair, given, settings, used["runs"], settled, stop,
                                                      lambda: line.behind(session), used)
            if finished:
                estimate.learn(pair, current, ran, time.perf_counter() - started)
            line.leave(session, finished=finished)
        finally:
            line.leave(session)

    return named(race, RACE_INPUTS + [option_name(m, opt) for m, opt, _ in specs])


def share(pair, given: dict, used: dict, line: Line, session: str) -> str:
    """Cut this race to a fair share when others wait behind it (``used`` changed in place), tell the line
    its expected time, and return the message saying what was cut ('' when nothing was)."""
    methods, tokens = list(given["methods"] or []), len(pair.encode(given["prompt_text"] or ""))

    def expected(max_new: int, runs: int = 1) -> float | None:
        guess = estimate.race_s(pair, methods, tokens, max_new, runs)
        return guess.seconds if guess is not None else None

    used["max_new"], used["runs"], note = fair_share(used["max_new"], used["runs"], line.behind(session), expected)
    line.expect(session, expected(used["max_new"], used["runs"]))
    return f"{note} " if note else ""


def make_enter(get_pair, line: Line, specs):
    """The Run event's validator, run as Gradio queues a race (a browser's or an API caller's): the race
    enters ``line`` with its expected time as a fair share (the visitors behind it, who read that time,
    will have it cut), or, where this visitor already has a race in line, is refused with one message."""

    def enter(request: gr.Request, *values):
        given = dict(zip(RACE_INPUTS, values))
        session = request.session_hash if request else ""
        if not line.enter(session, expected_fair_s(get_pair, given)):
            return (gr.validate(False, ALREADY_IN_LINE), *(gr.validate(True, "") for _ in values[1:]))
        return tuple(gr.validate(True, "") for _ in values)

    return named(enter, RACE_INPUTS + [option_name(m, opt) for m, opt, _ in specs])


ALREADY_IN_LINE = ("Your race is already in the line: one race per visitor at a time. It runs in its turn; "
                   "Run again once it has ended.")


def expected_fair_s(get_pair, given: dict) -> float | None:
    """A queued race's expected seconds, cut to a fair share, or None (models not loaded, no estimate yet)."""
    devices = lane_devices(given.get("target_device"), given.get("draft_device"))
    try:
        if not get_pair.loaded(**devices) or not (given.get("prompt_text") or "").strip():
            return None
        pair = get_pair(**devices)
        used, _ = settle_all(max_new=given.get("max_new"), runs=given.get("runs"))
        methods, tokens = list(given.get("methods") or []), len(pair.encode(given["prompt_text"]))
        max_new, runs, _ = fair_share(used["max_new"], used["runs"], 1)
        guess = estimate.race_s(pair, methods, tokens, max_new, runs)
        return guess.seconds if guess is not None else None
    except Exception:  # noqa: BLE001  an estimate is never worth refusing a race over: the race says what is wrong
        return None


STOPPED_BEFORE = "**Stopped before any method ran:** nothing was timed and no text was written."


def not_run(given: dict, state: str, status: str) -> Page:
    """The page for a race that ends before any method ran (refused: ``state`` "refused"; stopped:
    "skipped"): ``status``, and every chosen method's card emptied and marked not run, so no card of
    the last race passes for this one's. The message stays in the status line, no toast: a toast sits
    over the Run and Stop buttons."""
    current = {m: Result(m, Trace(m), finished=state) for m in race_order(list(given.get("methods") or []))}
    return Page(status=status, replay=gr.update(interactive=False), cards=cards(current), results=current)


def _load(get_pair, given: dict, stop):
    """Check the prompt and load the pair, yielding a loading message each second; the pair, or None
    after a 'Cannot run' message (or a stop)."""
    devices = lane_devices(given["target_device"], given["draft_device"])
    try:
        problem = check_prompt(given["prompt_text"], given["methods"])
        if problem:
            raise MirrorSDError(problem)
        loads = in_background(lambda: get_pair(**devices), tick_s=0.25)
        while True:
            try:
                waited = next(loads)
            except StopIteration as done:
                return done.value
            if stop.is_set():  # the models go on loading for the server; this race ends now
                yield not_run(given, "skipped", STOPPED_BEFORE)
                return None
            yield Page(status=loading_message(waited), results={})
    except Exception as e:  # noqa: BLE001  one message in the page, the traceback in the server's log
        yield not_run(given, "refused", f"**Cannot run:** {load_problem(e)}")
        return None


def load_problem(e: Exception) -> str:
    """What went wrong before a race, in one line: a MirrorSDError says it plainly; anything else
    (a model that failed to load, say) is named, and its traceback goes to the server's log."""
    if isinstance(e, MirrorSDError):
        return str(e)
    log.error("loading the models failed", exc_info=e)
    return f"the models could not be loaded ({type(e).__name__}: {e}). Recorded races still open."


LIVE_INTERVAL_S = 0.25  # during a race the page is sent at most this often (and at each method's start and
# end): the browser's drawing and the server's card building then take little of the cores the race is timed on


class LivePage:
    """What a live race sends the page: at most one update per ``LIVE_INTERVAL_S`` unless a method started
    or ended since the last, and in it only the cards whose HTML changed (the others as empty updates)."""

    def __init__(self, show_rejected: bool):
        self.show = show_rejected
        self.sent: dict[str, str] = {}
        self.states: tuple = ()
        self.at = float("-inf")

    def due(self, current: dict) -> bool:
        states = tuple((n, r.finished) for n, r in current.items())
        return states != self.states or time.perf_counter() - self.at >= LIVE_INTERVAL_S

    def cards(self, current: dict) -> dict:
        self.states, self.at = tuple((n, r.finished) for n, r in current.items()), time.perf_counter()
        out = {}
        for n, html in cards(current, self.show).items():
            changed = self.sent.get(n) != html
            if changed:
                self.sent[n] = html
            out[n] = html if changed else gr.update()
        return out


def _runs(pair, given: dict, settings: dict, n: int, settled: str, stop, crowded_now, used: dict):
    """Run the race ``n`` times (fewer if stopped, or once others wait in line: ``crowded_now()`` says how
    many), yielding at a bounded rate (``LivePage``) while it runs; at the end each result carries every
    run's numbers, and the status says when the machine was busy. The first run warms every method up,
    then checks the limit again on this machine's speed now (``run_race``'s ``check``); a race refused
    there ends with 'Cannot run' and every card marked. Returns (whether the race ran to its end, not
    stopped nor refused: the line and the estimate learn from its time; the last run's results; the runs
    made)."""
    show = bool(given["show_rejected"])
    warned, current, runs, crowded, cut = set(), {}, {}, False, ""
    live = LivePage(show)

    def check() -> str:
        return length_problem(pair, given["prompt_text"], given["methods"], used["max_new"], used["runs"])

    made = 0
    for k in range(n):
        waiting = crowded_now()
        if k and waiting:
            cut = skipped_runs(k, n, waiting)
            break
        cold, began = not is_warm(pair), time.perf_counter()
        race = run_race(pair, given["prompt_text"], given["methods"], stop, warm=k == 0, check=check, **settings)
        try:
            current, busy = yield from _live(race, k, n, settled, cold, began, live, warned, crowded_now)
        except Refused as e:
            yield not_run(given, "refused", f"**Cannot run:** {e}")
            return False, current, made
        crowded, made = crowded or busy, made + 1
        presets.mark(current, pair, used["temperature"])  # the card says "paper form" where it ran in it
        record(runs, current)
        if stop.is_set():
            break
    note = busy_note(runs, crowded, {r.method: r.title for r in current.values()}, machine_load())
    for name, r in current.items():
        r.runs, r.busy = runs.get(name, []), note
    status = settled + race_status(current, done=True) + "".join(f"\n\n{m}" for m in (cut, note) if m)
    yield Page(status=status, replay=gr.update(interactive=bool(race_traces(current))), cards=cards(current, show),
               results=current)
    return not stop.is_set(), current, made


def _live(race, k: int, n: int, settled: str, cold: bool, began: float, live: LivePage, warned: set, crowded_now):
    """Run ``k`` of ``n`` on the page: its updates at a bounded rate, a toast for each method's error.
    Returns the last results and whether others waited in line meanwhile."""
    current, crowded = {}, False
    for current in race:
        crowded = crowded or bool(crowded_now())
        for r in current.values():
            if r.error and r.method not in warned:
                warned.add(r.method)
                gr.Warning(f"{r.title}: {r.error}")
        if not live.due(current):
            continue
        status = settled + race_status(current, run=k, runs=n, cold=cold, waited_s=time.perf_counter() - began)
        yield Page(status=status, replay=gr.update(interactive=False), cards=live.cards(current), results=current)
    return current, crowded


def machine_load() -> tuple[float, int] | None:
    """(1-minute load average, CPU cores), where the system reports one."""
    try:
        return os.getloadavg()[0], cpu_cores()
    except (AttributeError, OSError):
        return None


def check_prompt(prompt_text: str, chosen: list[str]) -> str | None:
    if not chosen:
        return "pick at least one method."
    if not (prompt_text or "").strip():
        return "the prompt is empty: type some text or pick an example."
    if len(prompt_text) > MAX_PROMPT_CHARS:
        return f"the prompt is {len(prompt_text)} characters; keep it under {MAX_PROMPT_CHARS}."
    return None


def length_problem(pair, prompt_text: str, methods: list[str], max_new, runs) -> str:
    """Why this prompt is too long for a live race on this machine ('' when it is not, or before the
    warm-up has measured the machine's speeds)."""
    speeds = speeds_of(pair)
    if speeds is None or not (prompt_text or "").strip():
        return ""
    used, _ = settle_all(max_new=max_new, runs=runs)
    return too_long(len(pair.encode(prompt_text)), len(prompt_text), speeds, len(methods or []) or 1,
                    used["max_new"], used["runs"])


def make_prompt_info(get_pair):
    """The line under the prompt: its length in tokens, its expected prefill and race time here (calibrated
    on the races run here: ``app.estimate``), and whether it is too long for a live race
    (``app.prompt_cost``), for the settings on the page. While a recorded race is open (``recorded``), no
    estimate: the page shows a race that ran elsewhere, and nothing here is about to run."""

    def prompt_info(prompt_text, methods, max_new, runs, recorded=None):
        text = prompt_text or ""
        if not text.strip():
            return ""
        used, _ = settle_all(max_new=max_new, runs=runs)
        pair = get_pair(target_device=None, draft_device=None) if get_pair.loaded(
            target_device=None, draft_device=None) else None
        tokens = len(pair.encode(text)) if pair is not None else None
        if recorded:
            size = f"{tokens:,} tokens" if tokens is not None else f"{len(text):,} characters"
            return (f"Prompt: {size}. A recorded race is open: its times are the recording's, so no estimate "
                    "is given here; **Run** races this prompt live on this server, with an estimate first.")
        chosen = list(methods or [])
        expected = estimate.race_s(pair, chosen, tokens, used["max_new"], used["runs"]) if pair is not None else None
        return prompt_line(tokens, len(text), speeds_of(pair) if pair is not None else None,
                           len(chosen) or 1, used["max_new"], used["runs"], expected=expected)

    return prompt_info


def make_check_length(get_pair):
    """Run's first step: a prompt too long for a live race (speeds already measured) is refused before
    anything on the page changes, so the last race's cards, timeline and views stay. Its error stops
    Run's chain; Gradio shows no toast for this unqueued step, so nothing covers the Run and Stop buttons:
    the line right under them (``prompt_line``) gives the whole reason, and an API caller gets the
    error's one sentence (``short_refusal``)."""

    def check_length(prompt_text, methods, max_new, runs, target_device, draft_device):
        devices = lane_devices(target_device, draft_device)
        if not get_pair.loaded(**devices):
            return
        pair = get_pair(**devices)
        if length_problem(pair, prompt_text, methods, max_new, runs):
            used, _ = settle_all(max_new=max_new, runs=runs)
            short = short_refusal(len(pair.encode(prompt_text)), speeds_of(pair), len(methods or []) or 1,
                                  used["max_new"], used["runs"])
            raise gr.Error(short, title="Too long for a live race", print_exception=False)

    return check_length


def cards(current: dict, rejected: bool = False) -> dict[str, str]:
    """{method: its card's HTML} for every method of the race."""
    rate = baseline(current)
    return {n: card_html(r, rate, rejected=rejected) for n, r in current.items()}


def race_status(current: dict, done: bool = False, run: int = 0, runs: int = 1, cold: bool = False,
                waited_s: float = 0.0) -> str:
    """One line on the race: warming up (which method, for how long so far), which method runs (and which
    run of how many), or how it ended. "Done." is said only once every run of every method is over."""
    results = list(current.values())
    of_runs = f" (run {run + 1} of {runs})" if runs > 1 else ""
    if not done:
        warming = [i for i, r in enumerate(results) if r.finished == "warming"]
        if warming:
            return warming_status(results, warming[0], of_runs)
        if all(r.finished == "waiting" for r in results):
            if cold:
                return (f"**Warming up… {waited_s:.0f} s.** A short discarded run of each method, once per server, "
                        "so that one-off start-up costs do not slow the first method down.")
            return f"Starting the race{of_runs}…"
        running = [i for i, r in enumerate(results) if r.finished == "running"]
        nxt = running[0] if running else next((i for i, r in enumerate(results) if r.finished == "waiting"), None)
        if nxt is None:
            return f"Finishing{of_runs}…"
        return (f"Running **{results[nxt].title}** ({nxt + 1} of {len(results)}){of_runs}; methods run one after "
                "another.")
    ran = any(r.trace.steps for r in results)
    if not ran and any(r.finished in ("stopped", "skipped") for r in results):
        return STOPPED_BEFORE
    stopped = any(r.finished in ("stopped", "skipped") for r in results)
    errors = [f"{r.title}: {r.error}" for r in results if r.error]
    head = "Stopped: the text so far is kept." if stopped else "Done."
    tail = " Errors: " + "; ".join(errors) if errors else ""
    timed = any(r.timed for r in results if r.finished in ("eos", "length"))
    drafts = acceptance_note(current) if timed else too_short_note(results)
    return (f"{head} Replay the race below; step through it in **Step-through**.{tail}{loop_note(results)}"
            f"{sampled_note(results)}{drafts}")


def warming_status(results: list, i: int, of_runs: str) -> str:
    """The status line while method ``i`` warms up: which one, on how much of the prompt, for how long."""
    r = results[i]
    part = f"this prompt's first {r.warm_tokens:,} tokens" if r.warm_tokens else "this prompt"
    return (f"**Warming up {r.title}** ({i + 1} of {len(results)}){of_runs}: an untimed run of "
            f"{WARM_TOKENS} steps on {part}, {time.perf_counter() - r.warm_since:.0f} s so far. Every method warms "
            "up before any is timed, so none pays a cold start the others skip; **Stop** ends it at once.")


def too_short_note(results) -> str:
    """Where every finished run wrote too few tokens to time (``Result.timed``): say so, in place of the
    drafts' τ, which over so few tokens means nothing."""
    finished = [r for r in results if r.finished in ("eos", "length") and r.metrics]
    if not finished:
        return ""
    tokens = max(r.metrics["new_tokens"] for r in finished)
    return (f" **Too short to time:** this race wrote {tokens:g} token{'' if tokens == 1 else 's'} per method, "
            f"under {TIMED_TOKENS}: its time is mostly reading the prompt, the same work for every method, so no "
            "speedup, τ or winner is claimed. Raise Max new tokens and race again.")


def sampled_note(results) -> str:
    """At temperature > 0, what lossless means there: the same law, not the same text."""
    temperature = max((r.trace.meta.get("temperature") or 0.0 for r in results), default=0.0)
    if not temperature:
        return ""
    return (f" **Lossless at temperature {temperature:g}:** each method draws every token from the target's own "
            "distribution, the one vanilla samples from, so the texts differ from method to method and from run to "
            "run, as two vanilla runs would; no method makes any text more or less likely.")


LOOP_TOKENS = 16  # a text whose last this many tokens hold at most two distinct ones is stuck in a loop


def loop_note(results) -> str:
    """A sentence when a finished method's text ends in a loop of one or two tokens, which a small model
    can fall into when it always takes its most likely token: the text looks broken, the race is not."""
    for r in results:
        tokens = [t for step in r.trace.steps for t in step.committed][-LOOP_TOKENS:]
        if r.finished in ("eos", "length") and len(tokens) == LOOP_TOKENS and len(set(tokens)) <= 2:
            if r.trace.meta.get("temperature"):
                return " The text ends in a loop: a model this small can repeat itself."
            return (" The text ends in a loop: a model this small can repeat itself when it always takes its most "
                    "likely token (temperature 0). Every method commits the same tokens as vanilla, so the race "
                    "stays fair; a temperature above 0 gives varied text.")
    return ""


def rerender(current, rejected) -> Page:
    """The 'show rejected draft tokens' box: the cards again, with or without them."""
    return Page(cards=cards(current or {}, bool(rejected)))


def page_open(get_pair):
    """On page open: a loading message with the time so far while the models load, then which hardware
    each lane runs on; then the one-off warm-up, which measures this machine's speeds for the prompt's
    expected cost (the event ends when it has)."""
    try:
        loads = in_background(lambda: get_pair(target_device=None, draft_device=None))
        while True:
            try:
                yield loading_message(next(loads))
            except StopIteration as done:
                pair = done.value
                yield hardware_notice(pair)
                for _ in in_background(lambda: warm_up(pair)):  # once per server: the prompt's cost needs it
                    pass
                return
    except Exception as e:  # noqa: BLE001  (load_problem)
        yield f"**Cannot run:** {load_problem(e)}"


def make_live_devices(get_pair):
    """A live race's device line, back after a recorded race's: the lanes the race's pair runs on (the
    pair loads once; a pair that cannot load leaves the line to the race's own message)."""

    def live_devices(target_device, draft_device):
        try:
            return hardware_notice(get_pair(**lane_devices(target_device, draft_device)))
        except Exception:  # noqa: BLE001  the race itself says why it cannot run
            return gr.update()

    return live_devices


def race_traces(current: dict) -> dict:
    """Traces of the methods that did any work, keyed by title (the figures' row names)."""
    return {r.title: r.trace for r in (current or {}).values() if r.trace.spans}


NOTHING_RAN = "No method ran in this race: nothing to draw."
TOO_SHORT = ("This race was too short to time: each method wrote under {} tokens, mostly reading the prompt. "
             "Raise Max new tokens for a typical step.")


def views(current, method=None) -> Page:
    """After a race: the timeline, utilisation, export files, the step-through method choice and one
    typical step of each method, zoomed. The step-through keeps ``method`` (the one chosen before) where
    it ran in this race, else opens on Mirror-SD. A race in which no method ran says so on each chart;
    one too short to time says so in place of the zoomed step, which would be empty axes."""
    traces = race_traces(current)
    if not traces:
        empty = figures.placeholder(NOTHING_RAN)
        return Page(timeline=empty, utilisation=empty, files=None, step_method=gr.update(choices=[], value=None),
                    zoom=empty)
    choices = [(r.title, r.method) for r in current.values() if r.trace.steps]
    files = export_race(current)
    stepped = [m for _, m in choices]
    first = method if method in stepped else "mirror" if "mirror" in stepped else stepped[-1]  # the page's idea
    timed = any(r.timed for r in current.values())  # a stopped run of enough tokens is drawn too
    zoom = figures.zoomed_steps(traces) if timed else figures.placeholder(TOO_SHORT.format(TIMED_TOKENS))
    return Page(timeline=figures.timeline(traces), utilisation=figures.utilisation(traces), files=files,
                step_method=gr.update(choices=choices, value=first), zoom=zoom)


def redraw_utilisation(current):
    """The utilisation chart again, once its tab is shown (unchanged before any race)."""
    traces = race_traces(current)
    return figures.fresh(figures.utilisation(traces)) if traces else gr.update()


REPLAY_FPS = 20  # replay frames a second: each sends only the cards whose text moved, and the clock
SLOW_BELOW_S = 1.0  # a race shorter than this (a GPU's: a tenth of a second) is too quick to watch: it
SLOW_TO_S = 3.0  # replays slowed down by a whole factor, to last about this long, and its cards say so


def replay_speed(traces: list) -> int:
    """How many times slower than measured the replay runs: 1, or more for a race too short to watch."""
    end = max((s.end for t in traces for s in t.spans), default=0.0)
    return max(1, round(SLOW_TO_S / end)) if 0 < end < SLOW_BELOW_S else 1


def replaying_state(slow: int) -> str:
    return "replaying…" if slow == 1 else f"replaying, {slow}× slower than measured…"


def replay(current, rejected=False):
    """The Replay handler: every card's text as it stood at each moment of its own measured run, and the
    replay clock (ms; None at the end) for the timeline's cursor, which the page moves itself
    (``CURSOR_JS``) so the chart is never redrawn and keeps a visitor's zoom. A frame sends only the cards
    that changed; a card says it is replaying until the clock passes its run's end, then shows its
    numbers."""
    traces = race_traces(current)
    if not traces:
        return
    rate, slow = baseline(current), replay_speed(list(traces.values()))
    ends = {n: max((s.end for s in r.trace.spans), default=0.0) for n, r in current.items()}
    shown: dict[str, object] = {}

    def card(n: str, t: float | None):
        """The card at replay time ``t`` (None: the end), or an empty update when it has not changed."""
        r = current[n]
        key = "end" if t is None or t >= ends[n] else last_step_at(r.trace, t)
        if shown.get(n) == key:
            return gr.update()
        shown[n] = key
        if key == "end":
            return card_html(r, rate, rejected=bool(rejected))
        return card_html(r, rate, upto=key, rejected=bool(rejected), replaying=replaying_state(slow))

    start = time.perf_counter()
    for t in frame_times(list(traces.values()), fps=REPLAY_FPS * slow):
        time.sleep(max(0.0, slow * t - (time.perf_counter() - start)))
        yield Page(cards={n: card(n, t) for n in current}, clock=round(1000 * t, 3))
    yield Page(cards={n: card(n, None) for n in current}, clock=None)


# The timeline's replay cursor: a dotted line at the replay clock (ms), drawn by the page itself on the
# chart already shown, across every method's row; none when the clock is empty.
CURSOR_JS = """(ms) => {
  const plot = document.querySelector('#timeline .js-plotly-plot');
  if (plot && window.Plotly && plot._fullLayout && plot._fullLayout.xaxis) {
    const line = {type: 'line', xref: 'x', yref: 'paper', x0: ms, x1: ms, y0: 0, y1: 1,
                  line: {color: '#111827', width: 2, dash: 'dot'}};
    window.Plotly.relayout(plot, {shapes: ms === null || ms === undefined ? [] : [line]});
  }
  return [];
}"""


def _steps(current, method) -> list:
    return current[method].trace.steps if method in (current or {}) else []


def pick_method(current, method, index=0):
    """The step slider's range for the chosen method, at the step it was on where the method has that step
    (else its last): switching methods keeps the moment in view."""
    steps = _steps(current, method)
    last = steps[-1].index if steps else 0
    return gr.update(maximum=max(last, 1), value=min(max(int(index or 0), 0), last))


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


def hit_question(current, method, index):
    """The step-through's 'will the next step be a hit?': shown, unanswered, on a Mirror-SD step that has
    a next step; hidden elsewhere. Returns (radio update, reveal text)."""
    r = (current or {}).get(method)
    ask = r is not None and next_step(r.trace, int(index)) is not None
    return gr.update(visible=ask, value=None), ""


def answer_hit(current, method, index, answer):
    """The reveal for the visitor's hit guess at this step."""
    return reveal_hit((current or {}).get(method), int(index), answer)


def race_answer(current, guess) -> str:
    """The reveal once a race is over: the answer to the visitor's guess (``predict.reveal``), or with no
    guess which method was fastest and why (``predict.fastest``, ``predict.why``), so every finished race
    names its winner; '' while it runs, and for a race stopped or refused before every method finished."""
    if guess and guess != SKIP:
        return reveal(current, guess)
    results = list((current or {}).values())
    if not results or not all(r.finished in ("eos", "length", "error") for r in results):
        return ""
    winner = fastest(current)
    if winner is None:
        return ""
    if not winner.timed:
        return (f"**No winner this time:** each method wrote {winner.metrics['new_tokens']:g} tokens, too few to "
                "time (the time is mostly reading the prompt, the same work for every method).")
    rough = " The machine was busy while this race ran, so read these speeds as rough." if winner.busy else ""
    return f"**Fastest: {winner.title}.** {why(winner, current)}{rough}"


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
