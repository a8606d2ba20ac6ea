"""Fit what the ``h200-embedded`` profile's stage replays cannot show, from gpu-check's graphs-on bench
on the H200 (``docs/gpu/h200-2026-11-27-launch/bench-graphs-on/traces``), its ``-02`` prompts' traces
only: the app's recorded races (``app/recorded/nvidia-h200``) are that bench's ``-01`` prompts, so
``scripts.h200_held_out`` checks the profile on runs it was not fitted on.

    python -m scripts.derive_h200_context [--write]

Three fits, each on what the one before left:

1. ``context_ms``: what each stage's call adds per 100 slots of context (``whatif.Work.context``).
   Every decoding span's measured ms less its price on the replays (at an empty cache) is, by least
   squares, a constant (the same for every span) plus, per stage, its calls times their context /
   100. The prefills are left out (their chunks attend each other, not a context) and so are
   EAGLE's first drafts past 64 pairs (fit 2). Mirror-SD's target suffix, measured beside the
   rollouts on the draft's stream, comes out with a slope below 0: the prefix's or the suffix's
   slope, where it comes out negative, is the target's per layer times its layers (the profile's
   ``split``); any other stage's, 0.
2. ``eagle_head_eager``: an EAGLE first draft over more than 64 pending pairs, measured, less its
   price with the fitted contexts, at the width of the pairs it ran eagerly (pending - 64); one
   point per width (the mean where two runs share one).
3. ``step_ms`` and ``phase_ms``: the host's time (``whatif.fit_host``) on the profile with both.

Prints the JSON fields; ``--write`` puts them into ``mirror_sd/tools/profiles/h200-embedded.json``
(its ``source`` and ``notes`` are edited by hand, with the held-out check's errors).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from mirror_sd.models.stages import MAX_WIDTH
from mirror_sd.trace import SpanKind, Trace
from mirror_sd.tools import whatif

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "docs" / "gpu" / "h200-2026-11-27-launch" / "bench-graphs-on" / "traces"
PROFILE = whatif.PROFILES_DIR / "h200-embedded.json"
EAGER = "eagle_head_eager"


def fitting_traces(folder: Path = TRACES) -> list[Trace]:
    """The bench's ``-02`` prompts' traces (every turn): the prompts the recorded races are not."""
    return [Trace.from_json(p.read_text()) for p in sorted(folder.glob("*-02-turn*.json"))]


def replays_only(profile: whatif.Profile) -> whatif.Profile:
    """The profile's stage replays alone: no context, no eager head, no host time."""
    stages = {s: c for s, c in profile.stages.items() if s != EAGER}
    return replace(profile, stages=stages, context_ms={}, step_ms=0.0, phase_ms=0.0)


def fit_context(pairs, replays: whatif.Profile) -> dict[str, float]:
    """Per stage, ms per call per 100 slots of context (fit 1 above), over (Work, measured ms) pairs;
    ``replays`` prices each span at an empty cache and gives the target's split."""
    spans = [(w, ms) for w, ms in pairs
             if w.calls and w.kind != SpanKind.PREFILL and all(s != EAGER for s, _ in w.calls)]
    stages = sorted({s.split("@")[0] for w, _ in spans for s, _ in w.calls})
    X = np.array([[1.0] + [sum(s.split("@")[0] == stage for s, _ in w.calls) * w.context / 100 for stage in stages]
                  for w, _ in spans])  # [spans, 1 + stages]
    y = np.array([ms - w.ms(replays) for w, ms in spans])  # [spans]: what the replays leave
    slopes = dict(zip(stages, np.linalg.lstsq(X, y, rcond=None)[0][1:]))
    if replays.split and slopes.get("target", 0) > 0:
        exit_layer, layers = replays.split
        for stage, share in (("target_prefix", exit_layer / layers), ("target_suffix", 1 - exit_layer / layers)):
            if slopes.get(stage, 0) < 0:
                slopes[stage] = slopes["target"] * share
    return {stage: round(max(0.0, float(k)), 3) for stage, k in slopes.items()}


def fit_eager(pairs, profile: whatif.Profile) -> dict[int, float]:
    """{eager pairs: ms} (fit 2 above): each first draft's measured ms less its other calls' price."""
    by_width: dict[int, list[float]] = {}
    for w, ms in pairs:
        eager = [width for s, width in w.calls if s == EAGER]
        if eager:
            rest = sum(profile.cost(s, width, w.threads, w.depth, w.context) for s, width in w.calls if s != EAGER)
            by_width.setdefault(eager[0], []).append(max(0.0, ms - rest))
    return {width: round(float(np.mean(v)), 3) for width, v in sorted(by_width.items())}


def derive(traces: list[Trace], profile: whatif.Profile) -> dict:
    """The fitted JSON fields: context_ms, stages.eagle_head_eager, step_ms and phase_ms."""
    replays = replays_only(profile)
    pairs = whatif.measured_work(traces)
    context = fit_context(pairs, replays)
    with_context = replace(replays, context_ms=context)
    eager = fit_eager(pairs, with_context)
    fields = {"context_ms": context}
    if eager:
        fields["stages"] = {EAGER: {"ms_by_width": {str(w): ms for w, ms in eager.items()}}}
        with_context = replace(with_context, stages={**with_context.stages, EAGER: whatif.Cost(
            tuple((float(w), ms) for w, ms in eager.items()))})
    step, phase = whatif.fit_host(traces, with_context)
    return dict(fields, step_ms=round(step, 4), phase_ms=round(phase, 4))


def write(fields: dict, path: Path = PROFILE) -> None:
    """Put the fitted fields into the profile's JSON, every other field as it was."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update({k: v for k, v in fields.items() if k != "stages"})
    data["stages"].pop(EAGER, None)
    data["stages"].update(fields.get("stages", {}))
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write the fields into {PROFILE.name}")
    args = parser.parse_args(argv)
    traces = fitting_traces()
    fields = derive(traces, whatif.load_profile(PROFILE))
    print(f"fitted on {len(traces)} traces ({TRACES.relative_to(ROOT)}/*-02-turn*.json), "
          f"eager width = pending pairs - {MAX_WIDTH}")
    print(json.dumps(fields, indent=1))
    if args.write:
        write(fields)
        print(f"written: {PROFILE}")


if __name__ == "__main__":
    main()
