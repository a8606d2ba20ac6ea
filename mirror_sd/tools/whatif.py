"""What if this run ran on other hardware? Re-time a recorded trace on a hardware profile.

A trace records what every step did: the window or tree the target verified, how many draft
forwards made it, Mirror-SD's branches and whether one hit. None of that depends on the hardware
(at temperature 0 the tokens are vanilla's everywhere). What does depend on it is how long each
piece of work takes. This module prices each step's work on a :class:`Profile` (per-stage cost as
a function of width) and lays it out with each method's schedule:

  vanilla  T_t(1)
  sd       sum of the draft's forwards T_d(w_i) + T_t(gamma + 1)    (a tree: T_d(1) + (gamma - 1) T_d(branching) + T_tree(nodes + 1))
  eagle    T_head(pending) + (depth - 1) T_level(top_k) + T_tree(nodes + 1)
  ss       T_stream_draft(gamma) + T_tree(nodes + 1)    (one_forward=1: T_tree(nodes + 1) + T_streams(stream rows))
  mirror   [fallback draft on a miss] + T_prefix + T_rv + max(T_suffix, T_rollouts) + T_rv
           (T_rollouts: T_d(window + branches) + (gamma - 1) T_d(branches), or with tree windows
           (gamma - 1) T_d(branches x branching); a tree window's fallback draft as sd's tree;
           a window from the last step's correction rollout: only what of its gamma T_d(1) outlasts
           the host's turn between the steps, since it starts at that step's picks)

(T_level: a level of EAGLE's tree draft after the first; T_stream_draft: the streams' whole draft.
A profile without their own costs prices them as T_head and T_streams: the forwards alone, as the
host runs them between its own operations. On CUDA graphs each draft is one stage, with the tree's
top-k and bookkeeping inside it, and gpu-check gives them costs of their own. That stage holds 64
pending pairs at most: a long prompt's others go through the head eagerly first, T_head_eager.)

(T_prefix and T_suffix are the profile's at the exit depth it was measured at, ``split``; a run
that exits at another depth, as a share of its layers, moves layers from one to the other.)

(``max`` where the devices overlap fully; ``overlap`` in 0..1 hides that share of the shorter
work.) A stage's cost is its price at an empty cache; a call that attends a context (the prompt and
the tokens committed before its step) adds the profile's ``context_ms`` for its stage per 100
slots, so vanilla, whose many steps attend the same growing context, pays it too. The host adds
``step_ms`` per step and ``phase_ms`` per phase (each line of work above, which it launches and
waits for): on a GPU that runs CUDA graphs the host's turns are what the spans leave idle, and a
method of more phases per step waits on it more often. The result is a
:class:`~mirror_sd.trace.Trace` of the same shape: the same steps and tokens, only the spans
moved, marked ``meta["modelled"] = True``. It is a model, not a measurement: every figure drawn
from it must say so.

Profiles are small JSON files (``mirror_sd/tools/profiles/*.json``), each with its ``source``:
per-stage costs by width (``stages``), the context's cost per call (``context_ms``), the devices'
overlap and the host's time;
:func:`fit_profile` fits one for this machine from measured spans, and :func:`held_out_check`
tests it on prompts it was not fitted on.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..devices import LaneLabel
from ..errors import MirrorSDError
from ..models.stages import BUCKETS, MAX_WIDTH, cheapest_bucket
from ..trace import DraftWork, Rendezvous, Span, SpanKind, Step, Trace

PROFILES_DIR = Path(__file__).parent / "profiles"
STAGES = {  # stage -> what one call of it is; its cost is priced per call, by the call's width in tokens
    "target": "a full target forward over `width` tokens (decode, verify)",
    "target_tree": "a full target forward over a tree of `width` tokens under a tree mask (EAGLE's and ss's verify)",
    "prefill": "the target's forward over the prompt",
    "target_prefix": "Mirror-SD: target layers up to the early exit, plus the exit head",
    "target_suffix": "Mirror-SD: the target's remaining layers and its LM head",
    "draft": "one draft forward over `width` tokens (a window token, or a batch of branches)",
    "draft_prefill": "the draft's forward over the prompt",
    "eagle_head": "one EAGLE head step over `width` tokens (tree frontier)",
    "eagle_head_eager": "EAGLE on stages: the head over the `width` pending pairs past the stage's widest window "
                        "(a long prompt's), run eagerly before it",
    "eagle_level": "EAGLE: a level of its tree draft after the first (the head over the `width`-node frontier, "
                   "then the next frontier's top-k)",
    "streams": "Speculative Streaming: a pass of `width` stream rows through the top layers",
    "stream_draft": "Speculative Streaming: the whole draft of `width` stream levels (the streams' pass, then the "
                    "tree's pick)",
}
DRAFT_STAGES = ("draft", "draft_prefill")  # run on the draft device: scaled by its speed
EAGER_STAGES = ("eagle_head_eager",)  # run outside the captured stages: priced on their line, never bucketed
# A profile without a stage's own cost prices it as another: a tree under a mask as a window as wide
# (on a GPU the attention mask costs next to nothing; on a CPU it takes another kernel, so fitted
# profiles have their own); a draft's level or whole draft as its forwards alone (on CUDA graphs the
# draft is one stage with its picks inside, which gpu-check times: ``bench_stages``); the head's eager
# pairs as the head's own stage.
STAND_INS = {"target_tree": "target", "eagle_level": "eagle_head", "stream_draft": "streams",
             "eagle_head_eager": "eagle_head"}


# -- costs and profiles ------------------------------------------------------------------------
@dataclass(frozen=True)
class Cost:
    """Milliseconds of one call of a stage as a function of its width (tokens in the forward):
    piecewise-linear through ``points`` (width, ms), straight on past both ends, never below 0."""

    points: tuple[tuple[float, float], ...]

    def __call__(self, width: float) -> float:
        (w0, m0), (w1, m1) = self._segment(width)
        slope = (m1 - m0) / (w1 - w0) if w1 != w0 else 0.0
        return max(0.0, m0 + slope * (width - w0))

    def _segment(self, width: float):
        p = self.points
        if len(p) == 1:
            return p[0], p[0]
        i = next((i for i in range(1, len(p) - 1) if width < p[i][0]), len(p) - 1)
        return p[i - 1], p[i]

    @classmethod
    def line(cls, a: float, b: float) -> "Cost":
        """a + b * width (ms)."""
        return cls(((0.0, float(a)), (1.0, float(a + b))))

    def scaled(self, k: float) -> "Cost":
        return Cost(tuple((w, k * ms) for w, ms in self.points))

    def to_json(self) -> dict:
        if len(self.points) == 2 and self.points[0][0] == 0 and self.points[1][0] == 1:  # a line
            a, b = self.points[0][1], self.points[1][1] - self.points[0][1]
            return {"ms": round(a, 6), "ms_per_token": round(b, 6)}
        return {"ms_by_width": {_num(w): round(ms, 6) for w, ms in self.points}}

    @classmethod
    def from_json(cls, value, where: str) -> "Cost":
        """``{"ms_by_width": {"1": 1.36, "8": 1.70}}`` or ``{"ms": a, "ms_per_token": b}``."""
        if isinstance(value, dict) and "ms_by_width" in value and isinstance(value["ms_by_width"], dict):
            try:
                points = sorted((float(w), float(ms)) for w, ms in value["ms_by_width"].items())
            except (TypeError, ValueError):
                raise MirrorSDError(f"{where}: ms_by_width needs numbers, width -> ms") from None
            if points and all(ms >= 0 for _, ms in points) and len({w for w, _ in points}) == len(points):
                return cls(tuple(points))
        elif isinstance(value, dict) and _is_number(value.get("ms")) and _is_number(value.get("ms_per_token", 0)):
            if value["ms"] >= 0:
                return cls.line(float(value["ms"]), float(value.get("ms_per_token", 0)))
        raise MirrorSDError(f"{where}: a cost is {{\"ms_by_width\": {{width: ms, ...}}}} (distinct widths, ms >= 0) "
                            f"or {{\"ms\": a, \"ms_per_token\": b}}, got {json.dumps(value)[:80]}")


def bucketed_ms(cost: Cost, width: float) -> float:
    """The cost of a call of ``width`` tokens on fixed-width stages whose replays ``cost`` measured at
    each bucket: the engine runs it at the cheapest measured bucket that holds it (models/stages.py:
    ``cheapest_bucket``). Wider than the widest stage (a prefill), it runs as chunks of that width
    and a last chunk of the rest (models/forwards.py), each priced so. At a bucket not measured
    (or, wider, where the widest was not): the line through the points."""
    replay = {int(w): ms for w, ms in cost.points if float(w).is_integer() and int(w) in BUCKETS}
    if width > MAX_WIDTH and MAX_WIDTH in replay:
        full, rest = divmod(math.ceil(width), MAX_WIDTH)
        return full * replay[MAX_WIDTH] + (bucketed_ms(cost, rest) if rest else 0.0)
    if not 0 < width <= MAX_WIDTH:
        return cost(width)
    return replay.get(cheapest_bucket(math.ceil(width), replay), cost(width))


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _num(w: float) -> str:
    return str(int(w)) if float(w).is_integer() else str(w)


@dataclass(frozen=True)
class Profile:
    """Per-stage costs for a target device and a draft device, and how they work together."""

    name: str
    source: str  # where the figures come from: a measurement, a fit, an assumption
    devices: dict  # role ("target", "draft") -> the device it names, e.g. "H100 (graph, fp32)"
    stages: dict  # stage (STAGES) -> Cost
    rendezvous_ms: float = 0.0  # the target checks the window and matches a branch (per step)
    channel_ms: float = 0.0  # the token channel: early-exit candidates sent to the draft device (per step)
    overlap: float = 1.0  # share of the shorter of two side-by-side works hidden under the longer (1: max, 0: sum)
    draft_speed: float = 1.0  # the draft device's speed relative to the draft figures in ``stages``
    step_ms: float = 0.0  # host work per decoding step outside any span
    phase_ms: float = 0.0  # host work per phase of a step (launching its work, waiting for it), outside spans
    notes: str = ""  # what the profile assumes, for the screen
    # The stages' widths are CUDA-graph buckets (gpu-check's replays): a call of up to 64 tokens costs
    # what the bucket the engine routes it to costs (``bucketed_ms``), not a line between two buckets.
    buckets: bool = False
    # (exit layer, target layers) where target_prefix and target_suffix were measured: a run that
    # exits at another depth moves layers between them (``cost``'s ``depth``). None: the profile's
    # split stands whatever the run's (the paper profiles: the paper's exit on a model of its own).
    split: tuple[int, int] | None = None
    # stage -> ms a call of it adds per 100 slots it attends before its window (``Work.context``): the
    # stages' costs are their price at an empty cache, as a CUDA-graph replay measures them (its rows
    # attend only their own scratch slots). A stage not named adds nothing.
    context_ms: dict = field(default_factory=dict)

    def retime(self, trace: Trace) -> Trace:
        """``trace`` re-timed on this profile (``retime``)."""
        return retime(trace, self)

    @property
    def one_cpu(self) -> bool:
        """Whether both lanes are cores of one CPU (the engine then prefills the models in turn)."""
        return all(str(self.devices.get(role, "")).startswith("cpu") for role in ("target", "draft"))

    def cost(self, stage: str, width: float, threads: int | None = None, depth: float | None = None,
             context: float = 0) -> float:
        """Milliseconds of one call of ``stage`` over ``width`` tokens on this profile; on a lane
        with ``threads`` CPU threads, the stage's cost for that many (``"draft@1"``) where it has one,
        and where it has only such costs and no count is given, the one with the most threads (a
        lane with the machine to itself, as vanilla's). ``depth``: the run's exit layer over its
        target's layers, for Mirror-SD's prefix and suffix (``moved_layers_ms``). ``context``: the
        slots the call attends before its window (``context_cost``)."""
        ms = self._stage_ms(stage, width, threads)
        if stage in ("target_prefix", "target_suffix") and depth is not None and self.split:
            moved = self.moved_layers_ms(width, threads, depth)
            ms = max(0.0, ms + moved if stage == "target_prefix" else ms - moved)
        return ms + self.context_cost(stage, context)

    def context_cost(self, stage: str, context: float) -> float:
        """What a call of ``stage`` adds for the ``context`` slots it attends before its window:
        ``context_ms`` per 100 slots, the stage's own or, where the profile prices the stage as its
        stand-in (``STAND_INS``), the stand-in's; on the draft device at its speed."""
        stage = self.priced_as(stage.split("@")[0])
        ms = self.context_ms.get(stage, 0.0) * context / 100
        return ms / self.draft_speed if stage in DRAFT_STAGES else ms

    def moved_layers_ms(self, width: float, threads: int | None, depth: float) -> float:
        """What the layers between the profile's exit and one at ``depth`` (a share of the layers)
        cost over ``width`` tokens, negative for an earlier exit: a target layer costs what the full
        forward costs beyond the suffix, over the prefix's layers (target = prefix layers + suffix)."""
        exit_layer, layers = self.split
        per_layer = max(0.0, self._stage_ms("target", width, threads)
                        - self._stage_ms("target_suffix", width, threads)) / exit_layer
        return (depth * layers - exit_layer) * per_layer

    def priced_as(self, stage: str) -> str:
        """The stage whose figures price ``stage`` here: its own, or its stand-in (``STAND_INS``) where
        the profile has none of its own."""
        if stage in STAND_INS and not any(k.split("@")[0] == stage for k in self.stages):
            return STAND_INS[stage]
        return stage

    def _stage_ms(self, stage: str, width: float, threads: int | None = None) -> float:
        stage = self.priced_as(stage)
        counts = sorted(int(k.split("@")[1]) for k in self.stages if k.startswith(f"{stage}@"))
        keyed = f"{stage}@{threads}" if threads in counts else stage
        if keyed not in self.stages and counts:
            keyed = f"{stage}@{counts[-1]}"
        if keyed not in self.stages:
            raise MirrorSDError(f"profile {self.name!r} has no cost for stage {stage!r}")
        bucketed = self.buckets and stage not in EAGER_STAGES
        ms = bucketed_ms(self.stages[keyed], width) if bucketed else self.stages[keyed](width)
        return ms / self.draft_speed if stage in DRAFT_STAGES else ms

    def with_draft_speed(self, speed: float) -> "Profile":
        """The same profile with the draft device ``speed`` times as fast as its figures."""
        if not speed > 0:
            raise MirrorSDError(f"draft speed must be above 0, got {speed}")
        return replace(self, draft_speed=float(speed))

    def draft_ratio(self) -> float:
        """One draft forward over one token / one target forward over one token, on this profile."""
        return self.cost("draft", 1) / self.cost("target", 1)

    def with_draft_ratio(self, ratio: float) -> "Profile":
        """The draft (and the EAGLE head) made ``ratio`` times a one-token target forward, width for width
        in proportion: the x axis of the tradeoff curve. The draft's prefill, an EAGLE level and the
        head's eager pairs keep their proportion to the draft and to the head, and so does what the
        context adds to each (``context_ms``)."""
        target = self.cost("target", 1)
        stages, context = dict(self.stages), dict(self.context_ms)
        for stage, like in (("draft", "draft"), ("draft_prefill", "draft"), ("eagle_head", "eagle_head"),
                            ("eagle_level", "eagle_head"), ("eagle_head_eager", "eagle_head")):
            now = self.cost(like, 1) if any(k.split("@")[0] == like for k in stages) else 0.0
            scale = ratio * target / now if now > 0 else 0.0
            for key in [k for k in stages if k.split("@")[0] == stage]:  # a fitted CPU's per-thread costs too
                stages[key] = stages[key].scaled(scale)
            if stage in context:
                context[stage] *= scale
        return replace(self, stages=stages, context_ms=context)

    def to_json(self) -> dict:
        return dict(name=self.name, source=self.source, devices=self.devices, notes=self.notes,
                    rendezvous_ms=self.rendezvous_ms, channel_ms=self.channel_ms, overlap=self.overlap,
                    draft_speed=self.draft_speed, step_ms=self.step_ms, phase_ms=self.phase_ms,
                    **(dict(buckets=True) if self.buckets else {}),
                    **(dict(split=dict(exit_layer=self.split[0], layers=self.split[1])) if self.split else {}),
                    **(dict(context_ms=dict(self.context_ms)) if self.context_ms else {}),
                    stages={s: c.to_json() for s, c in self.stages.items()})

    @classmethod
    def from_json(cls, data, where: str = "profile") -> "Profile":
        """A profile from its JSON object; a malformed one raises one MirrorSDError that says what is wrong."""
        if not isinstance(data, dict):
            raise MirrorSDError(f"{where}: a profile is a JSON object, got {type(data).__name__}")
        for key in ("name", "source"):
            if not isinstance(data.get(key), str) or not data[key].strip():
                raise MirrorSDError(f"{where}: needs a non-empty {key!r} (a string)")
        stages = data.get("stages")
        if not isinstance(stages, dict) or "target" not in stages:
            raise MirrorSDError(f"{where}: needs \"stages\", an object with at least a \"target\" cost")
        unknown = sorted(s for s in stages if s.split("@")[0] not in STAGES
                         or ("@" in s and not s.split("@", 1)[1].isdigit()))
        if unknown:
            raise MirrorSDError(f"{where}: unknown stage {unknown[0]!r} (stages: {', '.join(STAGES)})")
        costs = {s: Cost.from_json(v, f"{where}: stage {s!r}") for s, v in stages.items()}
        costs.setdefault("prefill", costs["target"])  # the prompt through the same forward
        if "draft" in costs:
            costs.setdefault("draft_prefill", costs["draft"])
        numbers = {}
        for key, default, low, high in (("rendezvous_ms", 0.0, 0, None), ("channel_ms", 0.0, 0, None),
                                        ("overlap", 1.0, 0, 1), ("draft_speed", 1.0, 1e-9, None),
                                        ("step_ms", 0.0, 0, None), ("phase_ms", 0.0, 0, None)):
            value = data.get(key, default)
            value = {True: 1.0, False: 0.0}.get(value, value) if key == "overlap" else value
            if not _is_number(value) or value < low or (high is not None and value > high):
                bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
                raise MirrorSDError(f"{where}: {key!r} must be a number {bounds}, got {json.dumps(value)}")
            numbers[key] = float(value)
        devices = data.get("devices", {})
        if not isinstance(devices, dict) or not all(isinstance(v, str) for v in devices.values()):
            raise MirrorSDError(f"{where}: \"devices\" maps a role (target, draft) to a device name")
        if not isinstance(data.get("buckets", False), bool):
            raise MirrorSDError(f"{where}: \"buckets\" is true or false, got {json.dumps(data['buckets'])}")
        return cls(name=data["name"], source=data["source"], devices=dict(devices), stages=costs,
                   notes=str(data.get("notes", "")), buckets=data.get("buckets", False),
                   split=_split_from_json(data.get("split"), where),
                   context_ms=_context_from_json(data.get("context_ms"), where), **numbers)


def _split_from_json(value, where: str) -> tuple[int, int] | None:
    """``{"exit_layer": 22, "layers": 30}`` -> (22, 30); absent -> None."""
    if value is None:
        return None
    if isinstance(value, dict) and all(isinstance(value.get(k), int) and not isinstance(value.get(k), bool)
                                       for k in ("exit_layer", "layers")) \
            and 0 < value["exit_layer"] < value["layers"]:
        return value["exit_layer"], value["layers"]
    raise MirrorSDError(f"{where}: \"split\" is {{\"exit_layer\": e, \"layers\": n}} with 0 < e < n, "
                        f"got {json.dumps(value)[:80]}")


def _context_from_json(value, where: str) -> dict:
    """``{"target": 0.22, ...}`` (stage -> ms per call per 100 slots, each at least 0) -> the same
    dict of floats; absent -> {}."""
    if value is None:
        return {}
    if isinstance(value, dict) and all(s in STAGES and _is_number(ms) and ms >= 0 for s, ms in value.items()):
        return {s: float(ms) for s, ms in value.items()}
    raise MirrorSDError(f"{where}: \"context_ms\" maps a stage ({', '.join(STAGES)}) to ms per call per 100 "
                        f"slots of context (a number >= 0), got {json.dumps(value)[:80]}")


def profile_names() -> list[str]:
    """The profiles that ship in mirror_sd/tools/profiles/."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """A shipped profile by name, or a profile JSON file by path."""
    path = Path(name_or_path)
    if not path.suffix == ".json":
        path = PROFILES_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise MirrorSDError(f"unknown profile {str(name_or_path)!r}: choose from {', '.join(profile_names())}, "
                                f"or give a profile's .json path")
    if not path.is_file():
        raise MirrorSDError(f"profile file {path} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MirrorSDError(f"profile {path}: not readable JSON ({e})") from None
    return Profile.from_json(data, f"profile {path.name}")


# -- what each step did: work items --------------------------------------------------------------
@dataclass
class Work:
    """One span of work: on a lane, of an engine span kind, priced as calls of stages."""

    lane: str  # "target" or "draft"
    kind: SpanKind  # the span kind the engine records for it
    label: str
    calls: list[tuple[str, int]] = field(default_factory=list)  # (stage, width) per forward
    fixed: str | None = None  # a profile constant instead of calls: "rendezvous_ms" or "channel_ms"
    tokens: int = 0
    threads: int | None = None  # CPU threads of the lane that ran it (trace.meta["threads"]), where recorded
    depth: float | None = None  # Mirror-SD's prefix and suffix: the run's exit layer over its target's layers
    context: int = 0  # slots its forwards attend before their window (``step_contexts``)

    def ms(self, profile: Profile) -> float:
        if self.fixed:
            return getattr(profile, self.fixed)
        return sum(profile.cost(stage, width, self.threads, self.depth, self.context) for stage, width in self.calls)


Phase = tuple  # Work items that run at the same time, one per lane


def prefill_plan(trace: Trace, together: bool = False) -> list[Phase]:
    """Step 0: the prompt through the target and (two-model methods) through the draft: side by side
    with ``together`` (lanes that are devices of their own, ``methods/prefill.py``), else in turn."""
    n = int(trace.meta.get("prompt_tokens")
            or next((s.tokens for s in trace.spans if s.kind == SpanKind.PREFILL), 1))
    target = Work("target", SpanKind.PREFILL, f"prefill {n} tokens", [("prefill", n)], tokens=n)
    if not (trace.lane_label("draft") and n > 1):
        return [(target,)]
    draft = Work("draft", SpanKind.PREFILL, f"prefill {n} tokens", [("draft_prefill", n - 1)], tokens=n - 1)
    return [(target, draft)] if together else [(target,), (draft,)]


def vanilla_plan(step: Step, previous: Step, options: dict, meta: dict) -> list[Phase]:
    return [(Work("target", SpanKind.DECODE, "decode 1 token", [("target", 1)], tokens=1),)]


def draft_calls(work) -> list[tuple[str, int]]:
    """The draft forwards that made an sd window (``DraftWork``): width 1 each, or, where each
    forward checked its streams' lookahead, 1 + the lookahead tokens it checked."""
    if work.lookahead:
        return [("draft", 1 + checked) for checked, _ in work.lookahead]
    return [("draft", 1)] * work.forwards


def tree_draft_calls(options: dict) -> list[tuple[str, int]]:
    """The draft forwards that grow a draft tree (``drafting/token_by_token.py``: draft_tree): the
    root's, then gamma - 1 levels of ``branching`` frontier nodes."""
    return [("draft", 1)] + [("draft", options.get("branching", 4))] * (options.get("gamma", 2) - 1)


def fresh_draft_calls(options: dict, trees: bool) -> list[tuple[str, int]]:
    """Mirror-SD's fresh draft of a window after a miss: a tree's levels (``tree_draft_calls``), one
    forward with the draft's streams, or gamma forwards token by token."""
    if trees:
        return tree_draft_calls(options)
    return [("draft", 1)] * (1 if options.get("streams") else options.get("gamma", 2))


def sd_plan(step: Step, previous: Step, options: dict, meta: dict) -> list[Phase]:
    window = len(step.proposed) + 1
    calls, verify = (draft_calls(step.draft), "target") if step.tree is None else (tree_draft_calls(options),
                                                                                  "target_tree")
    return [(Work("draft", SpanKind.DRAFT, f"draft {len(step.proposed)} tokens", calls, tokens=len(step.proposed)),),
            (Work("target", SpanKind.VERIFY, f"verify {window} tokens", [(verify, window)], tokens=window),)]


def eagle_plan(step: Step, previous: Step, options: dict, meta: dict) -> list[Phase]:
    """The head reads the pending (feature, token) pairs (the whole prompt's at step 1, then the
    last step's tokens), then expands ``depth - 1`` levels of ``top_k`` frontier nodes (a sampled
    chain at T > 0: one node per level); one verify forward. A greedy draft on stages is one stage
    of at most MAX_WIDTH pairs: the pairs before them (a long prompt's) go through the head eagerly
    first (methods/eagle.py: ``draft_on_stage``), ``eagle_head_eager``."""
    depth, top_k = options.get("depth", 3), options.get("top_k", 4)
    greedy = meta.get("temperature", 0.0) == 0
    frontier = top_k if greedy else 1
    pending = int(meta.get("prompt_tokens", 1)) if previous.index == 0 else len(previous.committed)
    window = len(step.tree.tokens) + 1
    eager = pending - MAX_WIDTH if greedy and on_stages(meta) and pending > MAX_WIDTH else 0
    head = [("eagle_head_eager", eager)] if eager else []
    head += [("eagle_head", pending - eager)] + [("eagle_level", frontier)] * (depth - 1)
    return [(Work("target", SpanKind.DRAFT, f"draft tree, depth {depth}", head, tokens=pending),),
            (Work("target", SpanKind.VERIFY, f"verify {window} tokens", [("target_tree", window)], tokens=window),)]


def on_stages(meta: dict) -> bool:
    """Whether a run's methods ran on fixed-shape stages (models/stages.py): graphs "on", or "auto"
    on a CUDA target lane."""
    graphs = meta.get("graphs")
    return graphs == "on" or (graphs == "auto" and "cuda" in str(meta.get("target_lane", "")))


def ss_plan(step: Step, previous: Step, options: dict, meta: dict) -> list[Phase]:
    """The streams' draft of gamma levels, then one verify forward; with ``one_forward`` the
    stream rows run in the verify step instead."""
    gamma, window = options.get("gamma", 4), len(step.tree.tokens) + 1
    verify = [("target_tree", window)]
    if options.get("one_forward"):
        draft, verify = [], verify + [("streams", step.tree.stream_rows)]
    else:
        draft = [("stream_draft", gamma)]
    return [(Work("target", SpanKind.DRAFT, f"streams: draft {gamma} levels", draft, tokens=gamma),),
            (Work("target", SpanKind.VERIFY, f"verify {window} tokens", verify, tokens=window),)]


def mirror_plan(step: Step, previous: Step, options: dict, meta: dict) -> list[Phase]:
    """[a fresh draft after a miss] -> target prefix + early exit -> token channel -> target suffix
    beside the branch rollouts -> rendezvous. A copied window needs no draft; a window from the last
    step's correction rollout comes from the same draft forwards as a fresh draft, run from that
    step's picks, during the host's turn between the steps (``in_host_turn``). A correction that no
    step used (the step hit, or copied its window) ran on the draft's device during the host's turn
    too, off the critical path: it costs no time here and is not drawn."""
    rv, gamma = step.rendezvous, options.get("gamma", 2)
    window = len(step.proposed) + 1
    branches, trees = len(rv.branches), step.tree is not None  # trees: mirror's tree windows
    plan = []
    if rv.fallback or rv.corrected:
        fresh = fresh_draft_calls(options, trees)
        kind = SpanKind.FALLBACK_DRAFT if rv.fallback else SpanKind.CORRECTION_ROLLOUT
        plan.append((Work("draft", kind, f"{kind.replace('-', ' ')} {gamma} tokens", fresh, tokens=gamma),))
    depth = exit_depth(meta)
    plan.append((Work("target", SpanKind.TARGET_PREFIX, f"target prefix, {window} tokens", [("target_prefix", window)],
                      tokens=window, depth=depth),))
    plan.append((Work("target", SpanKind.RENDEZVOUS, "token channel", fixed="channel_ms"),))
    forwards = 1 if options.get("streams") else gamma
    per_level = branches * options.get("branching", 4) if trees else branches  # rows of each forward after the first
    rollout = [("draft", window + branches)] + [("draft", per_level)] * (forwards - 1)  # tree layout, then branches
    plan.append((Work("target", SpanKind.TARGET_SUFFIX, f"target suffix, {window} tokens", [("target_suffix", window)],
                      tokens=window, depth=depth),
                 Work("draft", SpanKind.DRAFT_ROLLOUT, f"{branches} branches x {gamma} tokens", rollout,
                      tokens=branches * gamma)))
    plan.append((Work("target", SpanKind.RENDEZVOUS, "verify + match branch", fixed="rendezvous_ms"),))
    return plan


def run_exit(meta: dict) -> tuple[int, int] | None:
    """A Mirror-SD run's (exit layer, target layers): its option, or the default exit, from its
    trace's meta; None where the meta does not say how many layers the target has."""
    from ..methods.mirror import default_exit_layer

    layers = meta.get("target_layers")
    if not layers:
        return None
    return meta.get("options", {}).get("exit_layer") or default_exit_layer(layers), layers


def exit_depth(meta: dict) -> float | None:
    """A Mirror-SD run's exit layer over its target's layers (``run_exit``), or None."""
    exit = run_exit(meta)
    return exit[0] / exit[1] if exit else None


CORRECTION = SpanKind.CORRECTION_ROLLOUT


def in_host_turn(phase: Phase) -> bool:
    """Whether a phase is a correction rollout, which the last step launched at its picks
    (methods/mirror.py: ``roll_out_correction``): it runs while the host takes its turn between the steps, and the
    host launches nothing for it."""
    return phase[0].kind == CORRECTION


def corrects(trace: Trace) -> bool:
    """Whether the run's misses took their next windows from correction rollouts."""
    return any(s.rendezvous is not None and s.rendezvous.corrected for s in trace.steps)


PLANS = {"vanilla": vanilla_plan, "sd": sd_plan, "eagle": eagle_plan, "ss": ss_plan, "mirror": mirror_plan}


def step_contexts(trace: Trace) -> list[int]:
    """Each step's context: the slots its forwards attend before their window, which are the prompt
    and every token committed before the step but the last (the window's first); 0 for the prefill.
    A trace that does not say how long its prompt was (no ``prompt_tokens``) counts the prompt as 0."""
    prompt, before, contexts = int(trace.meta.get("prompt_tokens") or 0), 0, []
    for index, step in enumerate(trace.steps):
        contexts.append(max(0, prompt + before - 1) if index else 0)
        before += len(step.committed)
    return contexts


def step_plans(trace: Trace, together: bool = False) -> list[list[Phase]]:
    """Each step's work, prefill first (``prefill_plan``'s ``together``), in the order the method's
    schedule runs it, each work at its step's context (``step_contexts``)."""
    if trace.method not in PLANS:
        raise MirrorSDError(f"no latency model for method {trace.method!r} (models: {', '.join(PLANS)})")
    plan, options = PLANS[trace.method], trace.meta.get("options", {})
    plans = [prefill_plan(trace, together)]
    for previous, step in zip(trace.steps, trace.steps[1:]):
        plans.append(plan(step, previous, options, trace.meta))
    threads = trace.meta.get("threads", {})
    for plan, context in zip(plans, step_contexts(trace)):
        for work in (w for phase in plan for w in phase):
            work.threads, work.context = threads.get(work.lane), context
    return plans


# -- laying the work out in time -----------------------------------------------------------------
def side_by_side(durations: list[float], overlap: float) -> list[float]:
    """How long works started together take when they share the hardware: the longest one is
    stretched by the part of the shorter one that is not hidden (``1 - overlap`` of it)."""
    if len(durations) < 2:
        return list(durations)
    longest = durations.index(max(durations))
    exposed = (1 - overlap) * min(durations)
    return [d + exposed if i == longest else d for i, d in enumerate(durations)]


def phase_ms(phase: Phase, profile: Profile) -> list[float]:
    """Milliseconds of each work of a phase, as laid out (``side_by_side`` when two run together)."""
    return side_by_side([w.ms(profile) for w in phase], profile.overlap)


def step_ms(plan: list[Phase], profile: Profile, host: bool = True) -> float:
    """A step's critical path: its phases one after the other, each the host's turn (``phase_ms``;
    not for the prefill, ``host=False``, which measured runs start with) and then as long as its
    longest work; a correction rollout (``in_host_turn``) only for what of it outlasts the host's
    turn between the steps (``profile.step_ms``, which the callers add)."""
    return sum(launch + own for _, launch, own in critical_path(plan, profile, host))


def critical_path(plan: list[Phase], profile: Profile, host: bool = True):
    """Each phase of a step as ``step_ms`` counts it: (phase, the host's turn to launch it, its own
    time: its longest work, or for a correction rollout what of it outlasts the host's turn between
    the steps)."""
    turn = profile.phase_ms if host else 0.0
    for phase in plan:
        longest = max(phase_ms(phase, profile), default=0.0)
        if in_host_turn(phase):
            yield phase, 0.0, max(0.0, longest - profile.step_ms)
        else:
            yield phase, turn, longest


def retime(trace: Trace, profile: Profile | str) -> Trace:
    """``trace`` re-timed on ``profile``: the same steps and tokens, spans laid out by each
    method's schedule with the profile's costs; lanes renamed for the profile's devices."""
    profile = load_profile(profile) if isinstance(profile, (str, Path)) else profile
    out = Trace(trace.method, {**trace.meta, "modelled": True, "profile": profile.name,
                               "profile_source": profile.source, "measured_lanes": dict(trace.lanes)})
    out.steps = list(trace.steps)
    labels = {name: lane_label(name, profile) for name in ("target", "draft")}
    t = 0.0
    for index, plan in enumerate(step_plans(trace, together=not profile.one_cpu)):
        last_end = t
        t += profile.step_ms / 1000 if index else 0.0  # the host's work between two steps
        for phase in plan:
            if in_host_turn(phase):  # launched at the last step's picks: it ran during the host's turn
                start = last_end
            else:
                t += profile.phase_ms / 1000 if index else 0.0  # the host launches the phase's work
                start = t
            for work, ms in zip(phase, phase_ms(phase, profile)):
                if ms > 0 or work.calls:
                    out.lanes.setdefault(labels[work.lane], work.lane)
                    out.spans.append(Span(labels[work.lane], work.kind, work.label, start, start + ms / 1000, index,
                                          work.tokens))
            t = max(t, start + max(phase_ms(phase, profile), default=0.0) / 1000)
    out.meta["modelled_s"] = t
    return out


def lane_label(name: str, profile: Profile) -> str:
    role = {"target": "GPU role", "draft": "NPU role"}[name]
    return f"{name}, {role}, {profile.devices.get(name, profile.name)} (modelled)"


def modelled_seconds(trace: Trace, profile: Profile) -> float:
    """The whole run (prefill and every step) on ``profile``, in seconds."""
    prefill, *steps = step_plans(trace, together=not profile.one_cpu)
    return (step_ms(prefill, profile, host=False) + sum(step_ms(p, profile) for p in steps)
            + profile.step_ms * len(steps)) / 1000


def vanilla_step_ms(profile: Profile, context: float = 0) -> float:
    """A vanilla decoding step on ``profile``: one target forward over one token that attends
    ``context`` slots before it, and the host's turns (a step and a phase)."""
    return profile.cost("target", 1, context=context) + profile.step_ms + profile.phase_ms


def vanilla_seconds(prompt_tokens: int, new_tokens: int, profile: Profile) -> float:
    """Vanilla's run with the same prompt and answer length on ``profile``: one target forward per
    token after the prefill's, each attending the prompt and the tokens before it (``step_contexts``)."""
    steps = max(new_tokens - 1, 0)
    decode = sum(vanilla_step_ms(profile, prompt_tokens + i) for i in range(steps))
    return (profile.cost("prefill", prompt_tokens) + decode) / 1000


def summary(trace: Trace, profile: Profile) -> dict:
    """A run's modelled numbers on ``profile``: seconds in all and in decoding steps, and vanilla's
    seconds modelled on the same profile for the same prompt and number of tokens."""
    new_tokens = sum(len(s.committed) for s in trace.steps)
    seconds = modelled_seconds(trace, profile)
    prefill = step_ms(prefill_plan(trace, together=not profile.one_cpu), profile, host=False) / 1000
    return dict(method=trace.method, new_tokens=new_tokens, steps=max(len(trace.steps) - 1, 1), seconds=seconds,
                step_seconds=seconds - prefill,
                vanilla_seconds=vanilla_seconds(int(trace.meta.get("prompt_tokens", 1)), new_tokens, profile))


def table(traces: list[Trace], profile: Profile):
    """Per method over ``traces``: modelled ms per decoding step, tokens/s, and speedup over vanilla
    (vanilla modelled on the same profile for the same prompts and answer lengths)."""
    import pandas as pd

    per = pd.DataFrame([summary(t, profile) for t in traces]).groupby("method", sort=False).sum()
    return pd.DataFrame({"runs": pd.Series([t.method for t in traces]).value_counts(),
                         "step_ms": 1000 * per.step_seconds / per.steps,
                         "tokens_per_s": per.new_tokens / per.seconds,
                         "speedup": per.vanilla_seconds / per.seconds}).loc[[m for m in PLANS if m in per.index]] \
        .reset_index(names="method")


# -- this machine: a profile fitted from measured spans ------------------------------------------
def measured_work(traces: list[Trace]):
    """Every piece of planned work next to the span the engine measured for it: (Work, ms) pairs,
    matched by step, kind and lane in schedule order (the two prefills may start in either order
    where they run side by side). Steps whose spans do not match the plan are left out."""
    pairs = []
    for trace in traces:
        spans: dict[tuple, list[float]] = {}
        for s in sorted(trace.spans, key=lambda s: s.start):
            spans.setdefault((s.step, s.kind, trace.lanes.get(s.lane)), []).append(1000 * s.duration)
        for index, plan in enumerate(step_plans(trace)):
            works = [w for phase in plan for w in phase if w.fixed != "channel_ms"]
            seen: dict[tuple, int] = {}
            for w in works:
                i = seen[w.kind, w.lane] = seen.get((w.kind, w.lane), -1) + 1
                measured = spans.get((index, w.kind, w.lane), [])
                if i < len(measured):
                    pairs.append((w, measured[i]))
    return pairs


MAX_KNOTS = 8  # widths a fitted cost is pinned at, per stage


def knots_for(widths: set[int]) -> list[int]:
    """The widths a stage's fitted cost is pinned at: every width seen, or MAX_KNOTS of them spread
    over the seen widths by rank (the smallest and the largest always among them)."""
    seen = sorted(widths)
    if len(seen) <= MAX_KNOTS:
        return seen
    return sorted({seen[round(i * (len(seen) - 1) / (MAX_KNOTS - 1))] for i in range(MAX_KNOTS)})


def hat_weights(width: float, knots: list[int]) -> list[float]:
    """Weights on the knots that linear interpolation (straight on past the ends) gives ``width``."""
    if len(knots) == 1:
        return [1.0]
    i = next((i for i in range(1, len(knots) - 1) if width < knots[i]), len(knots) - 1)
    t = (width - knots[i - 1]) / (knots[i] - knots[i - 1])
    weights = [0.0] * len(knots)
    weights[i - 1], weights[i] = 1 - t, t
    return weights


def keyed_calls(pairs) -> list[list[tuple[str, int]]]:
    """Each span's calls, with a stage that ran on lanes of different CPU thread counts keyed by the
    count ("draft@1"): Mirror-SD's lanes split the cores between them, sd's take them all in turn."""
    threads: dict[str, set] = {}
    for work, _ in pairs:
        for stage, _ in work.calls:
            threads.setdefault(stage, set()).add(work.threads)
    split = {stage for stage, counts in threads.items() if len(counts) > 1}
    return [[(f"{stage}@{work.threads}" if stage in split else stage, width) for stage, width in work.calls]
            for work, _ in pairs]


def fit_costs(pairs) -> dict[str, Cost]:
    """Per-stage costs, piecewise-linear in width, by least squares: each span's measured ms is the
    sum over its calls of the stage's cost at the call's width, and a cost is its values at a few
    knot widths (``knots_for``) joined by straight lines. A knot whose value comes out negative is
    dropped and the fit redone."""
    calls = keyed_calls(pairs)
    knots = {}
    for row in calls:
        for stage, width in row:
            knots.setdefault(stage, set()).add(width)
    knots = {stage: knots_for(widths) for stage, widths in sorted(knots.items())}
    y = np.array([ms for _, ms in pairs])  # [spans]
    while True:
        columns = [(stage, k) for stage, ks in knots.items() for k in ks]
        X = np.zeros((len(pairs), len(columns)))  # [spans, knots]: each span's calls, spread over its stage's knots
        for row, row_calls in enumerate(calls):
            for stage, width in row_calls:
                start = columns.index((stage, knots[stage][0]))
                X[row, start:start + len(knots[stage])] += hat_weights(width, knots[stage])
        values = np.linalg.lstsq(X, y, rcond=None)[0]
        negative = [(v, c) for v, c in zip(values, columns) if v < 0 and len(knots[c[0]]) > 1]
        if not negative:
            break
        stage, knot = min(negative)[1]
        knots[stage] = [k for k in knots[stage] if k != knot]
    return {stage: Cost(tuple((float(k), max(0.0, float(values[columns.index((stage, k))]))) for k in ks))
            for stage, ks in knots.items()}


def fit_profile(traces: list[Trace], name: str = "this-machine", source: str = "") -> Profile:
    """A profile for the machine the traces were measured on: per-stage costs fitted from their
    spans (``fit_costs``), the rendezvous' mean, and the host's time outside any span (what the
    spans leave of each measured run), per step and per phase (``fit_host``). Lanes here share one
    machine, so the costs fitted from spans that ran side by side already carry that contention:
    overlap 1."""
    pairs = measured_work(traces)
    rendezvous = [ms for w, ms in pairs if w.fixed == "rendezvous_ms"]
    devices = {}
    for trace in traces:
        for label, lane in trace.lanes.items():
            read = LaneLabel.read(label)
            devices.setdefault(lane, read.display if read else label)
    base = Profile(name, source or f"fitted from the measured spans of {len(traces)} runs", devices,
                   fit_costs([(w, ms) for w, ms in pairs if w.calls]),
                   rendezvous_ms=float(np.mean(rendezvous)) if rendezvous else 0.0, overlap=1.0)
    step, phase = fit_host(traces, base)
    return replace(base, step_ms=step, phase_ms=phase, split=measured_split(traces))


def measured_split(traces: list[Trace]) -> tuple[int, int] | None:
    """(exit layer, target layers) of the Mirror-SD runs among ``traces``, where they all share one:
    where the prefix and suffix costs fitted from them were measured."""
    splits = {split for t in traces if t.method == "mirror" and (split := run_exit(t.meta)) is not None}
    return splits.pop() if len(splits) == 1 else None


def fit_host(traces: list[Trace], profile: Profile) -> tuple[float, float]:
    """(step_ms, phase_ms): the host's time per step and per phase, by least squares over the runs:
    each run's measured time less what ``profile`` (without host time) makes of its spans is
    step_ms times its decoding steps plus phase_ms times their phases. Neither is negative: where one comes
    out so, the other alone is fitted."""
    bare = replace(profile, step_ms=0.0, phase_ms=0.0)
    plans = [step_plans(t) for t in traces]
    turns = [sum(not in_host_turn(phase) for step in p[1:] for phase in step) for p in plans]  # phases launched
    X = np.array([[len(p) - 1, n] for p, n in zip(plans, turns)], dtype=float)  # [runs, 2]
    y = np.array([1000 * (measured_seconds(t) - modelled_seconds(t, bare)) for t in traces])  # [runs] ms
    if not len(y) or not X[:, 0].any():
        return 0.0, 0.0
    both = np.linalg.lstsq(X, y, rcond=None)[0]
    if (both >= 0).all():
        return float(both[0]), float(both[1])
    fits = [np.linalg.lstsq(X[:, [i]], y, rcond=None)[0][0] for i in (0, 1)]  # each alone
    errors = [np.sum((X[:, i] * max(f, 0.0) - y) ** 2) for i, f in enumerate(fits)]
    i = int(np.argmin(errors))
    out = [0.0, 0.0]
    out[i] = max(0.0, float(fits[i]))
    return out[0], out[1]


def measured_seconds(trace: Trace) -> float:
    """From the first span's start to the last one's end."""
    return max(s.end for s in trace.spans) - min(s.start for s in trace.spans) if trace.spans else 0.0


def held_out_ids(runs: list[dict]) -> set:
    """The prompts the held-out check predicts: every second prompt of each category, in run order."""
    order: dict[str, list] = {}
    for r in runs:
        ids = order.setdefault(r["category"], [])
        if r["id"] not in ids:
            ids.append(r["id"])
    return {i for ids in order.values() for i in ids[1::2]}


def held_out_check(runs: list[dict]):
    """Fit a profile on half the prompts and predict every method's speedup on the other half.

    runs: one per (method, prompt): method, id, category, new_tokens, wall_s (measured) and traces
    (the run's traces, one per turn). Prompts alternate between the halves within each category.
    Returns (the fitted profile, a table per method: measured and modelled speedup on the held-out
    half, and the model's relative error)."""
    import pandas as pd

    if not all(r.get("traces") for r in runs):
        raise MirrorSDError("the held-out check needs every run's traces")
    held_out = held_out_ids(runs)
    if not held_out or held_out == {r["id"] for r in runs}:
        raise MirrorSDError("the held-out check needs at least two prompts of one category")
    profile = fit_profile([t for r in runs if r["id"] not in held_out for t in r["traces"]],
                          source="fitted on half the prompts of one bench run")
    rows = []
    for r in runs:
        if r["id"] in held_out:
            rows.append(dict(method=r["method"], new_tokens=r["new_tokens"], wall_s=r["wall_s"],
                             modelled_s=sum(modelled_seconds(t, profile) for t in r["traces"])))
    per = pd.DataFrame(rows).groupby("method", sort=False).sum()
    measured = per.new_tokens / per.wall_s
    modelled = per.new_tokens / per.modelled_s
    table = pd.DataFrame({"measured_speedup": measured / measured["vanilla"],
                          "modelled_speedup": modelled / modelled["vanilla"]})
    table["error"] = table.modelled_speedup / table.measured_speedup - 1
    return profile, table.reset_index()


# -- steady state: acceptance, hit rate and draft cost as knobs ------------------------------------
WINDOW_OPTION = {"sd": "gamma", "mirror": "gamma", "ss": "gamma", "eagle": "depth"}  # draft tokens along a path


def tokens_per_step(alpha: float, window: int) -> float:
    """Expected tokens a step commits when each draft token is accepted with probability ``alpha``
    (given the ones before it) from a window of ``window`` tokens: 1 + alpha + ... + alpha^window."""
    return sum(alpha ** k for k in range(window + 1))


def acceptance_of(tau: float, window: int) -> float:
    """The acceptance ``alpha`` at which ``tokens_per_step(alpha, window)`` is ``tau`` (bisection; 0 for
    tau <= 1, 1 for tau >= window + 1): a run's own acceptance, as the steady-state knobs take it."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens_per_step(mid, window) < tau else (lo, mid)
    return (lo + hi) / 2


def fallback_ms(trace: Trace, profile: Profile) -> float:
    """Mirror-SD: what a miss puts on the critical path: a fresh draft (gamma draft forwards, or with
    tree windows the draft's tree levels) after the host's turn to launch it, or where the run's
    misses took correction rollouts (``corrects``), what of those gamma forwards outlasts the
    host's turn between the steps."""
    options = trace.meta.get("options", {})
    trees = options.get("tree") and trace.meta.get("temperature", 0.0) == 0
    draft = sum(profile.cost(stage, width) for stage, width in fresh_draft_calls(options, trees))
    return max(0.0, draft - profile.step_ms) if corrects(trace) else profile.phase_ms + draft


def steady_state(trace: Trace, profile: Profile, alpha: float | None = None, hit_rate: float | None = None) -> dict:
    """A run's decoding steps on ``profile`` in the long run, prefill left out: tokens per step
    (this run's, or from the acceptance ``alpha``), ms per step (this run's steps priced on the
    profile; for Mirror-SD with its misses' fresh drafts at this run's rate, or at ``1 - hit_rate``),
    and speedup over vanilla's one target forward per token on the same profile at the mean context
    of the run's steps (``vanilla_ms``: vanilla's step, ``vanilla_step_ms``)."""
    steps = trace.steps[1:]
    if not steps:
        raise MirrorSDError(f"the {trace.method} run has no decoding steps to model")
    plans = step_plans(trace)[1:]
    if trace.method == "mirror":
        fresh = (SpanKind.FALLBACK_DRAFT, SpanKind.CORRECTION_ROLLOUT)
        no_draft = [[p for p in plan if p[0].kind not in fresh] for plan in plans]
        ms = sum(step_ms(p, profile) for p in no_draft) / len(plans)
        misses = [s for s in steps if not s.rendezvous.hit]
        copied = sum(s.rendezvous.copied for s in steps) / max(len(misses), 1)  # share of misses copied
        exposed = len(misses) / len(steps) if hit_rate is None else (1 - hit_rate)
        ms += exposed * (1 - min(copied, 1.0)) * fallback_ms(trace, profile)
    else:
        ms = sum(step_ms(p, profile) for p in plans) / len(plans)
    tau = sum(len(s.committed) for s in steps) / len(steps)
    if alpha is not None and trace.method in WINDOW_OPTION:
        tau = tokens_per_step(alpha, trace.meta.get("options", {}).get(WINDOW_OPTION[trace.method], 1))
    contexts = step_contexts(trace)[1:]
    vanilla_ms = vanilla_step_ms(profile, sum(contexts) / len(contexts))
    ms += profile.step_ms
    return dict(method=trace.method, tokens_per_step=tau, step_ms=ms, speedup=tau * vanilla_ms / ms,
                vanilla_ms=vanilla_ms)


def pooled_steady_state(traces: list[Trace], profile: Profile) -> dict:
    """Several runs' steady state on ``profile`` (``steady_state``), pooled over every decoding step
    of every trace: tokens per step, ms per step, and speedup (tokens over step time, against one
    target forward per token, each run's at its own steps' context). Runs without a decoding step are
    left out."""
    tokens = ms = steps = vanilla = 0.0
    for trace in traces:
        n = len(trace.steps) - 1
        if n < 1:
            continue
        s = steady_state(trace, profile)
        tokens, ms, steps = tokens + s["tokens_per_step"] * n, ms + s["step_ms"] * n, steps + n
        vanilla += s["tokens_per_step"] * n * s["vanilla_ms"]  # vanilla's time for the run's tokens
    if not ms:
        return dict(tokens_per_step=float("nan"), step_ms=float("nan"), speedup=float("nan"))
    return dict(tokens_per_step=tokens / steps, step_ms=ms / steps, speedup=vanilla / ms)


def tradeoff(traces: list[Trace], profile: Profile, ratios, alpha=None, hit_rate=None) -> dict[str, list[float]]:
    """Steady-state speedup per method at each draft cost ``ratio`` (a draft forward, or an EAGLE
    head step, over a one-token target forward): the curve where sd falls as its draft grows and
    Mirror-SD stays flat while its rollouts fit under the target's suffix."""
    return {t.method: [steady_state(t, profile.with_draft_ratio(r), alpha, hit_rate)["speedup"] for r in ratios]
            for t in traces}


def mean_work_ms(trace: Trace, profile: Profile) -> dict[str, float]:
    """Mean ms per decoding step of each kind of work (span kind; Mirror-SD's two rendezvous-kind
    works by label) on ``profile``: where a method's step time goes."""
    totals: dict[str, float] = {}
    plans = step_plans(trace)[1:]
    for plan in plans:
        for phase in plan:
            for work, ms in zip(phase, phase_ms(phase, profile)):
                key = work.label if work.kind == SpanKind.RENDEZVOUS else work.kind
                totals[key] = totals.get(key, 0.0) + ms
    return {key: ms / max(len(plans), 1) for key, ms in totals.items()}


def hit_rate_to_lead(mirror: Trace, other: Trace, profile: Profile, alpha: float | None = None) -> float | None:
    """The lowest Mirror-SD hit rate (in steps of 0.01) at which its steady-state speedup on
    ``profile`` reaches ``other``'s; None if even every step hitting does not."""
    target = steady_state(other, profile, alpha)["speedup"]
    for percent in range(101):
        if steady_state(mirror, profile, alpha, percent / 100)["speedup"] >= target:
            return percent / 100
    return None


def step_parts(trace: Trace, profile: Profile) -> dict[str, float]:
    """Where a run's modelled step time goes on ``profile``: mean ms per decoding step of each part of
    its critical path, in schedule order, the host's turns included (``host``: its work per step and
    its launch of each phase: ``critical_path``). Works that run side by side count once, as the
    longer of them, under their names joined by " | ". The parts sum to the modelled step time
    (``summary``'s step seconds over its steps)."""
    plans = step_plans(trace, together=not profile.one_cpu)[1:]
    parts: dict[str, float] = {"host": profile.step_ms * len(plans)}
    for plan in plans:
        for phase, launch, own in critical_path(plan, profile):
            parts["host"] += launch
            name = " | ".join(_part_name(w) for w in phase)
            parts[name] = parts.get(name, 0.0) + own
    return {name: ms / max(len(plans), 1) for name, ms in parts.items()}


def _part_name(work: Work) -> str:
    return work.label if work.kind == SpanKind.RENDEZVOUS else str(work.kind)


# -- a typical step from settings: the map's and the controls' model ------------------------------
MAP_GAMMAS = tuple(range(1, 9))  # windows the map and the controls try for sd and Mirror-SD


def typical_trace(method: str, options: dict, meta: dict | None = None) -> Trace:
    """One decoding step of sd or Mirror-SD at ``options`` as the model prices it, nothing measured in
    it: a chain window of gamma draft tokens (tree options dropped), drafted token by token or, with
    ``streams`` 1, in one forward with the draft's streams; for Mirror-SD the branches its rollouts carry (``min(branch_budget, (gamma + 1) kappa)``, as
    ``branches.rank_branches`` keeps them) and a hit (``steady_state`` prices the misses at the hit
    rate it is given). ``meta``: the run's target layers (an exit's depth) and lanes' threads."""
    gamma, streams = int(options.get("gamma", 2)), int(options.get("streams", 0))
    trace = Trace(method, {**(meta or {}), "options": dict(options, tree=0), "temperature": 0.0, "prompt_tokens": 1})
    step = Step(1, [0], ["target"], proposed=[0] * gamma)
    if method == "sd":
        step.draft = DraftWork(forwards=1 if streams == 1 else gamma)
    elif method == "mirror":
        branches = min(int(options.get("branch_budget", 16)), (gamma + 1) * int(options.get("kappa", 4)))
        step.rendezvous = Rendezvous(exit_candidates=[], branches=[(0, 0, [])] * branches, branch_used=0,
                                     fallback=False, copied=False)
    else:
        raise MirrorSDError(f"the typical-step model covers sd and mirror, not {method!r}")
    trace.steps = [Step(0, [], []), step]
    return trace


def best_window(method: str, choices: list[tuple[dict, tuple]], profile: Profile, alpha: float,
                hit_rate: float | None = None, meta: dict | None = None) -> dict:
    """sd's or Mirror-SD's steady state (``steady_state`` of a ``typical_trace``) at the draft's
    acceptance ``alpha`` (and Mirror-SD's ``hit_rate``) at its best drafting form and window:
    ``choices`` are (options, windows) pairs, the first best kept. Returns gamma, streams,
    tokens_per_step, step_ms, speedup."""
    best = None
    for options, gammas in choices:
        for gamma in gammas:
            s = steady_state(typical_trace(method, dict(options, gamma=gamma), meta), profile, alpha,
                             hit_rate if method == "mirror" else None)
            if best is None or s["speedup"] > best["speedup"]:
                best = dict(s, gamma=gamma, streams=int(options.get("streams", 0)))
    return best


def lead_map(profile: Profile, alphas, ratios, forms: dict[str, list[tuple[dict, tuple]]], levels: dict[str, float],
             hit_rate: float, meta: dict | None = None):
    """Which method leads over the draft's acceptance per token (``alphas``) and its cost per forward
    against a one-token target forward (``ratios``), on ``profile``: sd and Mirror-SD at their best
    drafting form and window (``forms``: per method, the (options, windows) pairs ``best_window``
    tries), the methods without a draft model (EAGLE, ss) at their fixed ``levels``. One row
    per point: alpha, ratio, each method's speedup, sd's and Mirror-SD's gamma and streams, the leader."""
    import pandas as pd

    rows = []
    for ratio in ratios:
        sized = profile.with_draft_ratio(ratio)
        for alpha in alphas:
            row = dict(alpha=alpha, ratio=ratio, **levels)
            for method, choices in forms.items():
                best = best_window(method, choices, sized, alpha, hit_rate, meta)
                row[method], row[f"{method}_gamma"], row[f"{method}_streams"] = (best["speedup"], best["gamma"],
                                                                                 best["streams"])
            rows.append(row)
    table = pd.DataFrame(rows)
    table["leader"] = table[[*forms, *levels]].idxmax(axis=1)
    return table


def alpha_for_speedup(speedup: float, choices: list[tuple[dict, tuple]], profile: Profile, hit_rate: float,
                      meta: dict | None = None) -> float | None:
    """The draft acceptance per token at which Mirror-SD's best form and window (``best_window`` over
    ``choices``) on ``profile`` reaches ``speedup`` (bisection; the speedup rises with the
    acceptance), or None where even 0.999 does not."""
    def reach(alpha):
        return best_window("mirror", choices, profile, alpha, hit_rate, meta)["speedup"]

    lo, hi = 0.0, 0.999
    if reach(hi) < speedup:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if reach(mid) < speedup else (lo, mid)
    return hi
