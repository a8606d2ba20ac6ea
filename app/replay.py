"""Replay of a finished race, side by side, at the speed each method was measured to decode.

A step counts as committed when its last span ends (its rendezvous or verification), so the
replay shows every method's text growing exactly as fast as it grew in its own run.
"""
from __future__ import annotations

from mirror_sd.trace import Trace


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
