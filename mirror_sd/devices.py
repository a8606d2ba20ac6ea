"""Device lanes: a torch device plus the worker thread that runs work on it.

Work submitted to two lanes runs at the same time: PyTorch releases the GIL inside its kernels, so
two CPU lanes use two cores, and two CUDA lanes (or two streams of one GPU) overlap on the device.

Every piece of work records a :class:`~mirror_sd.trace.Span` on one monotonic clock
(``time.perf_counter``), after synchronising the device, so spans are real measurements. On a CPU
lane the span runs from the host's reading before the work to its reading after. On a CUDA lane it
comes from CUDA events recorded around the work on the lane's stream (:class:`EventClock`): when
the GPU itself began and finished it, which with CUDA graphs is not when the host launched it, and
on two streams of one GPU the spans' overlap is the GPU's own. ``Lane.queue`` is the other way to
run work: on the calling thread, queued on the lane's stream without waiting (another lane's
stream may wait for it on a CUDA event), its span recorded once the caller has synchronised
(Mirror-SD's queued steps).

CPU lanes run on shared CPU workers, not on threads of their own. PyTorch's CPU kernels split work
over an OpenMP thread team, and each OS thread that ever ran a team keeps its own pool of team
threads. Once two threads hold pools of all the cores, the pools oversubscribe the cores and every
parallel kernel pays for it, small products most
(docs/experiments/devices.md#cpu-worker-threads-measured). So CPU lanes that work one after
another (every method but Mirror-SD) share one worker thread, and model loading
(:func:`on_cpu_worker`) runs there too. Lanes that work at the same time get one worker each and
split the cores (one thread each on 2 cores: no team at all); work that one of them runs while
the other waits (``submit(..., alone=True)``) may use every core on worker 0. The thread that
drives a decode loop (the caller's) does its own small torch work (allocating caches, say) on one
thread (:func:`single_threaded`), so it never starts a pool either. A caller thread that ran a
multi-threaded kernel before (a script's own torch work) already holds a pool: decoding then runs
slower, as above.

Default placement (:func:`default_devices`):
* no accelerator: both lanes on the CPU. Methods whose lanes run at the same time (Mirror-SD)
  split the cores between them; serial methods give every lane all cores when it works.
* one CUDA GPU: the target takes it; the draft runs on the same GPU on a second CUDA stream.
* two or more CUDA GPUs: target on cuda:0, draft on cuda:1.
* a target too big for one GPU: sharded over several (``cuda:0,cuda:1``; see models/sharding.py).

A lane works in a forked child too (Hugging Face ZeroGPU runs each GPU call in one): its worker
thread did not survive the fork, so the lane starts a new one there.

Int8 drafting is a per-thread switch (:func:`int8_products`) that a lane turns on around the
drafting work it runs (``Lane.int8_drafting``); the linear layers (models/linear.py) read it with
:func:`int8_products_on`. It lives here, with the lanes that set it, so that models depend on
devices and not the reverse.
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from .errors import MirrorSDError

ROLES = {"target": "GPU role", "draft": "NPU role"}


@dataclass(frozen=True)
class LaneLabel:
    """A lane as every trace, report and page names it: 'target, GPU role, cpu:0', or 'draft, NPU role,
    cuda:0, 2nd stream' (the draft's own stream on the target's GPU). ``Lane.label`` writes it, traces
    keep it, and the app, the bench and the what-if model read a label back here (:meth:`read`)."""

    name: str  # "target" or "draft"
    role: str  # the device it stands in for: "GPU role", "NPU role"
    display: str  # the real device and where on it: "cpu:1", "cuda:0, 2nd stream", "cuda:0+cuda:1" (sharded)

    def __str__(self) -> str:
        return f"{self.name}, {self.role}, {self.display}"

    @property
    def device(self) -> str:
        """The real device alone: "cpu:1", "cuda:0", "cuda:0+cuda:1"."""
        return self.display.split(", ")[0]

    @property
    def kind(self) -> str:
        """The device's type: "cpu", "cuda", "mps", "npu"."""
        return self.device.split(":")[0]

    @property
    def plays(self) -> str:
        """The role without its suffix: "GPU", "NPU"."""
        return self.role.removesuffix(" role")

    @classmethod
    def read(cls, label: str) -> "LaneLabel | None":
        """The label read back; None for a label of another form (a lane named by hand, say)."""
        parts = label.split(", ")
        return cls(parts[0], parts[1], ", ".join(parts[2:])) if len(parts) >= 3 else None


_cpu_workers: dict[int, ThreadPoolExecutor] = {}  # slot -> worker thread, shared by CPU lanes
_cpu_workers_lock = threading.Lock()
_cpu_workers_pid = os.getpid()


def cpu_worker(slot: int = 0) -> ThreadPoolExecutor:
    """The shared CPU worker thread number ``slot`` (module docstring); started on first use, and
    started afresh in a forked child, which has none of its parent's threads."""
    global _cpu_workers_pid
    with _cpu_workers_lock:
        if _cpu_workers_pid != os.getpid():
            _cpu_workers.clear()
            _cpu_workers_pid = os.getpid()
        if slot not in _cpu_workers:
            _cpu_workers[slot] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"cpu-worker-{slot}")
        return _cpu_workers[slot]


def on_cpu_worker(fn, *args, **kwargs):
    """fn(*args, **kwargs) on CPU worker 0, for heavy CPU work outside lanes (loading models), so
    that the caller's thread never starts an OpenMP pool of its own (module docstring)."""
    if threading.current_thread().name.startswith("cpu-worker-0_"):
        return fn(*args, **kwargs)
    return cpu_worker(0).submit(fn, *args, **kwargs).result()


@contextmanager
def single_threaded():
    """Torch work in this block runs on the calling thread alone, which then starts no OpenMP pool
    (module docstring); the thread's own setting comes back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def hardware_name(device: torch.device) -> str:
    """What a device is, for model cards: "NVIDIA H100 80GB HBM3", "2 CPU cores", ..."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_cores()} CPU cores" if device.type == "cpu" else str(device)


def to_device(data, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``data`` (numbers in nested lists, or a tensor) as a tensor on ``device``, without waiting for
    the GPU. ``torch.tensor(data, device=cuda)`` and ``cpu_tensor.to(cuda)`` copy blocking, which
    synchronises the stream: the host would wait for every forward queued on it before laying out
    the next, and the GPU would idle meanwhile. Here the numbers go through pinned memory in a
    non-blocking copy, queued behind that work (PyTorch keeps the pinned block until the copy is done)."""
    tensor = data if isinstance(data, torch.Tensor) else torch.tensor(data, dtype=dtype)
    tensor = tensor if dtype is None else tensor.to(dtype)
    if device.type != "cuda" or tensor.device.type != "cpu":  # no copy from the host to a GPU
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def resolve_device(name: str) -> torch.device:
    """A torch device for 'cpu', 'cuda', 'cuda:N', 'mps' or 'npu[:N]', or a clear error."""
    text = (name or "").strip().lower()
    try:
        device = torch.device(text)
    except RuntimeError:
        raise MirrorSDError(f"unknown device {name!r}: use cpu, cuda, cuda:N, mps or npu") from None
    kind = device.type
    if kind == "cpu":
        if device.index not in (None, 0):  # the lanes' core groups are the engine's to choose (cpu:0, cpu:1)
            raise MirrorSDError(f"device {name!r}: name the CPU as 'cpu'; mirror-sd splits its cores between the lanes")
        return torch.device("cpu")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = device.index or 0
        if index >= count:
            have = f"{count} CUDA GPU(s)" if count else "no CUDA GPU"
            raise MirrorSDError(f"device {name!r} is not available: this machine has {have}")
        return torch.device("cuda", index)
    if kind == "mps":
        if not (torch.backends.mps.is_available()):
            raise MirrorSDError(f"device {name!r} is not available: no Apple MPS backend here")
        return device
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401  (registers the npu device with torch)
        except ImportError:
            raise MirrorSDError(f"device {name!r} needs the torch_npu package, which is not installed") from None
        return device
    raise MirrorSDError(f"unsupported device {name!r}: use cpu, cuda, cuda:N, mps or npu")


def resolve_devices(names: str) -> list[torch.device]:
    """One device, or a comma-separated list of CUDA GPUs to shard a model over (models/sharding.py)."""
    devices = [resolve_device(name) for name in (names or "").split(",")]
    if len(devices) > 1 and (any(d.type != "cuda" for d in devices) or len(set(devices)) < len(devices)):
        raise MirrorSDError(f"device list {names!r}: a model is sharded over distinct CUDA GPUs only "
                            f"(e.g. cuda:0,cuda:1)")
    return devices


def default_devices() -> tuple[str, str]:
    """(target device, draft device) for this machine, as documented in the module docstring."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return ("cuda:0", "cuda:1") if count >= 2 else ("cuda:0", "cuda:0")
    return "cpu", "cpu"


_int8 = threading.local()  # _int8.on: this thread is inside int8_products()


@contextmanager
def int8_products(enabled: bool = True):
    """While inside (enabled), this thread's CPU inference products use int8 copies of their weights
    (models/linear.py, int8 drafting); the setting before comes back on leaving."""
    before = getattr(_int8, "on", False)
    _int8.on = enabled
    try:
        yield
    finally:
        _int8.on = before


def int8_products_on() -> bool:
    """Whether this thread is inside :func:`int8_products` (enabled)."""
    return getattr(_int8, "on", False)


# fp32 on GPUs and on CPUs without native bf16 (dtype="auto", models/auto_dtype.py, picks bf16 only
# on a CPU that computes it natively, after a check at load). On many CPUs bf16 matmuls are slow or
# crash. On a GPU, bf16 breaks the promise of temperature 0: its rounding depends on how many tokens
# one forward holds, so a window's verify and vanilla's one-token step can pick different argmaxes
# where two logits nearly tie (docs/experiments/devices.md#on-a-gpu-what-the-h100-session-found).
# Ask for bf16 or fp16 (``dtype=``, ``--dtype``) to halve a big model's memory.
DEFAULT_DTYPE = torch.float32


class LaneError(Exception):
    """Work on a lane raised: the lane's name ("target", "draft"), the step it was working on and the
    error itself (also the ``__cause__``). The engine tells the lanes apart by it: a failed draft lane
    ends the run in target-only decoding, a failed target lane ends it with the error."""

    def __init__(self, lane: str, step: int | None, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.lane, self.step, self.error = lane, step, error


class EventClock:
    """Spans of a CUDA lane from CUDA events, on the host's clock.

    An event records when the GPU reached it in its stream; ``elapsed_time`` between two events of
    one GPU is the GPU's own time. To put that on the trace's clock, the clock keeps an anchor: an
    event the GPU has passed (the host waited for it) and the host's reading just after. A span's
    ends are the anchor's host time plus the GPU time from the anchor to each event, kept within the
    host's readings around the work (the GPU cannot begin before the host submits, nor finish after
    the host has seen it finish). The anchor is set again for every trace, so the two clocks cannot
    drift apart over a long session.

    ``event``: the event type (``torch.cuda.Event``; the tests give a stand-in on the CPU)."""

    def __init__(self, device: torch.device, event=None):
        self.device = device
        self.event = event or (lambda: torch.cuda.Event(enable_timing=True))
        self.anchor, self.anchor_host, self.anchored_for = None, 0.0, None

    def begin(self, stream, trace_key) -> tuple:
        """Record the start event on ``stream`` (anchoring first, once per trace); returns (start, end)
        events, the end one still to record once the work is submitted."""
        if self.anchored_for != trace_key:
            self.anchor = self.event()
            self.anchor.record(stream)
            self.anchor.synchronize()
            self.anchor_host, self.anchored_for = time.perf_counter(), trace_key
        start, end = self.event(), self.event()
        start.record(stream)
        return start, end

    def span(self, events: tuple, host_start: float, host_end: float) -> tuple[float, float]:
        """(start, end) on the host's clock of work between two recorded events (``begin``), within
        the host's readings around it. Call after the device is synchronised."""
        start, end = (self.anchor_host + self.anchor.elapsed_time(e) / 1e3 for e in events)
        start = min(max(start, host_start), host_end)
        return start, min(max(end, start), host_end)


class Lane:
    """One device and its worker; ``submit`` runs work there and records a span in the trace."""

    def __init__(self, name: str, device: torch.device, display: str | None = None):
        self.name = name  # "target" or "draft"
        self.role = ROLES.get(name, name)
        self.device = device  # where inputs go; a sharded model's first device
        self.devices = [device]  # every device the lane's model runs on (several when sharded)
        self.display_device = display or str(device)
        self.threads: int | None = None  # CPU threads while working; set by allot_cpu_threads
        self.alone_threads: int | None = None  # CPU threads for work no other lane runs beside (``alone``)
        self.cpu_slot = 0  # which shared CPU worker runs a CPU lane's work; set by allot_cpu_threads
        # Drafting work here multiplies by int8 weight copies (models/linear.py, int8 drafting): all of
        # the draft lane's work, which only ever runs the draft model, and target-lane work submitted
        # with drafting=True (the EAGLE head, the speculative streams). Set by load_pair, CPU lanes only.
        self.int8_drafting = False
        self.stream = None
        self.clock = EventClock(device) if device.type == "cuda" else None  # None: spans from host readings
        self._worker: ThreadPoolExecutor | None = None  # a non-CPU lane's own thread, started on first use
        self._pid = os.getpid()

    @property
    def span_clock(self) -> str:
        """Where this lane's spans come from: "CUDA events" or "host" (trace.meta["span_clocks"])."""
        return "CUDA events" if self.clock is not None else "host"

    @property
    def label(self) -> str:
        """E.g. 'target, GPU role, cpu:0': role and real device, as the app shows lanes (:class:`LaneLabel`)."""
        return str(LaneLabel(self.name, self.role, self.display_device))

    def submit(self, kind: str, fn, *args, trace=None, label: str = "", step: int | None = None,
               tokens: int = 0, alone: bool = False, drafting: bool = False, **kwargs) -> Future:
        """Run fn(*args, **kwargs) on this lane; the future gives its result (or its error, as a
        :class:`LaneError`).

        trace: the Trace that records the work as a span (none if None).
        alone: the caller promises that no other lane works meanwhile, so a CPU lane may use the
        cores it otherwise shares (``alone_threads``).
        drafting: fn only proposes tokens (``int8_drafting``); the draft lane's work always does."""
        int8 = self.int8_drafting and (drafting or self.name == "draft")
        return self.worker.submit(self._run, trace, kind, label, step, tokens, alone, int8, fn, args, kwargs)

    def queue(self, kind: str, fn, *args, trace=None, label: str = "", step: int | None = None, tokens: int = 0,
              after: "torch.cuda.Event | None" = None, drafting: bool = False, **kwargs) -> tuple[object, "Queued"]:
        """Run fn(*args, **kwargs) on the calling thread with this lane's stream current, without waiting
        for the GPU: on a CUDA lane its kernels are queued and the call returns as soon as they are
        launched. ``after``: an event (``Queued.done`` of work on another lane) this lane's stream
        waits for before the work, on the GPU, so the host need not. Returns (fn's result, a
        :class:`Queued`); ``Queued.record()`` waits for the work and puts its span in ``trace``.
        On a CPU lane fn simply runs to its end, on the lane's worker (with its threads), and its span
        is the host's readings around it. ``drafting``: as for ``submit``."""
        if self.device.type == "cpu":
            start = time.perf_counter()
            result = self.submit(kind, fn, *args, label=label, step=step, tokens=tokens, drafting=drafting,
                                 **kwargs).result()
            return result, Queued(self, trace, kind, label, step, tokens, None, start, time.perf_counter(), None)
        int8 = self.int8_drafting and (drafting or self.name == "draft")
        start = time.perf_counter()
        result, events, done = self._launch(trace, step, int8, fn, args, kwargs, after=after, wait=False)
        return result, Queued(self, trace, kind, label, step, tokens, events, start, time.perf_counter(), done)

    def recording(self, trace) -> "Recording":
        """This lane, with every piece of work recorded in ``trace`` (one generation's)."""
        return Recording(self, trace)

    @property
    def worker(self) -> ThreadPoolExecutor:
        """The thread that runs this lane's work: a shared CPU worker for a CPU lane, else its own."""
        if self.device.type == "cpu":
            return cpu_worker(self.cpu_slot)
        if self._worker is None or os.getpid() != self._pid:  # a forked child (a ZeroGPU call, say)
            self._pid = os.getpid()                            # has none of the parent's threads
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lane-{self.name}")
        return self._worker

    def run(self, kind: str, fn, *args, **kwargs):
        """Submit and wait: for work that nothing else on the host can overlap with."""
        return self.submit(kind, fn, *args, **kwargs).result()

    def widen_when_done(self, beside: Future | None):
        """Called inside this lane's work: once ``beside`` (work on another lane of this CPU) is done,
        take every core this lane may use alone for the rest of the work, so that no core idles.

        Mirror-SD's target suffix calls it between layers: its rollouts usually end first, and the
        draft lane's core would idle for the rest of the suffix
        (docs/experiments/mirror.md#int8-rollouts-the-prefill-on-both-cores-and-variants-not-kept)."""
        if (beside is not None and beside.done() and self.device.type == "cpu" and self.alone_threads
                and torch.get_num_threads() < self.alone_threads):
            torch.set_num_threads(self.alone_threads)

    def _run(self, trace, kind, label, step, tokens, alone, int8, fn, args, kwargs):
        threads = self.alone_threads if alone else self.threads
        if self.device.type == "cpu" and threads:
            torch.set_num_threads(threads)  # per worker thread
        events = None
        start = time.perf_counter()
        try:
            result, events, _ = self._launch(trace, step, int8, fn, args, kwargs)
        finally:  # after an error, events is None: the span is the host's readings
            end = time.perf_counter()
            if trace is not None:
                start, end = self.clock.span(events, start, end) if events is not None else (start, end)
                trace.add_span(self, kind, label, start, end, step, tokens)
        return result

    def _launch(self, trace, step, int8, fn, args, kwargs, after=None, wait: bool = True):
        """fn(*args, **kwargs) as a lane runs work (``_run`` on its worker, ``queue`` on the caller's
        thread): in inference mode, with the lane's stream current and its int8 setting; on a CUDA
        lane after ``after`` (an event of another lane's work, waited for on the GPU) and between CUDA
        events where the lane times on the GPU. ``wait``: wait for the device before returning (a
        device error may surface only there); else the work may still be queued, and a CUDA lane
        records an end event for it. Returns (fn's result, (start, end) events or None, the end
        event or None); any error is raised as a :class:`LaneError`."""
        stream = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        events, done = None, None
        try:
            with torch.inference_mode(), stream, int8_products(int8):
                if after is not None and self.device.type == "cuda":
                    self.work_stream.wait_event(after)
                if self.clock is not None and trace is not None:
                    events = self.clock.begin(self.work_stream, trace.t0)
                result = fn(*args, **kwargs)
                if events is not None or (not wait and self.device.type == "cuda"):
                    done = events[1] if events is not None else torch.cuda.Event(enable_timing=False)
                    done.record(self.work_stream)
                if wait:
                    self.synchronize()
        except Exception as e:
            raise LaneError(self.name, step, e) from e
        return result, events, done

    @property
    def work_stream(self):
        """The CUDA stream this lane's work runs on (None off CUDA)."""
        if self.device.type != "cuda":
            return None
        return self.stream or torch.cuda.current_stream(self.device)

    def synchronize(self):
        if self.device.type == "cuda":
            self.work_stream.synchronize()
            for other in self.devices[1:]:  # the later shards of a sharded model
                torch.cuda.current_stream(other).synchronize()
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def close(self):
        if self._worker is not None:
            self._worker.shutdown(wait=False)


class Queued:
    """Work a lane queued (``Lane.queue``): ``done`` is a CUDA event recorded after it on the lane's
    stream (None off CUDA), for another lane's stream to wait on; ``record()`` waits for it (at
    once, if the host has read what the work made since) and adds its span to the trace, once."""

    def __init__(self, lane, trace, kind, label, step, tokens, events, start, launched, done):
        self.lane, self.trace, self.kind, self.label, self.step, self.tokens = lane, trace, kind, label, step, tokens
        self.events, self.start, self.launched, self.done = events, start, launched, done
        self.recorded = False

    def record(self):
        if self.recorded:
            return
        self.recorded = True
        if self.done is not None:
            self.done.synchronize()  # the work, and its end event, done on the GPU
        if self.trace is None:
            return
        if self.events is None:  # the host's readings around the work (it ran to its end)
            start, end = self.start, self.launched
        else:  # the GPU's own times, within the host's readings: from the launch to now, after the sync
            start, end = self.lane.clock.span(self.events, self.start, time.perf_counter())
        self.trace.add_span(self.lane, self.kind, self.label, start, end, self.step, self.tokens)


class Recording:
    """A lane bound to the trace of one generation: what a decode loop submits through it is
    recorded there (``Decoding.target_lane`` and ``draft_lane``)."""

    def __init__(self, lane: Lane, trace):
        self.lane, self.trace = lane, trace

    def submit(self, kind: str, fn, *args, **kwargs) -> Future:
        return self.lane.submit(kind, fn, *args, trace=self.trace, **kwargs)

    def run(self, kind: str, fn, *args, **kwargs):
        return self.submit(kind, fn, *args, **kwargs).result()

    def queue(self, kind: str, fn, *args, **kwargs) -> tuple[object, Queued]:
        return self.lane.queue(kind, fn, *args, trace=self.trace, **kwargs)

    def widen_when_done(self, beside: Future | None):
        self.lane.widen_when_done(beside)

def avoid_cudnn_attention():
    """Turn off PyTorch's cuDNN backend for scaled_dot_product_attention, in this whole process.

    cuDNN builds an execution plan for each new sequence length, and decoding meets a new one at
    every step, so with cuDNN (which PyTorch picks in bf16, not in fp32) a new prompt decodes at a
    fraction of the speed of one decoded before
    (docs/experiments/devices.md#on-a-gpu-what-the-h100-session-found). The flash, memory-efficient
    and math kernels need no such plans."""
    torch.backends.cuda.enable_cudnn_sdp(False)


def make_lanes(target_device: str | None, draft_device: str | None) -> tuple[Lane, Lane]:
    """The target and draft lanes, on the given devices or this machine's defaults."""
    default_target, default_draft = default_devices()
    targets = resolve_devices(target_device or default_target)
    target, draft = targets[0], resolve_device(draft_device or default_draft)
    if "cuda" in (target.type, draft.type):
        avoid_cudnn_attention()
    if target.type == draft.type == "cpu":  # two core groups of one CPU
        target_lane, draft_lane = Lane("target", target, "cpu:0"), Lane("draft", draft, "cpu:1")
    else:
        target_lane, draft_lane = Lane("target", target), Lane("draft", draft)
    if draft.type == "cuda" and draft == target:  # one GPU: the draft gets its own stream
        draft_lane.stream = torch.cuda.Stream(draft)
        draft_lane.display_device = f"{draft}, 2nd stream"
    if len(targets) > 1:
        shard_lane(target_lane, targets)
    return target_lane, draft_lane


def shard_lane(lane: Lane, devices: list[torch.device]):
    """The lane's model is sharded over ``devices``: the lane waits for all of them."""
    lane.device, lane.devices = devices[0], list(devices)
    lane.clock = None  # events of one GPU cannot time work on several: the host's readings
    lane.display_device = "+".join(str(d) for d in devices)


def allot_cpu_threads(lanes: list[Lane], parallel: bool):
    """Share the CPU cores: split between CPU lanes that work at the same time, each on a worker of
    its own; else all cores to each, and one shared worker for all (module docstring)."""
    cpu_lanes = [lane for lane in lanes if lane.device.type == "cpu"]
    cores = cpu_cores()
    share = max(1, cores // len(cpu_lanes)) if parallel and cpu_lanes else cores
    for slot, lane in enumerate(cpu_lanes):
        lane.threads = share
        lane.cpu_slot = slot if parallel else 0
        # Work a lane runs alone may take every core, but only on worker 0, whose pool is already
        # that size: a second worker with such a pool would slow both (module docstring).
        lane.alone_threads = cores if lane.cpu_slot == 0 else share
