"""What a prompt will cost before it is raced: its length in tokens, its prefill time and the race's time,
from speeds measured on this machine by the engine's own spans (``measure_speeds``, run once per pair
at warm-up), and the limit on prompt tokens past which a live race would take minutes.

A prefill of T tokens costs a*T + b*T^2 (the linear layers, and attention over the prompt), fitted to two
measured prefills; a decoding step after a prompt of T tokens costs step_s + c*T, fitted to the decoding
steps measured after those two prompts. Every method of a race reads the prompt twice (its
warm-up on the prompt, then its timed run) and decodes up to max new tokens; the estimate takes every
step at vanilla's cost of one token a step, so it errs long for speculative methods. A prompt is
refused when its own part of that time (the prefills, the attention to it) passes ``RACE_LIMIT_S``.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from mirror_sd import MirrorSDError, generate
from mirror_sd.trace import SpanKind

RACE_LIMIT_S = 120.0  # a prompt expected to add more than this to its race is refused: others wait behind it
MEASURE_TOKENS = 1024  # the longer measured prefill (at most a quarter of the target's context)
WORD = " sky"  # the measured prompts: this word repeated, as many times as makes the wanted tokens


@dataclass
class Speeds:
    """This machine's measured costs for one pair: prefill of T tokens a*T + b*T^2 seconds; a decoding
    step after T tokens step_s + c*T seconds; the prefill rate at the longer measured length, to quote."""
    a: float
    b: float
    step_s: float
    c: float
    rate: float  # tokens/s of the longer measured prefill
    rate_at: int  # its length in tokens

    def prefill_s(self, tokens: int) -> float:
        return self.a * tokens + self.b * tokens * tokens

    def race_s(self, tokens: int, methods: int, max_new: int, runs: int = 1) -> float:
        """The expected time of a race: every method reads the prompt twice and decodes ``max_new`` tokens."""
        return self.prompt_s(tokens, methods, max_new, runs) + max(1, runs) * max(1, methods) * max_new * self.step_s

    def prompt_s(self, tokens: int, methods: int, max_new: int, runs: int = 1) -> float:
        """The part of the race's time the prompt adds: its prefills and its decoding steps' attention to it."""
        per_method = 2 * self.prefill_s(tokens) + max_new * self.c * tokens
        return max(1, runs) * max(1, methods) * per_method

    def max_tokens(self, methods: int, max_new: int, runs: int = 1, limit_s: float = RACE_LIMIT_S) -> int:
        """The longest prompt (tokens) that adds at most ``limit_s`` to its race."""
        low, high = 0, 1
        while self.prompt_s(high, methods, max_new, runs) <= limit_s and high < 10**7:
            high *= 2
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.prompt_s(mid, methods, max_new, runs) <= limit_s else (low, mid)
        return low


def _prefill(pair, tokens: int) -> tuple[int, float, list[float]]:
    """(prompt tokens, prefill seconds, decoding step seconds) of one short vanilla run on a prompt of
    about ``tokens`` tokens, from its spans."""
    per_word = max(1.0, len(pair.encode(WORD * 8, raw=True)) / 8)
    out = generate(pair, WORD * max(1, int(tokens / per_word)), method="vanilla", max_new_tokens=4, raw=True)
    prefill = sum(s.duration for s in out.trace.spans if s.kind == SpanKind.PREFILL)
    steps = [s.duration for s in out.trace.spans if s.kind == SpanKind.DECODE]
    return int(out.trace.meta.get("prompt_tokens") or tokens), prefill, steps


def measure_speeds(pair) -> Speeds:
    """Prefill and decoding steps after two prompt lengths (each prefill the faster of two runs, each
    step the median), read from the engine's spans on this machine."""
    long = max(16, min(MEASURE_TOKENS, pair.context_length // 4))
    points = []
    for tokens in (long // 8, long):
        runs = [_prefill(pair, tokens) for _ in range(2)]
        steps = sorted(d for _, _, ds in runs for d in ds)
        tokens, seconds = min(((t, s) for t, s, _ in runs), key=lambda p: p[1])
        points.append((tokens, seconds, steps[len(steps) // 2] if steps else seconds / tokens))
    (t1, s1, d1), (t2, s2, d2) = points
    b = max(0.0, (s2 / t2 - s1 / t1) / (t2 - t1)) if t2 != t1 else 0.0
    a = max(s1 / t1 - b * t1, s2 / t2 - b * t2, 1e-9)
    c = max(0.0, (d2 - d1) / (t2 - t1)) if t2 != t1 else 0.0
    return Speeds(a=a, b=b, step_s=max(d1 - c * t1, 0.0), c=c, rate=t2 / s2 if s2 else float("inf"), rate_at=t2)


_speeds: dict[int, Speeds] = {}
_lock = threading.Lock()


def speeds_of(pair) -> Speeds | None:
    """This pair's measured speeds, once ``measure`` has run for it (at warm-up), else None."""
    return _speeds.get(id(pair))


def measure(pair) -> Speeds | None:
    """Measure this pair's speeds once (later calls return the first measurement); None where the
    engine refuses the measuring runs (a pair that cannot run vanilla: its races say why)."""
    with _lock:
        if id(pair) not in _speeds:
            try:
                _speeds[id(pair)] = measure_speeds(pair)
            except MirrorSDError:
                return None
        return _speeds[id(pair)]


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{1000 * seconds:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} minutes"


def prompt_line(tokens: int | None, chars: int, speeds: Speeds | None, methods: int, max_new: int,
                runs: int = 1) -> str:
    """One line under the prompt: its length in tokens, its expected prefill per method and the race's
    expected time on this machine, or what is missing for them."""
    if tokens is None:
        return f"Prompt: {chars:,} characters; its length in tokens shows once the models have loaded."
    if speeds is None:
        return f"Prompt: {tokens:,} tokens; its expected prefill time shows once the warm-up has measured this machine."
    race = speeds.race_s(tokens, methods, max_new, runs)
    line = (f"Prompt: **{tokens:,} tokens**; reading it (prefill) takes about {_duration(speeds.prefill_s(tokens))} "
            f"per method here (measured: {speeds.rate:,.0f} tokens/s at {speeds.rate_at:,} tokens); this race, "
            f"about {_duration(race)}.")
    problem = too_long(tokens, chars, speeds, methods, max_new, runs)
    return f"{line} {problem}" if problem else line


def too_long(tokens: int, chars: int, speeds: Speeds | None, methods: int, max_new: int, runs: int = 1) -> str:
    """Why a prompt is too long for a live race here ('' when it is not): reading it would add minutes to
    the race. The limit is on the prompt's own part, so a machine slow to decode refuses no short prompt."""
    if speeds is None or speeds.prompt_s(tokens, methods, max_new, runs) <= RACE_LIMIT_S:
        return ""
    limit = speeds.max_tokens(methods, max_new, runs)
    per_token = chars / tokens if tokens else 4.0
    return (f"**Too long for a live race here:** reading {tokens:,} tokens would add about "
            f"{_duration(speeds.prompt_s(tokens, methods, max_new, runs))} to this race ({methods} method"
            f"{'' if methods == 1 else 's'}, each reading it twice: a warm-up, then its timed run), over the "
            f"{RACE_LIMIT_S / 60:.0f}-minute limit, while others wait their turn. Keep it under about {limit:,} "
            f"tokens (about {int(limit * per_token):,} characters), or race fewer methods or runs.")
