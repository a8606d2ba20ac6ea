"""A race's expected time on this server, learnt from the races it has finished.

The warm-up's probe (``app.prompt_cost``) times a few short runs once; its guess for a whole race can be
off several times over, both ways, since a race's decoding steps, warm-ups and hand-offs are not what
those runs time. So every race that runs to its end is read back here: each method's seconds per new
token (its run's wall time less its prefill, over the tokens it wrote) and the race's own overhead per
method (the warm-ups, the page's updates: the race's wall time less its methods' runs). The next race
is then expected to take, per chosen method, that overhead plus, per run, reading the prompt (the
probe's prefill curve, scaled to the machine now) and writing max new tokens at that method's pace.
Before any race has finished, the probe's own guess is the estimate, and says so.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from statistics import median

from .prompt_cost import prefill_spans, speeds_of

REMEMBER = 8  # the last races each number is a median of: a busy moment passes, a slower machine shows soon


@dataclass
class Estimate:
    seconds: float
    races: int  # how many finished races it was learnt from (0: the warm-up's probe alone)

    def source(self) -> str:
        if not self.races:
            return "from the warm-up's probe, before any race here"
        return f"from the last {self.races} race{'' if self.races == 1 else 's'} here"


class Learnt:
    """One pair's learnt costs: per method, seconds per new token and per prompt token (without a probe);
    per race, the seconds each method added beyond its timed runs."""

    def __init__(self):
        self.per_token: dict[str, deque] = {}
        self.per_prompt_token: dict[str, deque] = {}
        self.overhead: deque = deque(maxlen=REMEMBER)

    def pace(self, method: str) -> tuple[float, float]:
        """(seconds per new token, per prompt token) of ``method``, or of the methods seen where it is not."""
        if method in self.per_token:
            return median(self.per_token[method]), median(self.per_prompt_token[method])
        return (median(median(d) for d in self.per_token.values()),
                median(median(d) for d in self.per_prompt_token.values()))


_learnt: dict[int, Learnt] = {}
_lock = threading.Lock()


def learn(pair, results: dict, runs: int, wall_s: float) -> bool:
    """Read a finished race back: ``results`` ({method: Result} of its last run), ``runs`` how many runs it
    made, ``wall_s`` its wall time from the models loaded to its end. Only methods that ran to their end
    count; a race with none teaches nothing. Returns whether it was learnt from."""
    done = [r for r in results.values() if r.finished in ("eos", "length") and r.metrics.get("new_tokens")]
    if not done or wall_s <= 0:
        return False
    timed = 0.0
    with _lock:
        learnt = _learnt.setdefault(id(pair), Learnt())
        for r in done:
            prefill = sum(prefill_spans(r.trace))
            run_s, tokens = r.metrics["wall_s"], r.metrics["new_tokens"]
            prompt = int(r.trace.meta.get("prompt_tokens") or 1)
            learnt.per_token.setdefault(r.method, deque(maxlen=REMEMBER)).append(max(run_s - prefill, 0.0) / tokens)
            learnt.per_prompt_token.setdefault(r.method, deque(maxlen=REMEMBER)).append(prefill / prompt)
            timed += max(1, runs) * run_s
        learnt.overhead.append(max(wall_s - timed, 0.0) / len(done))
    return True


def race_s(pair, methods: list[str], tokens: int, max_new: int, runs: int = 1) -> Estimate | None:
    """The expected seconds of a race on ``pair``: learnt from the races finished here where there are any,
    else the warm-up probe's guess; None before either exists."""
    speeds = speeds_of(pair)
    with _lock:
        learnt = _learnt.get(id(pair))
        if learnt is None or not learnt.overhead:
            if speeds is None:
                return None
            return Estimate(speeds.race_s(tokens, len(methods) or 1, max_new, runs), 0)
        total = 0.0
        for method in methods or ["vanilla"]:
            per_token, per_prompt_token = learnt.pace(method)
            read = speeds.read_s(tokens) if speeds is not None else per_prompt_token * tokens
            total += median(learnt.overhead) + max(1, runs) * (read + per_token * max_new)
        return Estimate(total, len(learnt.overhead))


def forget(pair):
    """Drop what was learnt for ``pair`` (a test's own pair)."""
    with _lock:
        _learnt.pop(id(pair), None)
