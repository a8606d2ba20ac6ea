"""How a step's phases run on the two lanes: the one seam between a method's algorithm and the hardware.

A method writes its step as phases, each a function handed to an executor with the lane it runs
on: ``ex.start(lane, kind, fn, *args)``. An argument that is another phase is that phase's value,
and a dependency: the executor makes the phase wait for it. ``phase.result()`` is the value on the
host, once the work is done. The method never asks which executor runs it; both run the same
functions, in the same order, on the same tensors.

* :class:`Threads`: each lane's work on the lane's own worker thread, so the two lanes work at
  the same time (on a CPU, each on its share of the cores). A phase waits on the host for the
  phases of the *other* lane it reads before it is handed over; one of its own lane's is done
  already when it starts (a lane runs its work in order).
* :class:`Streams`: every phase queued from the calling thread on its lane's CUDA stream, nothing
  waiting for the host: a phase's stream waits for the other lane's phases it reads on CUDA
  events, and the host waits once, when it reads a result. On CPU lanes the same phases run in
  turn, each to its end (the reference order: no overlap at all). Methods whose phases follow one
  another (vanilla, sd, eagle, ss) always run on it; Mirror-SD's ``queued`` option picks.
"""
from __future__ import annotations

from concurrent.futures import Future

from .devices import Queued


class Phase:
    """One phase of a step: its lane, and its value on the host (``result``) once done."""

    def __init__(self, lane, future: Future | None = None, value=None, queued: Queued | None = None):
        self.lane, self.future, self.value, self.queued = lane, future, value, queued

    def result(self):
        """The phase's value, waiting for its work (and recording its span) first."""
        if self.future is not None:
            return self.future.result()
        self.queued.record()
        return self.value


class Threads:
    """Phases on the lanes' worker threads: the lanes overlap (module docstring)."""

    queued = False

    def start(self, lane, kind: str, fn, *args, alone: bool = False, **span) -> Phase:
        """Run fn(*args) on ``lane``'s thread; a phase in ``args`` is replaced by its value. ``alone``:
        no other lane works meanwhile, so the work may take the cores the lanes share."""
        values = [a.result() if isinstance(a, Phase) and a.lane is not lane else a for a in args]

        def body():  # a phase of this lane ran before this one on the same thread: done by now
            return fn(*(a.result() if isinstance(a, Phase) else a for a in values))

        return Phase(lane, future=lane.submit(kind, body, alone=alone, **span))

    def widening(self, lane) -> Widening:
        """For ``lane``'s work to call between layers: once the other lane's phase given to ``after``
        is done, it takes every core ``lane`` may use alone (``Lane.widen_when_done``)."""
        return Widening(lane)

    def finish(self, *phases: Phase):
        """Wait for every phase."""
        for phase in phases:
            phase.result()


class Streams:
    """Phases queued on the lanes' streams from this thread; the host waits when it reads a result."""

    queued = True

    def start(self, lane, kind: str, fn, *args, alone: bool = False, **span) -> Phase:
        """Queue fn(*args) on ``lane``'s stream; a phase in ``args`` is replaced by its value (on the
        device, maybe not made yet), and this stream waits for the other lane's phases on their
        CUDA events. ``alone`` does not apply: queued work has no threads to widen."""
        events = [a.queued.done for a in args if isinstance(a, Phase) and a.lane is not lane and a.queued.done]
        if len(events) > 1:
            raise ValueError("a queued phase waits for one phase of the other lane at most")
        values = [a.value if isinstance(a, Phase) else a for a in args]
        value, queued = lane.queue(kind, fn, *values, after=events[0] if events else None, **span)
        return Phase(lane, value=value, queued=queued)

    def widening(self, lane) -> Widening:
        """Queued work has no threads to widen: a widening that never does."""
        return Widening(None)

    def finish(self, *phases: Phase):
        """Wait for every phase, in order, and record its span."""
        for phase in phases:
            phase.queued.record()


class Widening:
    """Called between the layers of one lane's work: once ``after``'s phase (the other lane's work,
    started later) is done, the lane takes the cores the lanes shared (none for ``lane`` None)."""

    def __init__(self, lane):
        self.lane, self.beside = lane, None

    def after(self, phase: Phase):
        self.beside = phase

    def __call__(self):
        if self.lane is not None and self.beside is not None:
            self.lane.widen_when_done(self.beside.future)


def executor_for(run, queued: int, possible: bool = True) -> Threads | Streams:
    """``Streams`` with ``queued`` 1, ``Threads`` with 0, and with -1 ``Streams`` where both lanes are
    CUDA devices; ``Threads`` wherever the method cannot queue its steps (``possible`` False)."""
    cuda = run.pair.target_lane.device.type == "cuda" and run.pair.draft_lane.device.type == "cuda"
    return Streams() if possible and (queued == 1 or (queued == -1 and cuda)) else Threads()
