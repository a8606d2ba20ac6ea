"""The header's models and its note on why a small target gains little, computed when the page is built.

The models: the shipped draft's own files (``mirror_sd/assets/draft-smollm2-135m``: config.json and
training.json name its layers, its trained parameters and its target) and the recorded races' meta
(the target's layers). The note's numbers: the H200 recordings' traces (``app/recorded/nvidia-h200``),
medians over their six races. Nothing here is typed in: a new recording or a new draft changes the text.
"""
from __future__ import annotations

import functools
import json
import math
import statistics
from pathlib import Path

from mirror_sd.models.loading import cache_root
from mirror_sd.models.pair import EMBEDDED_DRAFT
from mirror_sd.tools.bench import cpu_model

from .replay import RECORDED

H200 = RECORDED / "nvidia-h200"
TARGET_FOLDER = "SmolLM2-135M-Instruct"  # the embedded target, once converted (models/loading.py)


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def stored_parameters(folder: Path) -> int | None:
    """The floating-point numbers in a model folder's .safetensors files, read from their headers alone (no
    weights loaded; a draft's integer vocab map is not a weight); None where the folder holds none."""
    total = 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        with file.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(math.prod(v["shape"]) for k, v in header.items()
                     if k != "__metadata__" and v["dtype"].startswith(("F", "BF")))
    return total or None


def _millions(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n < 1e8 else f"{n / 1e6:.0f}M"


@functools.cache
def recordings(folder: Path = H200) -> tuple[dict, ...]:
    """The recorded races of ``folder``, as saved (read once)."""
    return tuple(json.loads(p.read_text()) for p in sorted(folder.glob("*.json")))


def pair_words(draft: Path = EMBEDDED_DRAFT) -> str:
    """'SmolLM2-135M-Instruct (30 layers, 134.5M parameters) target; draft: ...', from the shipped files."""
    card, config = _json(draft / "training.json"), _json(draft / "config.json")
    meta = next((r["methods"]["sd"]["trace"]["meta"] for r in recordings() if "sd" in r["methods"]), {})
    target = card.get("target", meta.get("target", "the embedded target"))
    params = stored_parameters(cache_root() / TARGET_FOLDER)
    sizes = ", ".join(filter(None, [f"{meta['target_layers']} layers" if "target_layers" in meta else "",
                                    f"{_millions(params)} parameters" if params else ""]))
    layers = config.get("num_hidden_layers", meta.get("draft_layers"))
    trained = card.get("trainable_parameters")
    first = card.get("layers_from_target")
    draft_text = (f"the project's distilled draft, {layers} decoder layers"
                  + (f" started from the target's first {len(first)}" if first else "")
                  + (f", {_millions(trained)} trained parameters plus the target's frozen embedding" if trained else "")
                  + (f", trained to copy the target's own answers (top-1 agreement {card['held_out_top1']:.2f} "
                     "held out)" if "held_out_top1" in card else ""))
    return f"**{target}** ({sizes}) as the target; **draft**: {draft_text}"


def _ms(span: dict) -> float:
    return 1000 * (span["end"] - span["start"])


def _spans(race: dict, method: str, kind: str) -> list[dict]:
    return [s for s in race["methods"].get(method, {}).get("trace", {}).get("spans", [])
            if s["kind"] == kind and s.get("step")]


def _period_ms(spans: list[dict]) -> list[float]:
    """The time from one step's last span's end to the next one's: a whole step, the host's work included."""
    ends = sorted(s["end"] for s in spans)
    return [1000 * (b - a) for a, b in zip(ends, ends[1:])]


def _speedups(method: str) -> list[float]:
    return [r["methods"][method]["metrics"]["tokens_per_s"] / r["methods"]["vanilla"]["metrics"]["tokens_per_s"]
            for r in recordings() if method in r["methods"] and "vanilla" in r["methods"]]


def _draft_forward_ms(race: dict) -> list[float]:
    """sd's draft spans, each over the forwards its step records: the time of one draft forward."""
    steps = {st["index"]: st for st in race["methods"].get("sd", {}).get("trace", {}).get("steps", [])}
    return [_ms(s) / steps[s["step"]]["draft"]["forwards"] for s in _spans(race, "sd", "draft")
            if steps.get(s["step"], {}).get("draft", {}).get("forwards")]


def _median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def h200_costs() -> dict | None:
    """Medians over the H200 recordings (ms): the target's forward (a vanilla decode's GPU time), a vanilla
    step (forward + the host's work), one draft forward, an sd step (draft forwards, then the check),
    Mirror-SD's target suffix and its rollouts; sd's τ; each method's speedup range. None with no recordings."""
    races = recordings()
    if not races:
        return None
    spans = lambda method, kind: [_ms(s) for r in races for s in _spans(r, method, kind)]  # noqa: E731
    return {"races": len(races), "hardware": races[0]["meta"].get("hardware", "an H200"),
            "date": races[0]["meta"].get("date", ""),
            "target": _median(spans("vanilla", "decode")),
            "vanilla_step": _median(x for r in races for x in _period_ms(_spans(r, "vanilla", "decode"))),
            "draft": _median(x for r in races for x in _draft_forward_ms(r)),
            "sd_step": _median(x for r in races for x in _period_ms(_spans(r, "sd", "verify"))),
            "suffix": _median(spans("mirror", "target-suffix")),
            "rollouts": _median(spans("mirror", "draft-rollout")),
            "sd_tau": _median(r["methods"]["sd"]["metrics"]["mean_accepted"] for r in races if "sd" in r["methods"]),
            "speedups": {m: (min(v), max(v)) for m in TITLES if (v := _speedups(m))}}


TITLES = {"sd": "speculative decoding", "eagle": "EAGLE-2", "ss": "Speculative Streaming", "mirror": "Mirror-SD"}


def small_target_note() -> str:
    """Why a small target gains little, in the H200 recordings' own numbers (RECORDED); '' without them."""
    c = h200_costs()
    if c is None or c["target"] is None or c["vanilla_step"] is None:
        return ""
    text = [f"**Why a small target gains little** (RECORDED on {c['hardware']}, {c['date']}, medians over "
            f"{c['races']} races): the target's forward takes only {c['target']:.2f} ms of GPU work, yet a vanilla "
            f"step takes {c['vanilla_step']:.2f} ms: {c['vanilla_step'] - c['target']:.2f} ms of every step is the "
            "host's (launching kernels, reading the token), paid per step by every method."]
    if c["draft"] and c["sd_step"] and c["sd_tau"]:
        text.append(f"One draft forward costs {c['draft']:.2f} ms, {c['draft'] / c['target']:.0%} of the "
                    f"target's, so an sd step (its draft forwards, then the target's check) takes "
                    f"{c['sd_step']:.2f} ms for {c['sd_tau']:.2f} tokens: {c['sd_step'] / c['sd_tau']:.2f} ms a "
                    f"token against vanilla's {c['vanilla_step']:.2f}.")
    if c["suffix"] and c["rollouts"]:
        relation = "outlast" if c["rollouts"] > c["suffix"] else "fit under"
        text.append(f"Mirror-SD's rollouts ({c['rollouts']:.2f} ms) {relation} the target's last layers "
                    f"({c['suffix']:.2f} ms) that should hide them.")
    ranges = "; ".join(f"{TITLES[m]} {lo:.2f}–{hi:.2f}×" for m, (lo, hi) in c["speedups"].items())
    text.append(f"Speedups over vanilla in these recordings: {ranges}. Drafting pays where a target forward is "
                "dear and a draft forward cheap: the paper pairs a 0.6B draft with a 14B target (REPORTED).")
    return " ".join(text)


def processor_name() -> str:
    """This server's processor as /proc/cpuinfo names it (e.g. 'AMD EPYC 7B13')."""
    return " ".join(cpu_model().split())
