"""The one seam between the methods and a model's forwards: plain, or on fixed-shape stages.

Methods run a model (the target or the draft) through :func:`forward`, :func:`layers` and
:func:`stream_layers` (speculative stream rows), with a cache from ``ModelPair.new_cache``; an
EAGLE head routes its own forward the same way (models/eagle.py). With graphs off that cache is a
plain ``KVCache`` and each calls the model's own forward, as the methods always did. With graphs on
it is the ``StageCache`` of the model's :class:`~.stages.Stages` (``stage_cache``), and each runs a
stage of that set instead: a captured CUDA graph on a CUDA lane, the same fixed-shape forward
eagerly elsewhere. Which one runs is decided here, from the cache, and nowhere in the methods.

A whole phase can be one stage too (an ``OwnStage``: Mirror-SD's token channel and rollouts, a
chain draft, EAGLE's tree draft, a tree verification, the streams' draft). Its result comes in its
own form (a tree's fields on the device, not a tree on the host), so the method that owns the
phase asks :func:`staged_for` once and runs the stage or its own reference code.

What a forward runs is a :class:`~.stages.LayerRange`: layers [start, end) and what reads them (the
LM head, a reader module in its place, or nothing), or the rows of speculative streams. A stage set
names each forward by it (:func:`range_name`): "full" (every layer and the LM head) and the ranges
a method asks for when it makes its cache (Mirror-SD's prefix, early exit and suffix, the streams'
split and their rows, EAGLE's early-feature layers). A window a stage
cannot hold runs the plain forward on the same cache (a ``StageCache`` is a ``KVCache``): more than
64 rows under a tree mask, or a batch other than the set's. A causal window of more than 64 rows (a
prefill) runs as 64-row chunks, each attending to the chunks before it.
"""
from __future__ import annotations

from typing import Callable

import torch

from .llama import KVCache, Transformer, Unstored
from .stages import MAX_WIDTH, LayerRange, OwnStage, Stages  # noqa: F401  (LayerRange: for the methods)

SLOT_STEP = 512  # a stage set's cache grows in steps of this many slots (a new set, captured anew)
FULL = LayerRange(0, None, lm_head=True)  # every layer, then the LM head: ``forward``


def range_name(model: Transformer, part: LayerRange) -> str:
    """The stage name of ``part``: "full" for the whole forward; with a reader or streams, their
    ``stage_name`` ("streams 26-30", "early exit at 22"); else "layers a-b" (+ " + head")."""
    a, b = part.start, part.of(model).end
    named = part.reader if part.reader is not None else part.streams
    if named is not None:
        return f"{named.stage_name} {a}-{b}" if a < b else f"{named.stage_name} at {a}"
    if (a, b, part.lm_head) == (0, model.num_layers, True):
        return "full"
    return f"layers {a}-{b}" + (" + head" if part.lm_head else "")


def stage_cache(sets: dict, model: Transformer, slots: int, ranges: list = (FULL,), stream=None,
                progress: Callable[[int], object] | None = None, stage_set: type = Stages,
                tuned_kernels: bool = True) -> KVCache:
    """The cache of ``model``'s stage set in ``sets`` (model -> Stages), emptied, with at least
    ``slots`` usable slots, and every stage of ``ranges`` (none: every forward the set names; see ``stage_name``) made
    at every width (on CUDA: captured now, on ``stream``, so that no step pays for a capture and no
    capture runs beside another lane's work). A set too small for ``slots`` is replaced by a bigger
    one. ``stage_set``: the set's class (models/eagle.py's ``HeadStages`` for an EAGLE head).
    ``tuned_kernels``: stages made from now on capture each operation models/tuning.py tunes in
    its fastest formulation.

    progress(total) -> a callable(done, total) for the stages still to make, or None."""
    stages = sets.get(model)
    if stages is None or stages.cache.max_slots < slots:
        stages = sets[model] = stage_set(model, -(-slots // SLOT_STEP) * SLOT_STEP, stream=stream)
    stages.tuned_kernels = tuned_kernels
    names = [stage_name(stages, r) for r in ranges if not (isinstance(r, LayerRange) and r.runs_nothing)]
    missing = stages.missing(names)
    stages.capture_all(names, progress=progress(len(missing)) if progress and missing else None)
    stages.cache.rollback(0)
    return stages.cache


def stage_name(stages: Stages, r) -> str:
    """The name of a forward in a stage set, added if new: a ``LayerRange`` (``name_range``), a stage's
    name as it is, or a one-stage forward (``OwnStage``), which names itself."""
    if isinstance(r, str):
        return r
    return r.stage_name_in(stages) if isinstance(r, OwnStage) else name_range(stages, r)


def name_range(stages: Stages, part: LayerRange) -> str:
    """Add the forward ``part`` runs to a stage set (if new) and return its name."""
    name = range_name(stages.model, part)
    if stages.kinds.get(name) != part.of(stages.model):
        stages.add(name, part)
    return name


def staged(model: Transformer, cache) -> Stages | None:
    """The stage set whose cache this is, if it is ``model``'s; else None (the plain forward runs)."""
    stages = getattr(cache, "stages", None)
    return stages if stages is not None and stages.model is model else None


def staged_for(model: Transformer, cache, forward) -> Stages | None:
    """``staged``, where the set makes the one-stage ``forward`` (an ``OwnStage``: named when the cache
    was made, and not refused at its capture); else None (the method's work an operation at a time)."""
    stages = staged(model, cache)
    return stages if stages is not None and forward.name in stages.kinds else None


def forward(model: Transformer, ids: torch.Tensor, cache, positions=None, tree_mask=None,
            commit: bool = True) -> torch.Tensor:
    """Logits [B, T, V] for ids [B, T] written after the cache's committed slots, as
    ``Transformer.forward`` gives them (same arguments); on the "full" stage for a stage cache."""
    stages = staged(model, cache)
    if stages is None:
        return model(ids, cache, positions, tree_mask, commit)  # through __call__: forward hooks still run
    logits = layers(model, ids, cache, FULL, positions, tree_mask)
    if commit:
        cache.length += ids.shape[1]
    return logits


def layers(model: Transformer, x: torch.Tensor, cache, part: LayerRange, positions=None, tree_mask=None,
           last: int | None = None, each_layer: Callable[[], object] | None = None) -> torch.Tensor:
    """The forward ``part`` names (its layers, then its LM head or reader) over a window written after
    the cache's committed slots: x is ids [B, T] (integers; part.start == 0) or hidden states
    [B, T, d]; a head reads the last ``last`` rows only, if given. Returns hidden states [B, T, d],
    logits [B, T or last, V], or what the reader gives. The cache's length does not move: the
    caller commits.

    positions and tree_mask as in ``Transformer.window``. each_layer(): called before each layer
    and before the head on the plain path, once before a stage (Mirror-SD widens its CPU threads
    there)."""
    part = part.of(model)
    if part.runs_nothing:
        return x if x.is_floating_point() else model.embed(x)
    stages = staged(model, cache)
    if stages is None or not _fits(stages, x, part.start, tree_mask):
        return _plain_layers(model, x, cache, part, positions, tree_mask, last, each_layer)
    if each_layer is not None:
        each_layer()
    out = _run_stage(stages, name_range(stages, part), x, cache, positions, tree_mask)
    return out[:, -last:] if part.head is not False and last is not None else out


def read(model: Transformer, h: torch.Tensor, cache, layer: int, reader: torch.nn.Module) -> torch.Tensor:
    """``reader`` (a module in the LM head's place: Mirror-SD's EarlyExit) over hidden states h
    [B, T, d] after ``layer``: on the stage "<reader> at <layer>" for a stage cache, else reader(h)."""
    return layers(model, h, cache, LayerRange.read_at(layer, reader))


def stream_layers(model: Transformer, streams, rows: torch.Tensor, cache, positions, mask) -> torch.Tensor:
    """Stream rows [B, n, d] entering layer ``streams.first_layer`` through the top layers, then the
    streams' head: logits [B, n, head rows]. positions [B, n]; mask [B, n, cache.length + n] (what
    each row sees of the cache and of the rows). The rows' keys and values are stored nowhere. On
    the stage "streams a-b" for a stage cache (at most 64 rows), else the plain forward through the
    streams' copies of the layers (``Streams.layers_for``) with a cache that stores nothing."""
    a, b = streams.first_layer, model.num_layers
    stages = staged(model, cache)
    if stages is not None and _fits(stages, rows, a, mask):
        return stages.run(name_range(stages, LayerRange(a, streams=streams)), rows, positions, mask)
    win = model.window(None, rows.shape[1], positions, mask, batch=rows.shape[0])
    h = model.forward_layers(rows, Unstored(cache), win, a, b, stack=streams.layers_for(model, a, b))
    return streams.logits(model, h)


def _fits(stages: Stages, x: torch.Tensor, a: int, tree_mask) -> bool:
    """Whether a stage of this set can run window x from layer a: its batch, ids exactly where the
    stage embeds them (layer 0), and at most 64 rows unless causal."""
    return (x.shape[0] == stages.cache.k.shape[1] and x.is_floating_point() == (a > 0)
            and (tree_mask is None or x.shape[1] <= MAX_WIDTH))


def _run_stage(stages: Stages, name: str, x: torch.Tensor, cache, positions=None, tree_mask=None):
    """Stage ``name`` over x's T rows; a causal window of T > 64 rows as chunks of 64."""
    T = x.shape[1]
    if T <= MAX_WIDTH:
        return stages.run(name, x, positions, tree_mask)
    start, outs = cache.length, []
    for i in range(0, T, MAX_WIDTH):
        stages.model.check_stop()  # a long prefill stops between two chunks
        chunk = slice(i, i + MAX_WIDTH)
        outs.append(stages.run(name, x[:, chunk], None if positions is None else positions[:, chunk]))
        cache.length += outs[-1].shape[1]  # the next chunk attends to this one
    cache.length = start
    return torch.cat(outs, dim=1)


def _plain_layers(model, x, cache, part: LayerRange, positions, tree_mask, last, each_layer):
    """The model's own forward of ``part``'s layers (and its head), as the methods ran it before stages."""
    a, b, head = part.start, part.end, part.head
    h = x if x.is_floating_point() else model.embed(x)
    win = model.window(cache, x.shape[1], positions, tree_mask, batch=x.shape[0]) if a < b else None
    if each_layer is None:
        h = model.forward_layers(h, cache, win, a, b) if a < b else h
    else:
        for layer in range(a, b):
            each_layer()
            h = model.forward_layers(h, cache, win, layer, layer + 1)
        each_layer()
    if head is False:
        return h
    read = model.head if head is True else head
    return read(h if last is None else h[:, -last:])


def forward_rows(model, cache, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 rows: int) -> torch.Tensor:
    """Write ids [T] at positions [T] (on the model's device) at the cache's next slots under ``mask``;
    logits of the last ``rows`` tokens only."""
    logits = layers(model, ids[None], cache, FULL, positions[None], mask, last=rows)  # [1, rows, V]
    cache.length += len(ids)
    return logits[0]
