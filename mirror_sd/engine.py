"""Running one method on one prompt: input checks, the decode loop, stop rules, metrics.

``stream`` yields an :class:`Output` after every committed step (the app draws these live; closing
the generator stops decoding and keeps what was committed). ``generate`` returns the last one.
Errors during decoding (a device that fails mid-run, say) end the run with ``finished="error"`` and
a message, keeping every token already committed. A draft lane that fails is not the end: the run
goes on with the target alone (vanilla decoding, ``methods/vanilla.py``) from what was committed, so
the text stays whole and, at temperature 0, equal to vanilla's; ``Output.note`` and the trace's
``meta["note"]`` say so. A ``stop`` event, once set, ends the run "stopped" at the next layer of a
forward (or chunk of a prefill) or between steps, keeping what was committed: a prefill of
thousands of tokens, one forward, would otherwise hold a stop for as long as it runs. ``wall_s``
(and so tokens/s) counts the time spent decoding, not the consumer's time between two steps: an
app that redraws after every step does not slow the method it shows.
"""
from __future__ import annotations

import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from .devices import LaneError, allot_cpu_threads, single_threaded
from .errors import MirrorSDError, Stopped
from .methods import get_method, vanilla
from .models.pair import ModelPair
from .nvml import GpuSampler
from .options import refuse_greedy_only
from .sampling import Sampler, draft_argmax, to_target_vocab
from .trace import RECORDS, Step, Trace

MAX_NEW_TOKENS_LIMIT = 4096
WINDOW_MARGIN = 64  # cache slots beyond prompt + max_new_tokens, for the last draft window


@dataclass
class Output:
    method: str
    text: str
    token_ids: list[int]  # generated tokens only
    trace: Trace
    metrics: dict
    finished: str  # "running", "eos", "length", "stopped" or "error"
    error: str | None = None
    prompt_tokens: int = 0
    note: str | None = None  # e.g. the draft lane failed and the run finished target-only


class Decoding:
    """The state a method's decode loop works on: the pair, the prompt, samplers, what is committed."""

    def __init__(self, pair: ModelPair, prompt_ids: list[int], max_new_tokens: int, temperature: float,
                 top_p: float, seed: int, trace: Trace):
        self.pair = pair
        self.prompt_ids = prompt_ids
        self.max_new_tokens = max_new_tokens
        self.target_sampler = Sampler(temperature, top_p, seed)
        self.draft_sampler = Sampler(temperature, top_p, seed + 1)  # own stream: lanes run concurrently
        self.trace = trace
        self.target_lane = pair.target_lane.recording(trace)  # the lanes, recording into this run's trace
        self.draft_lane = pair.draft_lane.recording(trace)
        self.tokens: list[int] = []
        self.finished = "running"

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.tokens

    @property
    def done(self) -> bool:
        return self.finished != "running"

    @property
    def cache_slots(self) -> int:
        return len(self.prompt_ids) + self.max_new_tokens + WINDOW_MARGIN

    @property
    def next_step(self) -> int:
        return len(self.trace.steps)

    def commit(self, step: Step) -> Step:
        """Append a step's tokens, cut at end-of-sequence or at max_new_tokens, and record it."""
        room = self.max_new_tokens - len(self.tokens)
        keep = step.committed[:room]
        for i, token in enumerate(keep):
            if token in self.pair.eos_ids:
                keep = keep[:i + 1]
                self.finished = "eos"
                break
        step.committed, step.origins = keep, step.origins[:len(keep)]
        step.accepted = min(step.accepted, len(keep))  # drafts cut at the end are not committed either
        self.tokens += keep
        if not self.done and len(self.tokens) >= self.max_new_tokens:
            self.finished = "length"
        self.trace.add_step(step)
        return step

    def as_target_vocab(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits [..., V_draft] laid out on the target's vocabulary (see to_target_vocab)."""
        return to_target_vocab(draft_logits, self.pair.draft.vocab_map, self.pair.target.args.vocab_size)

    def draft_picks(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """The draft's greedy picks, target ids [...], from its logits [..., V_draft] (see draft_argmax)."""
        return draft_argmax(draft_logits, self.pair.draft.vocab_map, self.pair.target.args.vocab_size)


def check_settings(max_new_tokens, temperature, top_p, seed):
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise MirrorSDError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
        raise MirrorSDError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS_LIMIT}, got {max_new_tokens}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise MirrorSDError(f"temperature must be a number >= 0, got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise MirrorSDError(f"top_p must be in (0, 1], got {top_p!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise MirrorSDError(f"seed must be an integer from 0 to 2**63 - 1, got {seed!r}")


def encode_prompt(pair: ModelPair, prompt, raw: bool, max_new_tokens: int) -> list[int]:
    messages = isinstance(prompt, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                for m in prompt)
    if not isinstance(prompt, str) and not messages:
        raise MirrorSDError(f"a prompt is a string or a list of chat messages ({{'role': ..., 'content': ...}}), "
                            f"got {type(prompt).__name__}")
    text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
    if not text.strip():
        raise MirrorSDError("the prompt is empty: type some text")
    ids = pair.encode(prompt, raw=raw)
    context, window = pair.context_length, pair.target.args.sliding_window
    if window and len(ids) + max_new_tokens + WINDOW_MARGIN > window:
        raise MirrorSDError(
            f"the prompt is {len(ids)} tokens; with max_new_tokens={max_new_tokens} it goes beyond the target's "
            f"sliding attention window of {window} tokens, which mirror-sd does not implement (it attends to every "
            f"token): keep prompt + new tokens under {window - WINDOW_MARGIN}")
    if len(ids) + max_new_tokens + WINDOW_MARGIN > context:
        raise MirrorSDError(
            f"the prompt is {len(ids)} tokens; with max_new_tokens={max_new_tokens} it does not fit the "
            f"target's context of {context} tokens (keep prompt + new tokens under {context - WINDOW_MARGIN})")
    return ids


def stream(pair: ModelPair, prompt, method: str = "sd", max_new_tokens: int = 128, temperature: float = 0.0,
           top_p: float = 1.0, seed: int = 0, raw: bool = False, stop: threading.Event | None = None,
           **options) -> Iterator[Output]:
    """Decode ``prompt`` with ``method``, yielding an Output after every committed step; ``stop``, once
    set, ends the run within a layer's time (module docstring)."""
    yield from _decode(pair, prompt, method, max_new_tokens, temperature, top_p, seed, raw, True, options, stop)


def _decode(pair: ModelPair, prompt, method: str, max_new_tokens: int, temperature: float, top_p: float,
            seed: int, raw: bool, every_step: bool, options: dict,
            stop: threading.Event | None = None) -> Iterator[Output]:
    """The decode loop: an Output after every committed step (``every_step``), and one at the end.
    Without ``every_step`` nothing is built between steps: an Output decodes the whole text and
    derives every metric from the whole trace, host work a GPU would wait for at each step."""
    spec = get_method(method)
    opts = spec.resolve_options(options)
    check_settings(max_new_tokens, temperature, top_p, seed)
    refuse_greedy_only(spec.options, options, temperature, f"method {method!r}")
    if spec.needs_draft and pair.draft is None:
        raise MirrorSDError(f"method {method!r} needs a draft model: pass one (--draft, or load_pair(draft=...)); "
                            f"only the embedded target has a default draft")
    with single_threaded():  # this thread's own torch work (devices.py says why)
        if spec.check is not None:
            spec.check(pair, opts)
        prompt_ids = encode_prompt(pair, prompt, raw, max_new_tokens)
    lanes = spec.lanes(pair)
    meta = dict(pair.describe(), method=method, options=opts, max_new_tokens=max_new_tokens,
                temperature=temperature, top_p=top_p, seed=seed, prompt_tokens=len(prompt_ids))
    with pair.lock, stoppable(pair, lanes, stop):  # one generation at a time per pair: lanes, caches not shared
        allot_cpu_threads(lanes, parallel=spec.parallel_lanes)
        meta["threads"] = {lane.name: lane.threads for lane in lanes}
        meta["span_clocks"] = {lane.name: lane.span_clock for lane in lanes}  # host readings or CUDA events
        trace = Trace(method, meta)
        run = Decoding(pair, prompt_ids, max_new_tokens, temperature, top_p, seed, trace)
        gpu_sampler = GpuSampler(trace, lanes)  # NVML readings on NVIDIA GPUs; nothing elsewhere
        decoding_s = 0.0  # time spent decoding: not the consumer's time between steps (an app redrawing, say)
        error, finished = None, None
        try:
            steps = spec.decode(run, **opts)
            while not run.done:
                if stop is not None and stop.is_set():
                    raise Stopped
                start = time.perf_counter()
                try:
                    with single_threaded():  # the decode loop's own work here; the lanes' work on their workers
                        step = next(steps, None)
                except LaneError as e:
                    if e.lane != "draft" or "note" in trace.meta or isinstance(e.error, Stopped):
                        raise  # a target lane's error ends the run, as any error does
                    steps = on_draft_failure(run, e, lanes)
                    continue
                finally:
                    decoding_s += time.perf_counter() - start
                if step is None:
                    break
                if every_step and not run.done:  # the last step's Output is the one after the loop
                    yield _output(run, spec.name, decoding_s)
        except GeneratorExit:  # the consumer stopped listening: a user's stop
            finished = "stopped"
            raise
        except Exception as e:  # a device or kernel failure mid-run, or a stop: keep what was committed
            if isinstance(e, Stopped) or isinstance(getattr(e, "error", None), Stopped):
                finished = "stopped"
            else:
                error = failure_message(run, e)
        finally:
            gpu_sampler.close()
            run.finished = finished or ("error" if error else run.finished)
        yield _output(run, spec.name, decoding_s, error)


@contextmanager
def stoppable(pair: ModelPair, lanes, stop: threading.Event | None):
    """While a run decodes, its models check ``stop`` before each layer (``Transformer.check_stop``). On
    the way out every lane finishes the work it was given (a phase still running when another lane's
    raised ``Stopped``), so the next run finds the lanes and caches free."""
    models = [m for m in (pair.target, pair.draft) if m is not None and hasattr(m, "check_stop")]
    for model in models:
        model.stop = stop
    try:
        yield
    finally:
        if stop is not None and stop.is_set():
            for lane in lanes:
                lane.worker.submit(lambda: None).result()
        for model in models:
            model.stop = None


def on_draft_failure(run: Decoding, e: LaneError, lanes) -> Iterator[Step]:
    """The draft lane failed: note it in the trace and go on target-only. Nothing committed is
    undone; the target lane gets every CPU core the lanes shared."""
    where = f"step {e.step}" if e.step is not None else "a step"
    run.trace.meta["note"] = (f"draft lane failed at {where}: {e}; finished target-only "
                              f"(vanilla decoding) after {len(run.tokens)} tokens")
    allot_cpu_threads([lane for lane in lanes if lane is run.pair.target_lane], parallel=False)
    return vanilla.decode(run, note=" (target only)")


def failure_message(run: Decoding, e: Exception) -> str:
    """What the Output's ``error`` says: a MirrorSDError's own words, else the error and how far the
    run got (a LaneError is read as the error it carries)."""
    e = e.error if isinstance(e, LaneError) else e
    if isinstance(e, MirrorSDError):
        return str(e)
    return f"decoding failed after {len(run.tokens)} tokens: {type(e).__name__}: {e}"


def generate(pair: ModelPair, prompt, method: str = "sd", max_new_tokens: int = 128, temperature: float = 0.0,
             top_p: float = 1.0, seed: int = 0, raw: bool = False, stop: threading.Event | None = None,
             **options) -> Output:
    """Decode ``prompt`` with ``method`` and return the finished Output (text, ids, trace, metrics);
    ``stop`` as for ``stream``."""
    out = None
    for out in _decode(pair, prompt, method, max_new_tokens, temperature, top_p, seed, raw, False, options, stop):
        pass
    return out


def _output(run: Decoding, method: str, wall_s: float, error: str | None = None) -> Output:
    return Output(method=method, text=run.pair.decode(run.tokens), token_ids=list(run.tokens), trace=run.trace,
                  metrics=compute_metrics(run.trace, len(run.tokens), wall_s), finished=run.finished,
                  error=error, prompt_tokens=len(run.prompt_ids), note=run.trace.meta.get("note"))


def compute_metrics(trace: Trace, new_tokens: int, wall_s: float) -> dict:
    """Spec-Bench style numbers; every one derived from the trace and the wall clock."""
    decode_steps = [s for s in trace.steps if s.index > 0]  # step 0 is the prefill
    committed = sum(len(s.committed) for s in decode_steps)
    proposed = sum(len(s.proposed) for s in decode_steps)
    accepted = sum(s.accepted for s in decode_steps)
    busy = trace.busy_seconds()
    extra = {}
    for name, record in RECORDS.items():  # what each kind of step record adds (Mirror-SD's hit rate, ...)
        steps = [s for s in decode_steps if getattr(s, name) is not None]
        if steps:
            extra.update(record.metrics(steps, trace))
    target_lane, draft_lane = trace.lane_label("target"), trace.lane_label("draft")
    if target_lane and draft_lane:
        draft_busy = busy.get(draft_lane, 0.0)
        extra["overlap"] = trace.overlap_seconds(draft_lane, target_lane) / draft_busy if draft_busy else 0.0
    return dict(
        new_tokens=new_tokens,
        steps=len(decode_steps),
        mean_accepted=committed / len(decode_steps) if decode_steps else 1.0,
        acceptance_rate=accepted / proposed if proposed else None,
        wall_s=wall_s,
        tokens_per_s=new_tokens / wall_s if wall_s > 0 else 0.0,
        busy_s={lane: round(t, 6) for lane, t in busy.items()},
        utilisation={lane: min(1.0, t / wall_s) for lane, t in busy.items()} if wall_s > 0 else {},
        **extra,
    )
