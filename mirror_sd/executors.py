"""How a step's phases run on the two lanes: the one seam between a method's algorithm and the hardware.

A method writes its step as phases, each a function handed to an executor with the lane it runs
on: ``ex.start(lane, kind, fn, *args)``. An argument that is another phase is that phase's value,
and a dependency: the executor makes the phase wait for it. ``phase.result()`` is the value on the
host, once the work is done. Two phases meant to run at the same time, on two lanes, are started
together: ``ex.overlap(main, beside)``; work the step can do without, which only a queued step
does, is handed to ``ex.aside``. The method never asks which executor runs it; both run the same
functions, in the same order, on the same tensors. How many CPU cores a phase takes is the
executor's business too.

* :class:`Threads`: each lane's work on the lane's own worker thread, so the two lanes work at
  the same time (on a CPU, each on its share of the cores). A phase waits on the host for the
  phases of the *other* lane it reads before it is handed over; one of its own lane's is done
  already when it starts (a lane runs its work in order). A phase no other lane works beside may
  take every core (``Threads``' docstring).
* :class:`Streams`: every phase queued from the calling thread on its lane's CUDA stream, nothing
  waiting for the host: a phase's stream waits for the other lane's phases it reads on CUDA
  events, and the host waits once, when it reads a result. On CPU lanes the same phases run in
  turn, each to its end (the reference order: no overlap at all). Methods whose phases follow one
  another (vanilla, sd, eagle, ss) always run on it; Mirror-SD's steps where both lanes are CUDA
  devices (``executor_for``).
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from .devices import Queued


class Phase:
    """One phase of a step: its lane, and its value on the host (``result``) once done."""

    def __init__(self, lane, future: Future | None = None, value=None, queued: Queued | None = None):
        self.lane, self.future, self.value, self.queued = lane, future, value, queued
        self.read = False  # the host has asked for its value

    def result(self):
        """The phase's value, waiting for its work (and recording its span) first."""
        self.read = True
        if self.future is not None:
            return self.future.result()
        self.queued.record()
        return self.value


@dataclass
class Work:
    """A phase still to start (``overlap``, ``aside``): fn(*args) on ``lane``, its span of ``kind``
    labelled by ``span`` (label, step, tokens)."""

    lane: object
    kind: str
    fn: object
    args: tuple
    span: dict = field(default_factory=dict)


def work(lane, kind: str, fn, *args, **span) -> Work:
    return Work(lane, kind, fn, args, span)


class Threads:
    """Phases on the lanes' worker threads: the lanes overlap (module docstring).

    The cores: a phase started while the host has read every phase of the other lanes runs alone (no
    other lane works meanwhile: one that reads it waits for it), so on a CPU it may take every core
    the lanes share (``Lane.submit(alone=True)``). Phases started together (``overlap``) each take
    their lane's share, and the first widens to every core once the other is done."""

    queued = False

    def __init__(self):
        self.unread: list[Phase] = []  # phases started, not yet read by the host

    def start(self, lane, kind: str, fn, *args, **span) -> Phase:
        """Run fn(*args) on ``lane``'s thread; a phase in ``args`` is replaced by its value."""
        self.unread = [p for p in self.unread if not p.read]
        return self._start(Work(lane, kind, fn, args, span), all(p.lane is lane for p in self.unread))

    def overlap(self, main: Work, beside: Work) -> tuple[Phase, Phase]:
        """Start ``main``, then ``beside`` on another lane, to run at the same time. main's fn gets
        ``each_layer``, a function to call between its layers: once beside is done, main's lane
        takes every core it may use alone (``Lane.widen_when_done``), so that no core idles."""
        widen = Widening(main.lane)
        first = self._start(main, alone=False, each_layer=widen)
        widen.beside = self._start(beside, alone=False)
        return first, widen.beside

    def aside(self, w: Work) -> None:
        """Work the step can do without (Mirror-SD's correction rollout): none on the lanes' threads,
        where it would still write the draft cache while the host rolls that back for the next step."""
        return None

    def finish(self, *phases: Phase):
        """Wait for every phase."""
        for phase in phases:
            phase.result()

    def _start(self, w: Work, alone: bool, **kwargs) -> Phase:
        values = [a.result() if isinstance(a, Phase) and a.lane is not w.lane else a for a in w.args]

        def body():  # a phase of this lane ran before this one on the same thread: done by now
            return w.fn(*(a.future.result() if isinstance(a, Phase) else a for a in values), **kwargs)

        phase = Phase(w.lane, future=w.lane.submit(w.kind, body, alone=alone, **w.span))
        self.unread.append(phase)
        return phase


class Streams:
    """Phases queued on the lanes' streams from this thread; the host waits when it reads a result.
    Queued work has no threads to widen: every phase runs as it is."""

    queued = True

    def start(self, lane, kind: str, fn, *args, **span) -> Phase:
        """Queue fn(*args) on ``lane``'s stream; a phase in ``args`` is replaced by its value (on the
        device, maybe not made yet), and this stream waits for the other lane's phases on their
        CUDA events."""
        events = [a.queued.done for a in args if isinstance(a, Phase) and a.lane is not lane and a.queued.done]
        if len(events) > 1:
            raise ValueError("a queued phase waits for one phase of the other lane at most")
        values = [a.value if isinstance(a, Phase) else a for a in args]
        value, queued = lane.queue(kind, fn, *values, after=events[0] if events else None, **span)
        return Phase(lane, value=value, queued=queued)

    def overlap(self, main: Work, beside: Work) -> tuple[Phase, Phase]:
        """Queue ``main``, then ``beside``: on two streams they run at the same time, the host waiting for neither."""
        return self.queue(main), self.queue(beside)

    def aside(self, w: Work) -> Phase:
        """Queue work the step can do without; the host reads it only if it needs it."""
        return self.queue(w)

    def queue(self, w: Work) -> Phase:
        return self.start(w.lane, w.kind, w.fn, *w.args, **w.span)

    def finish(self, *phases: Phase):
        """Wait for every phase, in order, and record its span."""
        for phase in phases:
            phase.result()


class Widening:
    """Called between the layers of one lane's work: once ``beside`` (the other lane's phase, started
    after it) is done, the lane takes the cores the lanes shared."""

    def __init__(self, lane):
        self.lane, self.beside = lane, None

    def __call__(self):
        if self.beside is not None:
            self.lane.widen_when_done(self.beside.future)


def executor_for(run, possible: bool = True) -> Threads | Streams:
    """``Streams`` where the pair queues its steps (``ModelPair.queue_steps``: "on"; "auto": where both
    lanes are CUDA devices), else ``Threads``; ``Threads`` wherever the method cannot queue its steps
    (``possible`` False)."""
    pair = run.pair
    cuda = pair.target_lane.device.type == "cuda" and pair.draft_lane.device.type == "cuda"
    return Streams() if possible and (pair.queue_steps == "on" or (pair.queue_steps == "auto" and cuda)) else Threads()
