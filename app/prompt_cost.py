"""What a prompt will cost before it is raced: its length in tokens, its prefill time and the race's time,
from speeds measured on this machine by the engine's own spans (``measure_speeds``, run once per pair
at warm-up), and the limit on prompt tokens past which a live race would take minutes.

A target prefill of T tokens costs a*T + b*T^2 (the linear layers, and attention over the prompt),
fitted to two measured prefills (where the shorter one cost more per token: a fixed cost plus a*T);
the draft's prefill (sd, Mirror-SD) adds a measured share of that; a decoding step after a prompt of
T tokens costs step_s + c*T, fitted to the decoding steps measured after those two prompts. Every
method of a race reads the prompt once, timed, after a warm-up on its first tokens (at most
``WARM_PREFILL_S`` of prefill: ``warm_tokens``), and decodes up to max new tokens; the estimate takes
every step at vanilla's cost of one token a step, so it errs long for speculative methods. A prompt
is refused when its own part of that time (the prefills, the attention to it) passes ``RACE_LIMIT_S``.

The speeds are measured once, but a machine gets slower when other work shares it: every race's
prefills are compared with what the speeds predict (``observe``), and the estimates scale by how many
times slower the last race found the machine (``Speeds.slower``, at least 1). A race checks the limit
again with its own warm-up's reading before any method is timed, so the limit holds on a machine
slower than the one that measured it (``app.race.run_race``). The race's expected time shown is this
probe's only until a race has run to its end here: from then on it is learnt from the races run
(``app.estimate``), which the probe's short runs can miss several times over.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from mirror_sd import MirrorSDError, generate
from mirror_sd.trace import SpanKind

RACE_LIMIT_S = 120.0  # a prompt expected to add more than this to its race is refused: others wait behind it
MEASURE_TOKENS = 2048  # the longer measured prefill (at most a quarter of the target's context), and the shorter
# a quarter of it: attention's share of a prefill shows only past about 1,000 tokens (on the 2-core CPU a token
# of prefill cost 1.7 ms at 128 to 1,024 tokens, then 2.4 ms at 2,048, 3.6 at 4,096, 4.7 at 6,000), so a fit
# through 128 and 1,024 tokens read a prompt of 3,653 about 1.5 times too fast
WARM_PREFILL_S = 0.5  # a method's warm-up reads the prompt's first tokens, at most this much prefill, and at
WARM_MIN_TOKENS = 64  # least this many (a GPU's prefill chunk): enough for every shape but the prompt's length
WORD = " sky"  # the measured prompts: this word repeated, as many times as makes the wanted tokens


@dataclass
class Speeds:
    """This machine's measured costs for one pair: the target's prefill of T tokens a*T + b*T^2 seconds,
    the draft's ``draft`` times that; a decoding step after T tokens step_s + c*T seconds; the prefill
    rate at the longer measured length, to quote. ``slower``: how many times slower than measured the
    last race found this machine (``observe``); every estimate is scaled by it."""
    a: float
    b: float
    step_s: float
    c: float
    rate: float  # tokens/s of the longer measured prefill
    rate_at: int  # its length in tokens
    draft: float = 0.0  # the draft's prefill as a share of the target's (methods with a draft read it with both)
    slower: float = 1.0
    fixed: float = 0.0  # seconds every prefill costs whatever its length (thread hand-offs, a short one's overheads)

    def fitted_s(self, tokens: int) -> float:
        """The target's prefill of ``tokens`` as measured at warm-up (not scaled by ``slower``)."""
        return self.fixed + self.a * tokens + self.b * tokens * tokens

    def prefill_s(self, tokens: int) -> float:
        """The target's prefill of ``tokens`` on this machine now."""
        return self.slower * self.fitted_s(tokens)

    def read_s(self, tokens: int) -> float:
        """One method's reading of ``tokens``, the draft's prefill counted for every method (so it errs long)."""
        return (1 + self.draft) * self.prefill_s(tokens)

    def warm_tokens(self, tokens: int) -> int:
        """How much of a prompt of ``tokens`` each method's warm-up reads: its first tokens, as many as take
        ``WARM_PREFILL_S`` to prefill (at least ``WARM_MIN_TOKENS``), so a long prompt is not read again
        once per method before the race is timed."""
        fits = _longest(lambda t: self.read_s(t) <= WARM_PREFILL_S, max(tokens, 1))
        return min(tokens, max(WARM_MIN_TOKENS, fits))

    def race_s(self, tokens: int, methods: int, max_new: int, runs: int = 1) -> float:
        """The expected time of a race: every method reads the prompt (and its warm-up prefix) and decodes
        ``max_new`` tokens."""
        steps = max(1, runs) * max(1, methods) * max_new * self.step_s * self.slower
        return self.prompt_s(tokens, methods, max_new, runs) + steps

    def prompt_s(self, tokens: int, methods: int, max_new: int, runs: int = 1) -> float:
        """The part of the race's time the prompt adds: each method's warm-up prefix and its timed reading of
        the prompt, and its decoding steps' attention to it (the warm-up once per race, the rest per run)."""
        warm = self.read_s(self.warm_tokens(tokens))
        per_run = self.read_s(tokens) + max_new * self.c * self.slower * tokens
        return max(1, methods) * (warm + max(1, runs) * per_run)

    def max_tokens(self, methods: int, max_new: int, runs: int = 1, limit_s: float | None = None) -> int:
        """The longest prompt (tokens) that adds at most ``limit_s`` (None: ``RACE_LIMIT_S``) to its race."""
        limit_s = RACE_LIMIT_S if limit_s is None else limit_s
        return _longest(lambda t: self.prompt_s(t, methods, max_new, runs) <= limit_s)


def _longest(fits, high: int = 10**7) -> int:
    """The largest n in [0, high] for which ``fits(n)`` holds (fits grows false with n; 0 when none does)."""
    low, top = 0, 1
    while top < high and fits(top):
        low, top = top, min(2 * top, high)
    if fits(top):
        return top
    while top - low > 1:
        mid = (low + top) // 2
        low, top = (mid, top) if fits(mid) else (low, mid)
    return low


def prefill_spans(trace) -> tuple[float, float]:
    """(target's, draft's) prefill seconds in a run's trace, from its spans."""
    target = trace.lane_label("target")
    spans = [s for s in trace.spans if s.kind == SpanKind.PREFILL]
    return (sum(s.duration for s in spans if s.lane == target), sum(s.duration for s in spans if s.lane != target))


def _prefill(pair, tokens: int, method: str) -> tuple[int, float, float, list[float]]:
    """(prompt tokens, target's prefill seconds, draft's, decoding step seconds) of one short run of
    ``method`` on a prompt of about ``tokens`` tokens, from its spans."""
    per_word = max(1.0, len(pair.encode(WORD * 8, raw=True)) / 8)
    out = generate(pair, WORD * max(1, int(tokens / per_word)), method=method, max_new_tokens=4, raw=True)
    target, draft = prefill_spans(out.trace)
    steps = [s.duration for s in out.trace.spans if s.kind == SpanKind.DECODE]
    return int(out.trace.meta.get("prompt_tokens") or tokens), target, draft, steps


def measure_speeds(pair) -> Speeds:
    """Prefill and decoding steps after two prompt lengths (each target prefill the faster of two runs,
    each step the median), read from the engine's spans on this machine. The second run of each length
    is speculative decoding's where the pair has a draft: its draft prefill of the longer prompt gives
    the draft's share."""
    long = max(16, min(MEASURE_TOKENS, pair.context_length // 4))
    points, share = [], 0.0
    for tokens in (long // 4, long):
        second = "sd" if pair.draft is not None else "vanilla"
        runs = [_prefill(pair, tokens, "vanilla"), _prefill(pair, tokens, second)]
        steps = sorted(d for *_, ds in runs for d in ds)
        tokens, seconds = min(((t, s) for t, s, _, _ in runs), key=lambda p: p[1])
        share = runs[1][2] / seconds if seconds else 0.0  # the longer prompt's: fewer fixed overheads in it
        points.append((tokens, seconds, steps[len(steps) // 2] if steps else seconds / tokens))
    (t1, s1, d1), (t2, s2, d2) = points
    a, b, fixed = fit_prefill(t1, s1, t2, s2)
    c = max(0.0, (d2 - d1) / (t2 - t1)) if t2 != t1 else 0.0
    return Speeds(a=a, b=b, step_s=max(d1 - c * t1, 0.0), c=c, rate=t2 / s2 if s2 else float("inf"), rate_at=t2,
                  draft=share, fixed=fixed)


def fit_prefill(t1: int, s1: float, t2: int, s2: float) -> tuple[float, float, float]:
    """(a, b, fixed) through two measured prefills (t1 < t2 tokens, s1 and s2 seconds): a*T + b*T^2 where the
    longer one cost more per token (attention grows with the prompt); else fixed + a*T, the shorter one's
    overheads a fixed cost, not a per-token one that would make every long prompt look slow."""
    if t2 == t1:
        return max(s2 / t2, 1e-9), 0.0, 0.0
    if s2 / t2 >= s1 / t1:
        b = (s2 / t2 - s1 / t1) / (t2 - t1)
        return max(s1 / t1 - b * t1, 1e-9), b, 0.0
    a = max((s2 - s1) / (t2 - t1), 1e-9)
    return a, 0.0, max(s1 - a * t1, 0.0)


def observe(pair, traces) -> float | None:
    """How many times slower than measured the target's prefills in ``traces`` (runs on ``pair``) were;
    the pair's speeds then scale every estimate by it (at least 1: a machine as fast as measured, or
    faster, keeps the measured speeds). Only prefills of at least ``WARM_MIN_TOKENS`` count: a prompt of
    a few tokens costs mostly fixed overheads the fit leaves out. None before the speeds are measured,
    or with no such prefill."""
    speeds = speeds_of(pair)
    if speeds is None:
        return None
    seen = [(prefill_spans(t)[0], int(t.meta.get("prompt_tokens") or 0)) for t in traces]
    seen = [(s, n) for s, n in seen if s > 0 and n >= WARM_MIN_TOKENS]
    if not seen:
        return None
    ratio = sum(s for s, _ in seen) / sum(speeds.fitted_s(n) for _, n in seen)
    speeds.slower = max(1.0, ratio)
    return ratio


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


def slower_note(speeds: Speeds) -> str:
    """'' or, when the last race found this machine slower than its warm-up did, by how much."""
    if speeds.slower < 1.05:
        return ""
    return f"; {speeds.slower:.1f}× slower now, from the last race's prefills"


def prompt_line(tokens: int | None, chars: int, speeds: Speeds | None, methods: int, max_new: int,
                runs: int = 1, expected=None) -> str:
    """One line under the prompt: its length in tokens, its expected prefill per method and the race's
    expected time on this machine (``expected``: an ``app.estimate.Estimate``, calibrated on the races run
    here; None: the warm-up probe's guess), or what is missing for them."""
    if tokens is None:
        return f"Prompt: {chars:,} characters; its length in tokens shows once the models have loaded."
    if speeds is None:
        return f"Prompt: {tokens:,} tokens; its expected prefill time shows once the warm-up has measured this machine."
    race = expected.seconds if expected is not None else speeds.race_s(tokens, methods, max_new, runs)
    source = expected.source() if expected is not None else "from the warm-up's probe"
    line = (f"Prompt: **{tokens:,} tokens**; reading it (prefill) takes about {_duration(speeds.read_s(tokens))} "
            f"per method here (measured: {speeds.rate:,.0f} tokens/s at {speeds.rate_at:,} tokens"
            f"{slower_note(speeds)}); this race, about {_duration(race)} ({source}).")
    problem = too_long(tokens, chars, speeds, methods, max_new, runs)
    return f"{line} {problem}" if problem else line


def too_long(tokens: int, chars: int, speeds: Speeds | None, methods: int, max_new: int, runs: int = 1) -> str:
    """Why a prompt is too long for a live race here ('' when it is not): reading it would add minutes to
    the race. The limit is on the prompt's own part, so a machine slow to decode refuses no short prompt."""
    if speeds is None or speeds.prompt_s(tokens, methods, max_new, runs) <= RACE_LIMIT_S:
        return ""
    limit = speeds.max_tokens(methods, max_new, runs)
    per_token = chars / tokens if tokens else 4.0
    each = f"{methods} method{'' if methods == 1 else 's'}, each reading it once after a short warm-up"
    slower = f"; this machine is {speeds.slower:.1f}× slower now than when it was measured" if speeds.slower >= 1.05 \
        else ""
    return (f"**Too long for a live race here:** reading {tokens:,} tokens would add about "
            f"{_duration(speeds.prompt_s(tokens, methods, max_new, runs))} to this race ({each}{slower}), over "
            f"the limit of {_duration(RACE_LIMIT_S)}, while others wait their turn. Keep it under about {limit:,} "
            f"tokens (about {int(limit * per_token):,} characters), or race fewer methods or runs.")


def short_refusal(tokens: int, speeds: Speeds, methods: int, max_new: int, runs: int = 1) -> str:
    """The refusal in one sentence (Run's error, for an API caller); the line under the prompt gives the
    whole reason (``prompt_line``)."""
    limit = speeds.max_tokens(methods, max_new, runs)
    slower = f" (this machine is {speeds.slower:.1f}× slower now than when measured)" if speeds.slower >= 1.05 else ""
    return (f"{tokens:,} tokens would add about {_duration(speeds.prompt_s(tokens, methods, max_new, runs))} to this "
            f"race, over the limit of {_duration(RACE_LIMIT_S)}{slower}: keep it under about {limit:,} tokens.")
