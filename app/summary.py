"""A race in one table, one row per method: what a student hands in.

Each row names the prompt, the models and their sizes, the method's settings, where and when it ran
(LIVE on this server, or RECORDED on another machine and day), and the numbers its card shows:
tokens/s, τ, acceptance, hit rate, speedup over vanilla (the cards' own ``middle`` and ``baseline``,
so the table and the cards never disagree), and whether it committed vanilla's tokens.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch

from mirror_sd import METHODS
from mirror_sd.devices import cpu_cores
from mirror_sd.models.loading import EMBEDDED_NAME, cache_root
from mirror_sd.models.pair import EMBEDDED_DRAFT
from mirror_sd.tools.bench import cpu_model

from .cards import baseline, ms_per_step
from .race import Result
from .repeat import middle

# Where a recording's models live on disk when its traces predate their sizes in ``meta``.
MODEL_FILES = {EMBEDDED_NAME: lambda: cache_root() / "SmolLM2-135M-Instruct",
               EMBEDDED_DRAFT.name: lambda: EMBEDDED_DRAFT}


def summary(results: dict[str, Result], prompt: str | None = None) -> pd.DataFrame:
    """One row per method of a finished race (``{method: Result}``, as the cards hold it)."""
    rate = baseline(results)
    vanilla = results.get("vanilla")
    table = pd.DataFrame([row(r, rate, vanilla, prompt) for r in results.values()])
    return table.astype({"target_parameters": "Int64", "draft_parameters": "Int64"})  # whole numbers, or empty


def row(r: Result, rate: float | None, vanilla: Result | None, prompt: str | None) -> dict:
    meta = r.trace.meta
    number = (lambda key: middle(r, key)) if r.metrics else (lambda key: None)
    tps = number("tokens_per_s")
    drafts = r.method in METHODS and METHODS[r.method].needs_draft  # the others never run the draft model
    return dict(
        method=r.title, prompt=prompt if prompt is not None else meta.get("prompt", ""),
        target=meta.get("target"), target_parameters=parameters(meta, "target"),
        draft=meta.get("draft") if drafts else None, draft_parameters=parameters(meta, "draft") if drafts else None,
        form=form(r), options=options_text(meta.get("options")),
        temperature=meta.get("temperature"), top_p=meta.get("top_p"), seed=meta.get("seed"),
        max_new_tokens=meta.get("max_new_tokens"), provenance=provenance(meta), finished=r.finished,
        new_tokens=number("new_tokens"), tokens_per_s=tps, tau=number("mean_accepted"),
        acceptance_rate=number("acceptance_rate"), hit_rate=number("hit_rate"),
        ms_per_step=ms_per_step(r) if r.metrics else None, wall_s=number("wall_s"),
        speedup_over_vanilla=speedup(r, rate, tps), equal_to_vanilla=equal_to_vanilla(r, vanilla),
        runs=max(len(r.runs), 1) if r.metrics else 0)


def speedup(r: Result, rate: float | None, tps: float | None) -> float | None:
    """The card's speedup: this method's tokens/s over vanilla's in the same race, for a finished run
    long enough to time (None where the card shows none)."""
    if not rate or tps is None or r.method == "vanilla" or r.finished not in ("eos", "length") or not r.timed:
        return None
    return tps / rate


def committed(r: Result) -> list[int]:
    return [t for s in r.trace.steps for t in s.committed]


def equal_to_vanilla(r: Result, vanilla: Result | None) -> str:
    """'yes' / 'no' at temperature 0: the committed token ids against vanilla's in this race (a run cut
    short compares the tokens both wrote); 'not comparable' when sampling, where lossless means the
    same distribution, not the same text."""
    if r.method == "vanilla":
        return "is vanilla"
    if vanilla is None or not vanilla.trace.steps or not r.trace.steps:
        return "no vanilla run to compare"
    if (r.trace.meta.get("temperature") or 0) > 0:
        return "not comparable (temperature > 0: same distribution, not same text)"
    mine, theirs = committed(r), committed(vanilla)
    n = min(len(mine), len(theirs))
    if mine[:n] != theirs[:n]:
        return "no"
    return "yes" if len(mine) == len(theirs) else f"yes (the first {n} tokens)"


def form(r: Result) -> str:
    """'paper form' (``app.presets``), 'defaults' where every option is the method's default, else
    'own settings' (a visitor's, or a recording's best settings)."""
    options = r.trace.meta.get("options")
    if r.trace.meta.get("form"):
        return r.trace.meta["form"]
    defaults = METHODS[r.method].resolve_options({}) if r.method in METHODS else {}
    if all(defaults.get(k, v) == v for k, v in (options or {}).items()):  # an older run lacks newer options
        return "defaults"
    return "own settings"


def options_text(options: dict | None) -> str:
    return " ".join(f"{k}={v}" for k, v in (options or {}).items())


def provenance(meta: dict) -> str:
    """RECORDED with its machine and day, or LIVE on this server with its processor or GPUs."""
    recording = meta.get("recording")
    if recording:
        return f"RECORDED on {recording.get('hardware')}, {recording.get('date')}"
    return f"LIVE on this server: {this_machine(meta)}"


def this_machine(meta: dict) -> str:
    """The GPUs a live run's lanes used (their labels end in the device), else this CPU and its cores."""
    devices = {label.split(", ")[2] for label in (meta.get("target_lane"), meta.get("draft_lane"))
               if label and len(label.split(", ")) > 2}
    cuda = [d for group in devices for d in group.split(",") if d.startswith("cuda")]  # a sharded lane lists several
    gpus = sorted({torch.cuda.get_device_name(torch.device(d)) for d in cuda})
    return ", ".join(gpus) if gpus else f"{cpu_model()}, {cpu_cores()} CPU cores"


def parameters(meta: dict, role: str) -> int | None:
    """A model's own parameters: from the run's meta (``ModelPair.describe``), else, for a recording
    made before runs carried them, counted from the named model's weights where they are on disk."""
    if meta.get(f"{role}_parameters") is not None:
        return meta[f"{role}_parameters"]
    folder = MODEL_FILES.get(meta.get(role) or "")
    return stored_parameters(folder()) if folder else None


def stored_parameters(folder: Path) -> int | None:
    """The floating-point numbers in a model folder's safetensors (a draft's vocab map, integer, is not a
    weight); None where the folder is absent."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    total = 0
    for file in files:
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                part = f.get_slice(key)
                if part.get_dtype().startswith(("F", "BF")):
                    total += math.prod(part.get_shape())
    return total or None
