"""Fixed-shape stages: forwards whose shapes never depend on the position, so CUDA can replay them.

A CUDA graph replays recorded kernels on the same addresses and shapes, so a forward can be
captured only if nothing about it changes from one step to the next but the numbers in its input
buffers. The plain forward (``Transformer.forward``) is not like that: its window is as wide as the
tokens it holds and its attention reads the cache up to the current length. A :class:`Stage` is the
same forward made fixed-shape:

* its width W is a bucket (1, 2, 4, ..., 64); a window of T <= W tokens is padded to W rows (the
  smallest bucket that holds T, or a wider one measured to cost less: below);
* attention reads every slot of a :class:`StageCache` under a mask [B, 1, W, S] (S: all slots), so
  its shape is the cache's, not the length so far;
* ids (or hidden states), positions, the mask and the cache slots each row writes live in static
  buffers. :meth:`Stage.load` copies in only what the caller gives (the rows; positions or a mask,
  if any) and one number that says how to lay the rest out (a :class:`Layout`: first slot, rows,
  kind of mask); the body turns them into slots, positions and the mask (:meth:`Stage.settle`, so inside
  the graph). Loading a causal window costs the host three operations (a view, a copy, a fill), a
  tree about seven, and never a wait for the GPU.

Padding rows never touch a real row: the cache keeps MAX_WIDTH scratch slots after its usable ones
and padding row i writes its keys and values to scratch slot i, which no real row's mask admits;
each padding row attends to its own scratch slot only (a row that attends to nothing gives NaN,
and NaN times a masked-out zero weight is still NaN). Real rows' logits are the plain forward's,
up to the order of floating-point sums.

On a CUDA lane each stage is captured once as a ``torch.cuda.CUDAGraph`` (PyTorch's documented
pattern: warm up on a side stream, capture, then replay), on the lane's stream and in one memory
pool per :class:`Stages` (one per model, so one per lane). Elsewhere a stage runs eagerly through
the same buffers (how the CPU tests this path). The graphs hold the addresses of the cache and of
the buffers, so a :class:`Stages` owns its cache: every generation reuses it (``cache.rollback(0)``).

The methods run on stages with ``load_pair(graphs="on")`` (or "auto" on a CUDA lane), through
models/forwards.py: a method names the layer ranges and one-stage phases it runs when it makes its
cache, and they are made (captured) then, before the first step; a prefill runs as 64-row chunks.
Stream rows (a ``streams`` stage) keep their keys and values in scratch slots, which is how a stage
stores nothing for them.

The cheapest bucket. A GPU's time for a forward need not grow with its width: matrix products of
2 to 16 rows can pick slower kernels than those of 1 or 32, so a wider bucket can cost less
(docs/devices.md). So each captured stage
is timed at capture (a few replays, CUDA events), and a window runs at the cheapest captured bucket
that holds it: :func:`cheapest_bucket`, where a wider bucket must save more than ROUTE_MARGIN to be
taken. Padding rows never change a real row, so only the time moves. Eager stages (the CPU) are
not timed and keep the smallest bucket.

Tuned kernels. For the same reason, each operation a captured stage records runs the formulation
measured fastest on the device for its shape and row count (models/tuning.py), tuned in the
stage's warm-up (``Stages.tuned_kernels``; off: PyTorch's default calls); its body runs the layers
of models/tuned.py, which join operations that such a formulation may fuse.

Not here (these run the plain forward, on the same cache, with graphs on): the LM head over
EAGLE's features and its head's logits (one product each: one launch, nothing for a graph to
save), tree windows of more than 64 rows, and any sharded model. How the lanes queue and time
stages: devices.py and executors.py.
"""
from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from dataclasses import dataclass, replace
from enum import IntEnum

import torch
from torch import nn

from ..devices import to_device
from ..errors import MirrorSDError
from . import tuning
from .capture_check import CaptureCheck
from .llama import KVCache, Transformer
from .tuned import run_layers

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_WIDTH = BUCKETS[-1]
TIMED_REPLAYS = 3  # replays timed at capture, to route a window to its cheapest bucket (the median)
ROUTE_MARGIN = 0.05  # a wider bucket is taken only if it saves more than this fraction of the time
WARMUP_RUNS = 3  # before a capture, as in PyTorch's CUDA-graph examples


class MaskKind(IntEnum):
    """What a window's mask covers: none given (causal); every slot so far ([.., T, start + T], as
    ``Transformer.window`` takes it); the window's own rows ([.., T, T]), the slots before it all visible."""
    CAUSAL = 0
    SLOTS = 1
    WINDOW = 2


@dataclass(frozen=True)
class Layout:
    """How a stage lays its window out: T ``rows`` written from slot ``start``, the mask's kind, and
    whether positions were given (else start, start + 1, ...). The host packs it into one number
    (``code``) in the stage's ``window`` buffer, so loading a window costs it one fill, a kernel
    launch with the number as its argument (no copy, no wait for the device); the body unpacks it
    (``of``) into a Layout of tensors [1] on the device."""

    start: int
    rows: int
    kind: MaskKind = MaskKind.CAUSAL
    given_positions: bool = False

    @property
    def code(self) -> int:
        return ((self.start * (MAX_WIDTH + 1) + self.rows) * len(MaskKind) + self.kind) * 2 + int(self.given_positions)

    @classmethod
    def of(cls, code: torch.Tensor) -> "Layout":
        given_positions, code = code % 2 == 1, code // 2
        kind, code = code % len(MaskKind), code // len(MaskKind)
        return cls(code // (MAX_WIDTH + 1), code % (MAX_WIDTH + 1), kind, given_positions)


@dataclass(frozen=True)
class LayerRange:
    """What one forward of a model runs: layers [start, end) (end None: to the last), then what reads
    their hidden states. ``lm_head``: the final norm and the LM head (logits come out); ``reader``: a
    module in the LM head's place (Mirror-SD's EarlyExit, EAGLE's FinalNorm; it names its stages:
    ``stage_name``); neither: the hidden states come out. ``streams``: the rows are speculative stream
    rows of this Streams object, which run its copies of the layers and its own head
    (models/streams.py). A stage set names its forwards by them (models/forwards.py)."""

    start: int = 0
    end: int | None = None
    lm_head: bool = False
    reader: nn.Module | None = None
    streams: nn.Module | None = None

    def __post_init__(self):
        if self.lm_head + (self.reader is not None) + (self.streams is not None) > 1:
            raise MirrorSDError("a layer range ends in one head: the LM head, a reader or its streams' own")

    @classmethod
    def read_at(cls, layer: int, reader: nn.Module) -> "LayerRange":
        """No layers: ``reader`` over the hidden states after ``layer`` (Mirror-SD's early exit)."""
        return cls(layer, layer, reader=reader)

    def of(self, model: Transformer) -> "LayerRange":
        """This range with its end resolved for ``model`` (None: its last layer)."""
        return self if self.end is not None else replace(self, end=model.num_layers)

    @property
    def head(self):
        """What :class:`Stage` takes for the head: True (the LM head), the reader, or False (none)."""
        return True if self.lm_head else self.reader if self.reader is not None else False

    @property
    def runs_nothing(self) -> bool:
        """No layers and no head: the embeddings of ids, or the hidden states as they are."""
        return self.start == self.end and self.head is False and self.streams is None


def copy_into(buffer: torch.Tensor, data):
    """Copy ``data`` (a tensor, or numbers in nested lists) into a stage's buffer (broadcast): one
    copy from the buffer's device, else through ``to_device`` (a GPU never waits for the host)."""
    if not isinstance(data, torch.Tensor) or data.device != buffer.device:
        data = to_device(data, buffer.device)
    buffer.copy_(data)


class StageRefused(MirrorSDError):
    """A one-stage forward failed to capture and was refused (``Stages.capture``)."""


def bucket(width: int) -> int:
    """The smallest bucket that holds ``width`` tokens."""
    for b in BUCKETS:
        if 1 <= width <= b:
            return b
    raise MirrorSDError(f"a stage holds 1 to {MAX_WIDTH} tokens, got {width}")


def cheapest_bucket(width: int, replay_ms: dict[int, float]) -> int:
    """The bucket to run a window of ``width`` rows at: the smallest that holds it, unless a wider
    one measured in ``replay_ms`` (bucket -> GPU ms of one replay) costs less by more than
    ROUTE_MARGIN than the best so far."""
    best = bucket(width)
    for wider in BUCKETS:
        if wider > best and wider in replay_ms and best in replay_ms \
                and replay_ms[wider] < replay_ms[best] * (1 - ROUTE_MARGIN):
            best = wider
    return best


def routed_widths(replay_ms: dict[int, float]) -> dict[int, int]:
    """{width: bucket} for the widths that :func:`cheapest_bucket` sends past their smallest bucket."""
    routes = {w: cheapest_bucket(w, replay_ms) for w in range(1, MAX_WIDTH + 1)}
    return {w: to for w, to in routes.items() if to != bucket(w)}


class StageCache(KVCache):
    """A KV cache with MAX_WIDTH scratch slots after its ``max_slots`` usable ones: padding rows write
    there, and no real row reads them."""

    def __init__(self, model: Transformer, max_slots: int, batch: int = 1):
        super().__init__(model.args, max_slots + MAX_WIDTH, batch, model.dtype, model.device)
        self.usable = max_slots

    @property
    def max_slots(self) -> int:
        return self.usable

    @property
    def all_slots(self) -> int:
        """Every slot, scratch included: the width of a stage's attention."""
        return self.k.shape[3]


class SlotWriter:
    """Where a stage's body writes keys and values (models/tuned.py): each row at its slot of the
    stage's buffer (real rows: their own; padding and stream rows: scratch)."""

    def __init__(self, cache: StageCache, slots: torch.Tensor):
        self.cache, self.slots = cache, slots  # slots [W]

    def store(self, layer: int, q, k, v, cos, sin, plan: tuning.Plan | None = None):
        """q and k [B, heads, W, D] turned by the rotary embedding, k and v stored at the rows' slots:
        (q turned, every slot's k, v [B, K, S, D]), as one operation in the formulation ``plan``
        holds for it (models/tuning.py; the layer's attention's plan)."""
        return tuning.rotary_store(q, k, v, cos, sin, self.cache.k[layer], self.cache.v[layer], self.slots, plan)


class Stage:
    """One fixed-shape forward of ``model``: layers [a, b) at ``width`` rows, from token ids (a == 0,
    with the embedding) or hidden states, to logits (head=True: final norm and LM head) or hidden
    states. ``layers=(N, N), head=True`` is the LM head alone. ``head`` may also be a module that
    reads the hidden states instead (Mirror-SD's early exit).

    With ``streams`` (models/streams.py) the rows are speculative stream rows entering layer a: their
    keys and values go to scratch slots (stored nowhere a real row reads), they run the streams' merged
    copies of the layers (the adapters inside), and the streams' own head reads them (logits over its rows)."""

    def __init__(self, model: Transformer, width: int, cache: StageCache | None, layers=(0, None),
                 head: bool = True, streams=None):
        if model.layer_devices:
            raise MirrorSDError("a sharded model has no fixed-shape stages")
        a, b = layers[0], model.num_layers if layers[1] is None else layers[1]
        if not 0 <= a <= b <= model.num_layers:
            raise MirrorSDError(f"layers [{a}, {b}) are not layers of a {model.num_layers}-layer model")
        if a < b and cache is None:
            raise MirrorSDError("a stage that runs layers needs a StageCache")
        if streams is not None and not 0 < a < b:
            raise MirrorSDError("stream rows enter a layer above the first and run at least one")
        self.model, self.width, self.cache, self.layers, self.head = model, width, cache, (a, b), head
        self.streams = streams
        self.tuned_kernels = True  # capture in the tuned formulations (``planned``; Stages sets it)
        self.embed = a == 0 and b > 0
        B, W, device = cache.k.shape[1] if cache is not None else 1, width, model.device
        # Static buffers: run() copies into them, the body (and a captured graph) reads them.
        self.x = (torch.zeros(B, W, dtype=torch.long, device=device) if self.embed
                  else torch.zeros(B, W, model.args.hidden_size, dtype=model.dtype, device=device))
        self.positions = torch.zeros(B, W, dtype=torch.long, device=device)
        if a < b:
            S = cache.all_slots
            # row i of the window is i; slot j of the cache (scratch ones included) is j
            self.rows, self.slot_ids = torch.arange(W, device=device), torch.arange(S, device=device)
            self.slots = self.scratch(self.rows)  # [W] cache slot each row writes (``settle`` sets the real ones)
            self.mask = torch.zeros(B, 1, W, S, dtype=torch.bool, device=device)  # True: may attend
            self.padding = self.sees_own_scratch(self.rows)  # [W, S]: padding row i sees scratch slot i only
            self.mask[:, 0] = self.padding
            self.writer = SlotWriter(cache, self.slots)
            # What the caller's mask says, written as it comes ([B, T, start + T] over the slots, or
            # [B, T, T] over the window): the body turns it into ``mask`` (``settle``).
            self.given = torch.zeros(B, W, S, dtype=torch.bool, device=device)
            # One number says how to lay the window out (a ``Layout``): the body decodes it, so
            # loading a window costs the host one fill for it, whatever its kind.
            self.window = torch.zeros(1, dtype=torch.long, device=device)
        self.out: torch.Tensor | None = None  # the last output [B, W, vocab or hidden]
        self.graph = None  # a torch.cuda.CUDAGraph once captured
        self.launch_ms: float | None = None  # once captured: the host's ms to launch a replay (``time_launch``)
        self.from_idle_ms: float | None = None  # and the GPU's ms from an idle stream to that replay's end

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    def scratch(self, rows: torch.Tensor) -> torch.Tensor:
        """The scratch slot of each row index in ``rows`` (< MAX_WIDTH; any shape, same shape out):
        after the cache's usable slots, where a padding row (or a stream row) writes and no real row
        looks."""
        return self.cache.max_slots + rows

    def sees_own_scratch(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, S]: each of ``rows`` [R] sees its own scratch slot only (what a padding row attends to:
        one slot, so that its softmax is never over nothing)."""
        return torch.arange(self.cache.all_slots, device=rows.device) == self.scratch(rows)[:, None]

    def run(self, x: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """Output for x's rows: x [B, T] ids (or [B, T, hidden]) -> [B, T, vocab] logits (or hidden).

        Like the plain forward, the window writes its keys and values at slots [start, start + T),
        start = cache.length, and attends to what ``mask`` admits (``Transformer.window``'s tree_mask;
        None: causal, the prefix visible); positions default to start, start + 1, ... The cache's
        length does not move: the caller commits or rolls back, as after ``forward(commit=False)``.
        """
        with torch.inference_mode():  # buffers made in inference mode may only change there
            T = self.load(x, positions, mask)
            self.replay()
        # A copy: the next run overwrites the buffer, and so may another stage of the same memory pool
        # (its graph may reuse this one's memory for its own work; the pool is safe for one stage at a time)
        return self.out[:, :T].clone()

    def load(self, x, positions=None, mask=None) -> int:
        """Copy a window of T <= width rows (x [B, T] ids, as a tensor or lists, or [B, T, d] hidden
        states) into the static buffers; return T.

        The host writes only what it was given (the rows, and positions or a mask if any) and one
        number for the rest (a :class:`Layout`); the body lays out slots, positions and the mask from
        them (``settle``). Padding rows keep whatever an earlier window left in x: they write
        scratch slots only and their outputs are never read, so the host need not clear them."""
        B, T = (len(x), len(x[0])) if isinstance(x, list) else x.shape[:2]  # ids as lists: copied in one go
        if B != self.batch or not 1 <= T <= self.width:
            raise MirrorSDError(f"stage of batch {self.batch} and width {self.width} got input of {B} x {T} rows")
        copy_into(self.x[:, :T], x)
        if self.layers[0] == self.layers[1]:  # the LM head alone: no cache, no window
            return T
        start = self.cache.length
        if self.streams is None and start + T > self.cache.max_slots:
            raise MirrorSDError(f"KV cache full: {start} + {T} tokens > {self.cache.max_slots} slots")
        if positions is not None:
            copy_into(self.positions[:, :T], positions)
        if self.streams is not None and (mask is None or mask.shape[-1] != start + T):
            raise MirrorSDError(f"stream rows need a mask over the cache's {start} slots and their {T} rows")
        if mask is not None and mask.shape[-1] not in (T, start + T):
            raise MirrorSDError(f"a mask over {T} rows after {start} slots is [.., {T}, {T}] or "
                                f"[.., {T}, {start + T}], got {tuple(mask.shape)}")
        kind = MaskKind.CAUSAL if mask is None else MaskKind.SLOTS if mask.shape[-1] == start + T else MaskKind.WINDOW
        if mask is not None:
            copy_into(self.given[:, :T, :mask.shape[-1]], mask)
        self.window.fill_(Layout(start, T, kind, positions is not None).code)  # one launch, no copy, no wait
        return T

    def settle(self):
        """In the body (so in its graph): lay out the slots, positions and mask of the window that
        ``window`` describes (a :class:`Layout`) from what ``load`` wrote.

        Real row r writes slot start + r (stream rows: scratch slot r, like padding rows) at
        position start + r unless positions were given. It sees, by the window's kind: slots
        [0, start + r] (causal); what ``given`` says of slots [0, start + T) (SLOTS); the slots
        before start and what ``given`` says of the window (WINDOW); stream rows: what ``given``
        says of slots [0, start), and of the window's rows in scratch slots [usable, usable + T).
        Padding row i writes scratch slot i and sees only it."""
        if self.layers[0] == self.layers[1]:
            return
        layout = self.layout()  # [1] each
        given_positions, kind, T, start = layout.given_positions, layout.kind, layout.rows, layout.start
        usable, W, s, r = self.cache.max_slots, self.width, self.slot_ids, self.rows  # s [S] slot ids, r [W] row ids
        real = r < T  # [W]: the window's rows; the rest are padding
        own_slot = start + r  # [W]: where real row r writes (and its position, unless given)
        if self.streams is None:
            self.slots.copy_(torch.where(real, own_slot, self.scratch(r)))
            in_window = (s >= start) & (s < start + T)  # [S]: the window's own slots
            # given[.., s - start]: what a [.., T, T] mask (WINDOW) says of slot s, for s in the window
            over_window = self.given.gather(-1, (s - start).clamp(0, W - 1).expand_as(self.given))  # [B, W, S]
            sees = torch.where(kind == MaskKind.CAUSAL, s <= own_slot[:, None],  # [B, W, S]
                               torch.where(kind == MaskKind.SLOTS, self.given & (s < start + T),
                                           (s < start) | (in_window & over_window)))
        else:  # stream rows: the window's own columns sit in scratch slots [usable, usable + T)
            in_scratch = s >= usable  # [S]
            # the column of ``given`` (a [.., T, start + T] mask) that speaks of slot s
            column = torch.where(in_scratch, start + s - usable, s).clamp(0, s.numel() - 1)  # [S]
            seen = self.given.gather(-1, column.expand_as(self.given))  # [B, W, S]
            sees = seen & torch.where(in_scratch, s - usable < T, s < start)
        self.mask.copy_(torch.where(real[:, None], sees, self.padding)[:, None])  # [B, 1, W, S]
        self.positions.copy_(torch.where(given_positions, self.positions, torch.where(real, own_slot, 0)))

    def rows_window(self, positions: torch.Tensor, sees: torch.Tensor):
        """The window of R rows a body lays out itself (beside its buffers', or in place of them): at
        ``positions`` [R] (or [1, R]), attending to the cache's slots that ``sees`` [R, S] admits."""
        R = positions.shape[-1]
        window = self.model.window(None, R, positions=positions.view(1, R))
        return replace(window, mask=sees.view(1, 1, R, -1), causal=False)

    def layout(self) -> Layout:
        """The window's :class:`Layout`, as the body reads it: tensors [1] on the device."""
        return Layout.of(self.window)

    def replay(self):
        """Run the stage on what its buffers hold: the captured graph, or the body eagerly."""
        if self.graph is not None:
            with torch.cuda.device(self.x.device):  # the current stream of the graph's own GPU
                self.graph.replay()
        else:
            self.out = self.body()

    def body(self) -> torch.Tensor:
        """The forward itself, on the static buffers only: what a CUDA graph records."""
        model, (a, b) = self.model, self.layers
        self.settle()
        h = model.embed(self.x) if self.embed else self.x  # [B, W, hidden]
        if a < b:
            win = model.window(None, self.width, positions=self.positions, batch=self.batch)  # rotary cos, sin
            win = replace(win, mask=self.mask, causal=False)  # [B, 1, W, S]: every slot, under the mask
            # stream rows: the streams' merged layers, their keys and values in scratch slots
            stack = model.model.layers[a:b] if self.streams is None else self.streams.layers_for(model, a, b)
            h = run_layers(stack, h, self.writer, win, a)
        if self.streams is not None:
            return self.streams.logits(model, h)  # [B, W, head rows]
        if self.head is True:
            return model.head(h)
        return self.head(h) if self.head else h  # a module in place of the LM head, or none

    def load_padding(self):
        """Buffers as for a window of padding rows only: running them writes scratch slots only.
        Hidden states get seeded random numbers, not zeros, so that a warm-up's tuning checks its
        kernels' results on numbers that tell them apart (models/tuning.py)."""
        if self.embed:  # token ids
            self.x.zero_()
        else:
            self.x.normal_(generator=torch.Generator(self.x.device).manual_seed(0))
        self.positions.zero_()
        if self.layers[0] < self.layers[1]:
            self.window.fill_(Layout(0, 0).code)  # no real row: every row is padding

    def capture(self, pool=None, stream: torch.cuda.Stream | None = None, check: bool = False):
        """Capture the stage as a CUDA graph on ``stream`` (None: a side stream of PyTorch's) in memory
        pool ``pool``: warm up on a side stream, then capture, as PyTorch documents. The buffers hold
        padding only meanwhile, so the warm-up writes scratch slots only.

        The capture is "relaxed": CUDA then lets other work go on while it records. By default
        ("global") any event query or allocation in the process invalidates it, and both happen
        here: the other lane's thread works meanwhile, and PyTorch's pinned-memory allocator queries
        the events of the non-blocking copies ``to_device`` made before. The body itself only
        launches kernels on the stage's buffers, so nothing it records depends on that other work.

        Its operations are recorded in the formulation measured fastest for their shapes
        (``tuned_kernels``; models/tuning.py), tuned during the warm-up. With ``check`` the last
        warm-up run is checked for operations a capture cannot record (models/capture_check.py;
        raises ``CaptureUnsafe``): a failed capture can leave PyTorch's memory pool and random-number
        state unusable for the rest of the process, a refused warm-up cannot."""
        device = self.x.device
        with torch.inference_mode(), torch.cuda.device(device), self.planned():
            self.load_padding()
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for run in range(WARMUP_RUNS):  # the first tunes kernels; a check may watch the last
                    with CaptureCheck() if check and run == WARMUP_RUNS - 1 else contextlib.nullcontext():
                        self.body()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="relaxed"):
                self.out = self.body()
        self.graph = graph

    def planned(self, timer=None):
        """While inside, the modules the body runs take the formulations measured fastest on this
        device (a ``tuning.Plan`` with ``timer``; models/tuning.py), or PyTorch's default calls
        without ``tuned_kernels``: how a capture chooses its kernels, then leaves the modules as
        they were for the plain forwards."""
        plan = tuning.Plan(timer) if self.tuned_kernels else None
        return tuning.converted(self.modules_run(), plan)

    def modules_run(self) -> list[nn.Module]:
        """The modules the body runs: the model, a module read in place of its head, the modules a
        one-stage forward's settings name (an exit reader, streams) and the layers stream rows run."""
        spec = getattr(self, "spec", None)
        named = [self.head, self.streams, *(vars(spec).values() if spec is not None else ())]
        modules = [self.model, *(m for m in named if isinstance(m, nn.Module))]
        for streams in {id(m): m for m in named if hasattr(m, "layers_for")}.values():
            modules.extend(streams.layers_for(self.model, *self.layers))  # stream rows: the streams' copies
        return modules

    def time_replays(self, repeats: int = TIMED_REPLAYS) -> float:
        """Median GPU milliseconds of one replay of the captured stage, on the current stream (CUDA
        events), run on what the buffers hold (after capture: padding, which writes scratch slots only)."""
        device = self.x.device
        with torch.inference_mode(), torch.cuda.device(device):
            self.replay()  # the first replay uploads the graph
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(repeats)]
            for begin, end in events:
                begin.record()
                self.replay()
                end.record()
            events[-1][1].synchronize()
        return statistics.median(begin.elapsed_time(end) for begin, end in events)

    def time_launch(self, repeats: int = TIMED_REPLAYS) -> tuple[float, float]:
        """Median (host ms to launch one replay, GPU ms from an idle stream to that replay's end).

        Each time the stream is idle first; an event is recorded on it, the host launches the replay
        (timed by the host's clock), and a second event follows it. The second figure less
        ``time_replays``' is the time the GPU waited for the launch to reach it: what a step's span,
        whose start event fires on an idle GPU, carries beyond its stages' replays."""
        device = self.x.device
        launches, from_idle = [], []
        with torch.inference_mode(), torch.cuda.device(device):
            stream = torch.cuda.current_stream(device)
            for _ in range(repeats):
                stream.synchronize()
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                start = time.perf_counter()
                self.replay()
                launches.append(1000 * (time.perf_counter() - start))
                end.record()
                end.synchronize()
                from_idle.append(begin.elapsed_time(end))
        return statistics.median(launches), statistics.median(from_idle)


class OwnStage:
    """A forward with a kind of stage of its own: a step's drafting or verifying as one body
    (models/chain_draft.py, eagle_tree.py, eagle_verify.py, stream_draft.py, channel.py,
    rollout.py). Named among a model's ranges (``ModelPair.new_cache``), its stages are made
    (on CUDA: captured) at warm-up. Subclasses are frozen dataclasses of their settings, with a
    ``name`` and their ``stage`` class."""

    stage: type  # the Stage subclass, made as stage(model, width, cache, self)

    def stage_name_in(self, stages: "Stages") -> str:
        return stages.name_kind(self.name, self)

    def make_stage(self, model: Transformer, width: int, cache: StageCache) -> Stage:
        return self.stage(model, width, cache, self)


class Stages:
    """Every stage of one model on one lane, over one :class:`StageCache` they share.

    Named forwards ("full": every layer and the head; "head": the LM head alone; more with
    :meth:`add`, such as Mirror-SD's prefix and suffix) at each bucketed width, made on first use;
    with graphs on (the default on CUDA) each (name, width) is captured then, in this set's memory
    pool, on ``stream`` (the lane's; None: the current stream replays and a side stream captures).
    Capture everything at warm-up (:meth:`capture_all`), while no other thread works on the GPU: a
    capture fails if another thread allocates meanwhile (CUDA's global capture mode). The cache
    knows its set (``cache.stages``): that is how models/forwards.py routes a forward here.
    """

    def __init__(self, model: Transformer, max_slots: int, batch: int = 1, graphs: bool | None = None,
                 stream=None):
        on_cuda = model.device.type == "cuda"
        self.graphs = on_cuda if graphs is None else bool(graphs)
        if self.graphs and not on_cuda:
            raise MirrorSDError(f"CUDA graphs need a CUDA device; this model is on {model.device}")
        self.model, self.stream = model, stream
        self.cache = StageCache(model, max_slots, batch)
        self.cache.stages = self  # how models/forwards.py knows a cache's forwards run here
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        N = model.num_layers
        # name -> the forward it names: a LayerRange, or a one-stage forward (``OwnStage``)
        self.kinds = {"full": LayerRange(0, N, lm_head=True), "head": LayerRange(N, N, lm_head=True)}
        self._stages: dict[tuple[str, int], Stage] = {}  # (name, bucket) -> its stage, once made
        # (name, forward) -> the stages made for it and their timings, while the name names another
        # forward (``add``): (its _stages entries, its replay_ms entry or None)
        self._shelf: dict[tuple[str, object], tuple[dict, dict | None]] = {}
        self.replay_ms: dict[str, dict[int, float]] = {}  # name -> bucket -> GPU ms (captured stages)
        self.refused: dict[str, str] = {}  # one-stage forwards whose capture failed -> why (``capture``)
        self.cheapest = True  # route windows by replay_ms (False: always the smallest bucket)
        self.tuned_kernels = True  # capture each operation in its fastest formulation (models/tuning.py)

    def add(self, name: str, part: LayerRange):
        """Name the forward ``part`` runs (its end resolved; see :class:`Stage`). A name given again for
        another forward (other streams attached, say: ss's two kinds of streams are both "streams
        a-b") shelves the stages made for the old one and takes back those made before for the new
        one, if any. So a pair that alternates them (a sweep over ss's one_forward) makes each
        forward's stages once, and a timed run never pays for a capture made only because another
        setting ran in between."""
        forward = part.of(self.model)
        if self.kinds.get(name, forward) != forward:
            self._shelf[(name, self.kinds[name])] = self._take(name)  # the old forward's, put aside
            self._put_back(name, forward)  # the new one's, if it had any
        self.kinds[name] = forward

    def _put_back(self, name: str, forward):
        """Take the stages and timings made for ``forward`` under ``name`` off the shelf, if any."""
        stages, replay_ms = self._shelf.pop((name, forward), ({}, None))
        self._stages.update(stages)
        if replay_ms is not None:
            self.replay_ms[name] = replay_ms

    def name_kind(self, name: str, kind) -> str:
        """Name a forward that makes its own stages (``OwnStage``) and return the name; stages made
        for another forward of that name (other streams, say) are dropped. One whose capture failed
        (``refused``) is not named again: its method runs it an operation at a time."""
        if name in self.refused:
            return name
        if self.kinds.get(name, kind) != kind:
            self._take(name)
        self.kinds[name] = kind
        return name

    def _take(self, name: str) -> tuple[dict, dict | None]:
        """Remove the stages made for ``name`` and their timings, and return them (for the shelf)."""
        stages = {key: stage for key, stage in self._stages.items() if key[0] == name}
        for key in stages:
            del self._stages[key]
        return stages, self.replay_ms.pop(name, None)

    def stage(self, name: str, width: int) -> Stage:
        """The stage ``name`` at the bucket of ``width`` tokens, made (and captured) on first use."""
        if name not in self.kinds:
            raise MirrorSDError(f"no stage {name!r} (stages: {', '.join(self.kinds)})")
        key = (name, bucket(width))
        if key not in self._stages:
            stage = self.make(name, key[1])
            stage.tuned_kernels = self.tuned_kernels
            if self.graphs:
                self.capture(name, stage)
                self.replay_ms.setdefault(name, {})[key[1]] = stage.time_replays()
                stage.launch_ms, stage.from_idle_ms = stage.time_launch()
            self._stages[key] = stage
        return self._stages[key]

    def made(self, name: str, width: int) -> Stage | None:
        """The stage ``name`` at bucket ``width`` if it has been made, else None (none is made)."""
        return self._stages.get((name, width))

    def capture(self, name: str, stage: Stage):
        """Capture ``stage`` in this set's pool on its stream. Where a one-stage forward (``OwnStage``)
        fails to capture, it is refused with a warning, so that its method goes on an operation at a
        time (the methods run such a forward only while it is named here): one failed capture costs
        that forward's speed, not the run."""
        own = isinstance(self.kinds[name], OwnStage)
        try:
            stage.capture(self.pool, self.stream, check=own)
        except Exception as e:
            if not own:
                raise
            warnings.warn(f"stage {name!r} could not be captured as a CUDA graph ({type(e).__name__}: {e}); "
                          f"its method runs that work an operation at a time instead")
            self.refused[name] = f"{type(e).__name__}: {e}"
            if self.pool is not None:  # a failed capture may leave its pool recording: take a fresh one
                self.pool = torch.cuda.graph_pool_handle()
            self._take(name)
            del self.kinds[name]
            raise StageRefused(name) from e

    def make(self, name: str, width: int) -> Stage:
        """A new stage of the forward ``name`` at ``width`` rows (not captured yet)."""
        kind = self.kinds[name]
        if isinstance(kind, OwnStage):  # a forward that makes its own kind of stage
            return kind.make_stage(self.model, width, self.cache)
        return Stage(self.model, width, self.cache, (kind.start, kind.end), kind.head, kind.streams)

    def run(self, name: str, x, positions=None, mask=None, rows: int | None = None, **inputs):
        """Stage ``name`` over x's T rows (a tensor, or lists of ids) at the cheapest bucket that holds
        them (see :meth:`Stage.run`; ``inputs``: what a kind of stage reads besides, such as an EAGLE
        head's features; ``rows``: the rows to hold where they are not x's, as in Mirror-SD's
        rollouts, whose stage holds every branch's root after x)."""
        rows = rows or (len(x[0]) if isinstance(x, list) else x.shape[1])
        return self.stage(name, self.route(name, rows)).run(x, positions, mask, **inputs)

    def route(self, name: str, width: int) -> int:
        """The bucket a window of ``width`` rows of ``name`` runs at (:func:`cheapest_bucket`; the
        smallest that holds it when ``cheapest`` is off)."""
        return cheapest_bucket(width, self.replay_ms.get(name, {}) if self.cheapest else {})

    def routes(self, name: str) -> dict[int, int]:
        """{width: bucket} for the widths of ``name`` that run at a wider bucket than the smallest."""
        return routed_widths(self.replay_ms.get(name, {}) if self.cheapest else {})

    def missing(self, names=None, widths=BUCKETS) -> list[tuple[str, int]]:
        """The (name, width) stages not made yet (names None: every named forward; a forward that
        names its ``widths`` is made at those only; a refused one, at none)."""
        return [(n, w) for n in (names or list(self.kinds)) if n in self.kinds for w in widths
                if w in getattr(self.kinds[n], "widths", BUCKETS) and (n, w) not in self._stages]

    def capture_all(self, names=None, widths=BUCKETS, progress=None):
        """Make every (name, width) not made yet now, at warm-up, so no step pays for a capture;
        ``progress(done, total)`` after each. A refused forward's other widths are skipped."""
        pairs = self.missing(names, widths)
        for done, (name, width) in enumerate(pairs, 1):
            if name in self.kinds:
                try:
                    self.stage(name, width)
                except StageRefused:
                    pass
            if progress is not None:
                progress(done, len(pairs))
