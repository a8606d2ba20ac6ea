"""What a generation did, and when: spans of measured work per lane, and one record per step.

A :class:`Trace` is the only thing the app, the CLI and the bench read. It exports to pandas, to
JSON (and back, so recorded runs replay with no model), and to Chrome-trace JSON for Perfetto.

Token origins in a step's ``origins`` (what the app colours):
  "target"     a token the target produced alone (prefill, vanilla decoding)
  "accepted"   a draft token the target verified
  "correction" the target's token at the first rejected draft position
  "bonus"      the target's extra token after a fully accepted draft window

What a method drafted in a step is kept in typed records on the step (``DraftTree``, ``DraftWork``,
``Rendezvous``); each record type says how it adds to a run's metrics (``engine.compute_metrics``).
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum

import pandas as pd


class SpanKind(StrEnum):
    """What a span's work was: one name per phase of a step, shared by the methods, the trace, the
    what-if model and the app (each a string too, so saved traces read as plain JSON)."""

    PREFILL = "prefill"  # the prompt through a model
    DECODE = "decode"  # vanilla: one target forward, one token
    DRAFT = "draft"  # sd, eagle, ss: the window or tree the target verifies next
    VERIFY = "verify"  # sd, eagle, ss: the target's forward over the window, and the acceptance rule
    TARGET_PREFIX = "target-prefix"  # Mirror-SD: layers [0, exit) and the early exit (the token channel)
    TARGET_SUFFIX = "target-suffix"  # Mirror-SD: layers [exit, N) and the LM head
    DRAFT_ROLLOUT = "draft-rollout"  # Mirror-SD: the branches' rollouts, beside the suffix
    RENDEZVOUS = "rendezvous"  # Mirror-SD: verification and the branch match
    FALLBACK_DRAFT = "fallback-draft"  # Mirror-SD: a fresh window after a miss, on the critical path
    CORRECTION_ROLLOUT = "correction-rollout"  # Mirror-SD: the branch of the step's own outcome (queued steps)


@dataclass
class Span:
    lane: str  # lane label, e.g. "target, GPU role, cpu:0"
    kind: SpanKind
    label: str
    start: float  # seconds since the trace began
    end: float
    step: int | None = None
    tokens: int = 0  # tokens processed or produced by this work

    @property
    def duration(self) -> float:
        return self.end - self.start


class Record:
    """A typed part of a step record: what one kind of drafting did in the step. Each kind says how
    it adds to a run's metrics and which columns it gives the steps table."""

    @staticmethod
    def metrics(steps: list["Step"], trace: "Trace") -> dict:
        """Metrics over the decoding steps that carry this record."""
        return {}

    def columns(self) -> dict:
        """Columns of this record in ``Trace.steps_frame``."""
        return asdict(self)


@dataclass
class DraftTree(Record):
    """A draft tree the target verified in one forward (eagle, ss). Nodes in creation order, a parent
    before its children; node i sits at window index i + 1 behind the root (the last committed token)."""

    tokens: list[int]
    parents: list[int]  # index of the parent node; -1 for children of the root
    depths: list[int]  # 1 for children of the root
    scores: list[float | None]  # sum of draft log-probs along the path (None: copied from the context)
    path: list[int]  # the nodes the target accepted, root to leaf
    copied: list[int] = field(default_factory=list)  # nodes copied from the context (drafting/lookup.py)
    stream_rows: int = 0  # ss with one_forward: speculative-stream rows run in the verify step

    def columns(self) -> dict:
        tree = asdict(self)
        rows = tree.pop("stream_rows")
        return dict(tree=tree, **(dict(stream_rows=rows) if rows else {}))


@dataclass
class DraftWork(Record):
    """How a draft model made a step's window (sd)."""

    forwards: int  # draft forwards the window took (gamma token by token, 1 with streams, fewer when checked)
    lookahead: list[tuple[int, int]] = field(default_factory=list)  # per forward: lookahead tokens checked, kept
    copied_at: list[int] = field(default_factory=list)  # window positions copied from the context

    @staticmethod
    def metrics(steps, trace) -> dict:
        proposed = sum(len(s.proposed) for s in steps)
        forwards = sum(s.draft.forwards for s in steps)
        return dict(draft_tokens=proposed, draft_forwards=forwards, draft_tokens_per_forward=proposed / forwards)

    def columns(self) -> dict:
        return dict(draft_forwards=self.forwards, lookahead=self.lookahead, copied_at=self.copied_at)


@dataclass
class Rendezvous(Record):
    """Mirror-SD's step: where the window came from, the early-exit candidates, the branches the draft
    lane rolled out, and the one the verdict picked (a hit) or none (a miss)."""

    exit_candidates: list[list[int]]  # top-kappa early-exit ids per window position
    branches: list[tuple[int, int, list[int]]]  # (accepted r, root token v, the draft's continuation)
    branch_used: int | None  # index in branches of the verdict's (accepted, token); None: a miss
    fallback: bool  # this window was drafted afresh, on the critical path
    copied: bool  # this window was copied from the context (after a miss)
    # Tree windows (the step's ``tree`` is the window): r is a row of [root, nodes], and each branch's
    # continuation is a tree, these its nodes' parents (-1: the branch's root token v). Chains: [].
    branch_parents: list[list[int]] = field(default_factory=list)
    # This window is the last step's correction rollout: after a miss, the draft stream rolled out from
    # the target's own token while the host read the verdict (a queued step's; no fallback draft)
    corrected: bool = False

    @property
    def hit(self) -> bool:
        return self.branch_used is not None

    @staticmethod
    def metrics(steps, trace) -> dict:
        rendezvous = [s.duration for s in trace.spans if s.kind == SpanKind.RENDEZVOUS]
        return dict(hit_rate=sum(s.rendezvous.hit for s in steps) / len(steps),
                    fallbacks=sum(1 for s in trace.spans if s.kind == SpanKind.FALLBACK_DRAFT),
                    rendezvous_ms=1000 * sum(rendezvous) / max(len(rendezvous), 1))

    def columns(self) -> dict:
        return dict(asdict(self), hit=self.hit)


RECORDS = {"tree": DraftTree, "draft": DraftWork, "rendezvous": Rendezvous}  # Step field -> its record type


@dataclass
class Step:
    index: int  # 0 is the prefill; 1.. are decoding steps
    committed: list[int]  # tokens committed by this step, in order
    origins: list[str]  # one origin per committed token (see the module docstring)
    proposed: list[int] = field(default_factory=list)  # draft tokens the target checked
    accepted: int = 0  # how many of ``proposed`` the target accepted
    tree: DraftTree | None = None  # the draft tree verified (eagle, ss)
    draft: DraftWork | None = None  # how the draft model made the window (sd)
    rendezvous: Rendezvous | None = None  # Mirror-SD's branches and hit

    @property
    def kind(self) -> str:
        """'step' for a method without rendezvous; for a Mirror-SD step 'WINDOW -> OUTCOME': where its
        window came from (a hit's branch, a copy from the context, a fallback draft, the last step's
        correction rollout) and hit or miss."""
        r = self.rendezvous
        if r is None:
            return "step"
        window = "copied" if r.copied else "fallback" if r.fallback else "correction" if r.corrected else "hit's branch"
        return f"{window} -> {'hit' if r.hit else 'miss'}"

    def records(self) -> list[Record]:
        return [r for r in (getattr(self, name) for name in RECORDS) if r is not None]

    @property
    def accepted_at(self) -> list[int]:
        """Where the accepted draft tokens sit in the draft: window positions of a chain, or the
        accepted path's nodes of a draft tree."""
        return list(range(self.accepted)) if self.tree is None else self.tree.path[:self.accepted]

    @property
    def rejected_at(self) -> list[int]:
        """Where the rejected draft tokens (``rejected``) sit in the draft: window positions of a chain,
        or node indices of a draft tree."""
        if self.tree is None:
            return list(range(self.accepted, len(self.proposed)))
        last = self.tree.path[self.accepted - 1] if self.accepted else -1
        return [node for node, parent in enumerate(self.tree.parents) if parent == last]

    @property
    def rejected(self) -> list[int]:
        """Draft tokens the target turned down where the step stopped accepting: the rest of a chain
        window, or, for a draft tree, the candidates at that position (the children of the last
        accepted node): the tree's other nodes hang off other positions."""
        tokens = self.proposed if self.tree is None else self.tree.tokens
        return [tokens[i] for i in self.rejected_at]

    @property
    def copied(self) -> set[int]:
        """Where the draft tokens copied from the context sit (as in ``accepted_at``): tree nodes, sd's
        copied window positions, or a whole Mirror-SD window copied after a miss."""
        if self.rendezvous is not None and self.rendezvous.copied:
            return set(range(len(self.proposed)))
        if self.tree is not None:
            return set(self.tree.copied)
        return set(self.draft.copied_at) if self.draft is not None else set()

    def columns(self) -> dict:
        """The step as one row of ``Trace.steps_frame``."""
        row = dict(index=self.index, committed=self.committed, origins=self.origins, proposed=self.proposed,
                   accepted=self.accepted, new_tokens=len(self.committed))
        for record in self.records():
            row.update(record.columns())
        return row

    @classmethod
    def from_dict(cls, data: dict) -> "Step":
        records = {name: kind(**data[name]) for name, kind in RECORDS.items() if data.get(name) is not None}
        return cls(**{**data, **records})


@dataclass
class GpuSample:
    device: str  # e.g. "cuda:0"
    t: float  # seconds since the trace began
    percent: float  # NVML: share of the last sample period with a kernel running


def step_cost_table(traces) -> pd.DataFrame:
    """Per (method, step kind) over ``traces``: steps, share of the method's steps, ms per step, tokens
    per step, ms per token and idle ms per step (``Trace.step_costs``): which kinds of step pay for
    themselves, and how much of a step no lane was working."""
    frame = pd.concat([t.step_costs().assign(method=t.method) for t in traces])
    table = frame.groupby(["method", "kind"], sort=False).agg(steps=("ms", "size"), ms=("ms", "sum"),
                                                                tokens=("tokens", "sum"), idle=("idle", "sum"))
    table["share"] = table.steps / table.groupby(level="method").steps.transform("sum")
    table["ms per step"] = table.ms / table.steps
    table["tokens per step"] = table.tokens / table.steps
    table["ms per token"] = table.ms / table.tokens
    table["idle ms per step"] = table.idle / table.steps
    return table[["steps", "share", "ms per step", "tokens per step", "ms per token", "idle ms per step"]]


def _covered(spans: list[Span], start: float, end: float) -> float:
    """Seconds of [start, end) during which at least one of ``spans`` ran (their union)."""
    covered, reach = 0.0, start
    for s in sorted(spans, key=lambda s: s.start):
        lo, hi = max(s.start, reach), min(s.end, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered


class Trace:
    def __init__(self, method: str, meta: dict | None = None):
        self.method = method
        self.meta = dict(meta or {})  # models, devices, options, prompt length ...
        self.lanes: dict[str, str] = {}  # lane label -> lane name ("target" / "draft")
        self.spans: list[Span] = []
        self.steps: list[Step] = []
        self.gpu_samples: list[GpuSample] = []  # NVML readings, on NVIDIA GPUs only (mirror_sd/nvml.py)
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()

    def add_span(self, lane, kind, label, start, end, step=None, tokens=0):
        """Record work done on ``lane`` between two perf_counter() times (host readings, or CUDA events
        put on the host's clock: ``lane.span_clock``)."""
        span = Span(lane.label, SpanKind(kind), label, start - self.t0, end - self.t0, step, tokens)
        with self._lock:
            self.lanes.setdefault(lane.label, lane.name)
            self.spans.append(span)

    def add_gpu_sample(self, device: str, now: float, percent: float):
        """Record an NVML utilisation reading taken at perf_counter() time ``now``."""
        with self._lock:
            self.gpu_samples.append(GpuSample(device, now - self.t0, percent))

    def add_step(self, step: Step):
        self.steps.append(step)

    # -- views ---------------------------------------------------------------------------------
    def spans_frame(self) -> pd.DataFrame:
        columns = [f for f in Span.__dataclass_fields__]
        df = pd.DataFrame([asdict(s) for s in self.spans], columns=columns)
        df["duration"] = df["end"] - df["start"]
        return df.sort_values("start", ignore_index=True)

    def steps_frame(self) -> pd.DataFrame:
        return pd.DataFrame([s.columns() for s in self.steps])

    def step_costs(self) -> pd.DataFrame:
        """One row per decoding step: its kind (``Step.kind``), wall ms, committed tokens and idle ms.
        A step runs from its first span's start to the next step's first span (so the host's gaps
        between steps count); the last one to its own last span. Idle: the part of that time when no
        lane worked on the step, which is the host's own (choosing, launching, reading): with CUDA-
        event spans, what graphs and a rendezvous on the device would leave to win."""
        spans: dict[int, list[Span]] = {}
        for s in self.spans:
            if s.step:  # step 0 is the prefill
                spans.setdefault(s.step, []).append(s)
        starts = {index: min(s.start for s in group) for index, group in spans.items()}
        order = sorted(starts)
        following = dict(zip(order, order[1:]))
        rows = []
        for step in self.steps:
            if step.index in spans:
                start = starts[step.index]
                end = (starts[following[step.index]] if step.index in following
                       else max(s.end for s in spans[step.index]))
                busy = _covered(spans[step.index], start, end)
                rows.append(dict(kind=step.kind, ms=1000 * (end - start), tokens=len(step.committed),
                                 idle=1000 * (end - start - busy)))
        return pd.DataFrame(rows, columns=["kind", "ms", "tokens", "idle"])

    def busy_seconds(self) -> dict[str, float]:
        """Time each lane spent working (spans on one lane never overlap: one worker each)."""
        busy: dict[str, float] = {}
        for s in self.spans:  # plain Python: this runs after every decoding step
            busy[s.lane] = busy.get(s.lane, 0.0) + s.duration
        return busy

    def lane_label(self, name: str) -> str | None:
        """The label of the lane named ``name`` ("target" or "draft"), if it did any work."""
        return next((label for label, lane in self.lanes.items() if lane == name), None)

    def overlap_seconds(self, lane_a: str, lane_b: str) -> float:
        """Time during which both lanes were working (their spans intersect)."""
        a = sorted((s.start, s.end) for s in self.spans if s.lane == lane_a)
        b = sorted((s.start, s.end) for s in self.spans if s.lane == lane_b)
        total, i, j = 0.0, 0, 0
        while i < len(a) and j < len(b):
            total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return total

    # -- export --------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dict(method=self.method, meta=self.meta, lanes=self.lanes,
                    spans=[asdict(s) for s in self.spans], steps=[asdict(s) for s in self.steps],
                    gpu_samples=[asdict(g) for g in self.gpu_samples])

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict) -> "Trace":
        trace = cls(data["method"], data.get("meta"))
        trace.lanes = dict(data.get("lanes", {}))
        trace.spans = [Span(**{**s, "kind": SpanKind(s["kind"])}) for s in data.get("spans", [])]
        trace.steps = [Step.from_dict(s) for s in data.get("steps", [])]
        trace.gpu_samples = [GpuSample(**g) for g in data.get("gpu_samples", [])]
        return trace

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        return cls.from_dict(json.loads(text))

    def to_chrome_trace(self) -> dict:
        """Chrome trace-event JSON for Perfetto: "X" events, one tid per lane, microseconds; NVML
        readings (when any) as "C" counter events."""
        tids = {lane: i + 1 for i, lane in enumerate(self.lanes)}
        events = [dict(name="process_name", ph="M", pid=1, tid=0, args=dict(name=f"mirror-sd: {self.method}"))]
        events += [dict(name="thread_name", ph="M", pid=1, tid=tid, args=dict(name=lane))
                   for lane, tid in tids.items()]
        for s in self.spans:
            events.append(dict(name=s.label or s.kind, cat=s.kind, ph="X", pid=1, tid=tids[s.lane],
                               ts=round(s.start * 1e6, 3), dur=round(s.duration * 1e6, 3),
                               args=dict(step=s.step, kind=s.kind, tokens=s.tokens)))
        events += [dict(name=f"{g.device} busy (NVML)", ph="C", pid=1, ts=round(g.t * 1e6, 3),
                        args=dict(percent=g.percent)) for g in self.gpu_samples]
        return dict(traceEvents=events, displayTimeUnit="ms")
