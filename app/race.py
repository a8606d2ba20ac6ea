"""The race: the chosen methods decode one prompt one after another, through ``mirror_sd.engine.stream``.

Methods run in turn, never at the same time, so that they do not share (and distort) the
machine's cores. After every committed step the race yields the results so far, so the page can
redraw live; a stop request ends the race within about a second (the engine stops a long prefill
between two layers) and keeps every token committed.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from mirror_sd import METHODS, MirrorSDError, generate, stream
from mirror_sd.engine import MAX_NEW_TOKENS_LIMIT
from mirror_sd.trace import Trace

from . import prompt_cost
from .provenance import mark_live
from .loading import in_background
from .tokens import collect_pieces


@dataclass
class Result:
    """One method's run: its trace and the engine's metrics, plus the text of every token it mentions."""
    method: str
    trace: Trace
    metrics: dict = field(default_factory=dict)
    finished: str = "waiting"  # "waiting", "warming", "running", "skipped", "refused", or the engine's:
    # eos, length, stopped, error
    error: str | None = None
    pieces: dict = field(default_factory=dict)
    seen_steps: int = 0  # steps whose tokens are already in ``pieces``
    runs: list = field(default_factory=list)  # numbers of each finished run when the race was repeated (app.repeat)
    busy: str = ""  # why this race's speeds are rough (the machine was busy; app.repeat.busy_note), or ''
    warm_since: float = 0.0  # perf_counter when this method's untimed warm-up began (while "warming")
    warm_tokens: int = 0  # how many of the prompt's first tokens that warm-up reads (0: all of them)

    @property
    def title(self) -> str:
        return METHODS[self.method].title if self.method in METHODS else self.method

    @property
    def done(self) -> bool:
        return self.finished not in ("waiting", "warming", "running")

    @property
    def timed(self) -> bool:
        """Whether the run was long enough for a speed to mean anything (``TIMED_TOKENS``)."""
        return bool(self.metrics) and self.metrics.get("new_tokens", TIMED_TOKENS) >= TIMED_TOKENS


# A run of fewer new tokens is mostly the prompt's prefill, the same work for every method: its
# tokens/s says little of the method, so the page claims no speedup and no winner from it.
TIMED_TOKENS = 8


def race_order(methods: list[str]) -> list[str]:
    """Vanilla first (speedups are measured against it in the same race), then registry order."""
    chosen = [m for m in METHODS if m in methods]
    return sorted(chosen, key=lambda m: m != "vanilla")


class Refused(Exception):
    """The race cannot go on: its prompt is too long for the limit on this machine as it is now (read from
    the race's own warm-up). Nothing was timed; the message says why."""


_warm: set[int] = set()


def is_warm(pair) -> bool:
    """Whether this pair's one-off warm-up (``warm_up``) is done."""
    return id(pair) in _warm


_warming = threading.Lock()


def warm_up(pair):
    """Once per pair, a 2-token run of every method through the engine, discarded: the first run in a
    process pays one-off costs (thread start-up, allocator warm-up) that would bias the first method.
    Then this machine's prefill and decoding speeds are measured (``app.prompt_cost.measure``), for the
    prompt's expected cost before a race. Two callers at once (a page opening, a race) warm up once."""
    with _warming:
        if id(pair) in _warm:
            return
        for name in METHODS:
            try:
                generate(pair, "Hello", method=name, max_new_tokens=2)
            except Exception:  # noqa: BLE001  a method this pair cannot run: the race itself reports why
                pass
        prompt_cost.measure(pair)
        _warm.add(id(pair))


WARM_TOKENS = 2  # a prompt warm-up's steps: its prefill and its first decoding step


def warm_prefix(pair, prompt: str, max_new_tokens: int) -> tuple[str, int, int]:
    """(text, its tokens, max new tokens) of a method's warm-up on ``prompt``: the whole prompt when it is
    short, else its first characters, as many tokens as ``Speeds.warm_tokens`` allows, so a long prompt is
    read once per method (timed), not twice. The max new tokens give the warm-up's caches the race's own
    size, so a GPU's stage set for this race is made (captured) in the warm-up, not in the first method."""
    tokens = len(pair.encode(prompt))
    speeds = prompt_cost.speeds_of(pair)
    keep = speeds.warm_tokens(tokens) if speeds is not None else tokens
    if keep >= tokens:
        return prompt, tokens, max_new_tokens
    text = prompt[:max(1, len(prompt) * keep // tokens)]
    read = len(pair.encode(text))
    return text, read, min(MAX_NEW_TOKENS_LIMIT, max_new_tokens + tokens - read)


def warm_up_prompt(pair, prompt: str, results: dict[str, "Result"], stop: threading.Event, max_new_tokens: int = 48,
                   temperature: float = 0.0, options: dict[str, dict] | None = None, **settings) -> list[Trace]:
    """Before a race is timed, a short discarded run (``WARM_TOKENS`` steps) of each of its methods on
    this prompt (its first tokens, if long: ``warm_prefix``), with the race's own options: every model
    the race uses (target, draft, EAGLE head, streams) has then run forwards of this prompt's shapes and
    of its decoding steps, so the method that runs first pays no cold start (a new shape's first
    forward) that the ones after it skip. Each method's result says "warming" meanwhile. Returns the
    warm-ups' traces (their prefills tell how fast the machine is now)."""
    text, read, max_new = warm_prefix(pair, prompt, max_new_tokens)
    traces = []
    for name, result in results.items():
        if stop.is_set():
            break
        result.finished, result.warm_since = "warming", time.perf_counter()
        result.warm_tokens = read if text != prompt else 0  # 0: the whole prompt
        try:
            steps = stream(pair, text, method=name, max_new_tokens=max_new, temperature=temperature, stop=stop,
                           **settings, **(options or {}).get(name, {}))
            for i, out in enumerate(steps):
                if i + 1 >= WARM_TOKENS:
                    steps.close()
                    break
            traces.append(out.trace)
        except MirrorSDError:  # the race itself reports what the engine refuses
            pass
        finally:
            result.finished = "waiting"
    return traces


def run_race(pair, prompt: str, methods: list[str], stop: threading.Event, max_new_tokens: int = 48,
             temperature: float = 0.0, options: dict[str, dict] | None = None, warm: bool = True,
             check: Callable[[], str] | None = None, **settings) -> Iterator[dict]:
    """Yield {method: Result} at the start, as each method starts, and after each committed step.

    Methods run in race order. The first race on a pair starts with a discarded warm-up (``warm_up``),
    and every race (``warm``: its first run) with a discarded warm-up of its methods on its prompt
    (``warm_up_prompt``). Those warm-ups' prefills tell how fast this machine is now
    (``prompt_cost.observe``); then ``check()`` says whether the race still fits its limit ('' when it
    does), else ``Refused`` is raised before any method is timed. ``options`` maps a method to its own
    options; ``settings`` (top_p, seed, raw) go to every method. A method the engine refuses (bad
    options, a prompt too long) gets a Result with ``error`` and the race goes on with the next one.
    ``stop`` ends the race within about a second, the warm-ups included.
    """
    order = race_order(methods)
    results = {name: Result(name, Trace(name)) for name in order}
    yield results  # every method waiting (the page can say so during the warm-up)
    for _ in in_background(lambda: warm_up(pair), tick_s=0.25):  # every tick of it, so the page can count it
        if stop.is_set():  # the one-off warm-up goes on for the server; this race ends now
            break
        yield results
    if warm and not stop.is_set():
        warmed = yield from _warm_in_background(pair, prompt, results, stop, max_new_tokens, temperature, options,
                                                settings)
        if not stop.is_set():  # a stopped warm-up's prefill is cut short: it says nothing of the speed
            prompt_cost.observe(pair, warmed)
        problem = check() if check is not None and not stop.is_set() else ""
        if problem:
            for result in results.values():
                result.finished = "refused"
            raise Refused(problem)
    for name in order:
        if stop.is_set():
            break
        results[name].finished = "running"
        yield results
        yield from _run_one(pair, prompt, results[name], stop, max_new_tokens, temperature,
                            (options or {}).get(name, {}), settings, results)
    for result in results.values():
        if result.finished == "waiting":  # the race was stopped before this method's turn
            result.finished = "skipped"
    prompt_cost.observe(pair, [r.trace for r in results.values() if r.finished in ("eos", "length")])
    yield results


def _warm_in_background(pair, prompt, results, stop, max_new_tokens, temperature, options, settings):
    """``warm_up_prompt`` in a background thread, yielding the results every quarter second (the page
    shows which method warms and for how long); returns the warm-ups' traces."""
    work = in_background(lambda: warm_up_prompt(pair, prompt, results, stop, max_new_tokens, temperature, options,
                                                **settings), tick_s=0.25)
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value
        yield results


def _run_one(pair, prompt, result: Result, stop, max_new_tokens, temperature, options, settings, results):
    steps = stream(pair, prompt, method=result.method, max_new_tokens=max_new_tokens, temperature=temperature,
                   stop=stop, **settings, **options)
    try:
        for out in steps:
            _update(result, out, pair, prompt)
            yield results
            if stop.is_set() and out.finished == "running":
                steps.close()  # the engine stops here, keeping what was committed
                result.finished = "stopped"
                yield results
                return
    except MirrorSDError as e:
        result.finished, result.error = "error", str(e)
        yield results


def _update(result: Result, out, pair, prompt: str):
    result.trace, result.metrics, result.finished, result.error = out.trace, out.metrics, out.finished, out.error
    result.trace.meta["prompt"] = prompt  # the exports name it (the engine's meta counts its tokens only)
    mark_live(result.trace.meta, pair)  # the card's badge names this server's processor; exports carry it
    collect_pieces(out.trace, pair.decode, result.pieces, from_step=result.seen_steps)
    result.seen_steps = len(out.trace.steps)
