"""A race in one table, one row per method: what a student hands in.

Each row names the prompt, the models and their sizes, the method's settings, where and when it ran
(LIVE on this server, or RECORDED on another machine and day), and the numbers its card shows:
tokens/s, τ, acceptance, hit rate, speedup over vanilla (the cards' own ``numbers`` and ``baseline``,
so the table and the cards never disagree), and whether it committed vanilla's tokens.
"""
from __future__ import annotations

import pandas as pd

from mirror_sd import METHODS
from mirror_sd.models.loading import EMBEDDED_NAME, cache_root
from mirror_sd.models.pair import EMBEDDED_DRAFT

from .cards import baseline, numbers
from .models_note import TARGET_FOLDER, stored_parameters
from .provenance import badge, live_where
from .race import Result

# Where a recording's models live on disk when its traces predate their sizes in ``meta``.
MODEL_FILES = {EMBEDDED_NAME: lambda: cache_root() / TARGET_FOLDER,
               EMBEDDED_DRAFT.name: lambda: EMBEDDED_DRAFT}


def summary(results: dict[str, Result], prompt: str | None = None) -> pd.DataFrame:
    """One row per method of a finished race (``{method: Result}``, as the cards hold it)."""
    rate = baseline(results)
    vanilla = results.get("vanilla")
    table = pd.DataFrame([row(r, rate, vanilla, prompt) for r in results.values()])
    return table.astype({"target_parameters": "Int64", "draft_parameters": "Int64"})  # whole numbers, or empty


def row(r: Result, rate: float | None, vanilla: Result | None, prompt: str | None) -> dict:
    meta = r.trace.meta
    n = numbers(r, rate) if r.metrics else {}
    drafts = r.method in METHODS and METHODS[r.method].needs_draft  # the others never run the draft model
    return dict(
        method=r.title, prompt=prompt if prompt is not None else meta.get("prompt", ""),
        target=meta.get("target"), target_parameters=parameters(meta, "target"),
        draft=meta.get("draft") if drafts else None, draft_parameters=parameters(meta, "draft") if drafts else None,
        form=form(r), options=options_text(meta.get("options")),
        temperature=meta.get("temperature"), top_p=meta.get("top_p"), seed=meta.get("seed"),
        max_new_tokens=meta.get("max_new_tokens"), provenance=provenance(meta), finished=r.finished,
        new_tokens=n.get("tokens"), tokens_per_s=n.get("tokens_per_s"), tau=n.get("tau"),
        acceptance_rate=n.get("acceptance"), hit_rate=n.get("hit_rate"), ms_per_step=n.get("ms_per_step"),
        wall_s=n.get("wall_s"), speedup_over_vanilla=n.get("speedup"), equal_to_vanilla=equal_to_vanilla(r, vanilla),
        runs=max(len(r.runs), 1) if r.metrics else 0)


def committed(r: Result) -> list[int]:
    """Every token the run committed, in order."""
    return [t for s in r.trace.steps for t in s.committed]


def vanilla_match(r: Result, vanilla: Result | None) -> tuple[str, int | None]:
    """The one rule for "the same tokens as vanilla", which the export's summary (``equal_to_vanilla``)
    and the results table (``app.results_table``) each word their own way: ("vanilla", None) for vanilla
    itself; ("missing", None) with no vanilla run or no step to compare; ("sampled", None) at temperature
    > 0, where lossless means the same distribution, not the same text; else ("yes" or "no", n): the
    committed token ids against vanilla's in this race. Where one of the two runs was cut short (stopped)
    only the tokens both wrote are compared: n is their number (None where both wrote as many)."""
    if r.method == "vanilla":
        return "vanilla", None
    if vanilla is None or not vanilla.trace.steps or not r.trace.steps:
        return "missing", None
    if (r.trace.meta.get("temperature") or 0) > 0:
        return "sampled", None
    mine, theirs = committed(r), committed(vanilla)
    n = min(len(mine), len(theirs))
    return "yes" if mine[:n] == theirs[:n] else "no", None if len(mine) == len(theirs) else n


EQUAL_WORDS = {"vanilla": "is vanilla", "missing": "no vanilla run to compare",
               "sampled": "not comparable (temperature > 0: same distribution, not same text)", "yes": "yes", "no": "no"}


def equal_to_vanilla(r: Result, vanilla: Result | None) -> str:
    """The summary's column (``vanilla_match``): 'yes', 'yes (the first n tokens)' for a run cut short,
    'no', 'is vanilla', 'not comparable (...)' when sampling, or 'no vanilla run to compare'."""
    verdict, compared = vanilla_match(r, vanilla)
    return f"yes (the first {compared} tokens)" if verdict == "yes" and compared else EQUAL_WORDS[verdict]


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
    """RECORDED with its machine and day, or LIVE on this server with its processor or GPUs (the badge's)."""
    if meta.get("recording"):
        return f"RECORDED on {badge(meta)[1]}"
    return f"LIVE on this server: {live_where(meta)}"


def parameters(meta: dict, role: str) -> int | None:
    """A model's own parameters: from the run's meta (``ModelPair.describe``), else, for a recording
    made before runs carried them, counted from the named model's weights where they are on disk."""
    if meta.get(f"{role}_parameters") is not None:
        return meta[f"{role}_parameters"]
    folder = MODEL_FILES.get(meta.get(role) or "")
    return stored_parameters(folder()) if folder else None
