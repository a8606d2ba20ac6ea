"""Each method at its best settings for each hardware profile: ``python -m mirror_sd tune``.

At temperature 0 what a setting does to a step (the tokens it commits, Mirror-SD's hits, the window
or tree the target verifies) does not depend on the hardware; only what each piece of work costs
does. So every candidate setting runs once, here, on the prompts, checked token for token against
vanilla, and its traces are re-timed on every profile by the what-if model
(``whatif.pooled_steady_state``): one measured run prices the setting everywhere. A setting's
speedup on a profile is its steady-state speedup there (decoding steps, prefill left out), MODELLED;
on this machine it is also measured.

The search (``SEARCH``): round 0 runs each method's coarse grid and the paper's own Mirror-SD
configuration (``paper_settings``); each later round runs, for every profile, the neighbours of that
profile's best so far (each searched option moved one step along its ladder) that have not run
yet. Outputs in ``out``: searched.csv (every setting run: its options, τ, hit rate, measured
speedup here, and on each profile its MODELLED speedup and ms per step), tuned.csv (one row per
(profile, method): its fastest setting there, and the paper's configuration as the method
``mirror (paper)``), tuned.md, profile-this-machine.json and meta.json.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import MirrorSDError
from ..methods import get_method
from ..trace import Trace
from .bench import cpu_model, make_folder, run_interleaved
from .whatif import fit_profile, load_profile, pooled_steady_state, profile_names

THIS_MACHINE = "this-machine"  # the profile fitted to the search's own measured spans
PROFILES = (*profile_names(), THIS_MACHINE)
PAPER = "mirror (paper)"  # tuned.csv's method name for the paper's configuration


@dataclass(frozen=True)
class Space:
    """One method's search: the values each searched option may take, in order (its ladder), and the
    settings round 0 runs. Options not named keep their defaults."""

    ladders: dict[str, tuple]
    coarse: tuple[dict, ...]


def _grid(**axes) -> tuple[dict, ...]:
    """Every combination of the given option values."""
    settings = [{}]
    for name, values in axes.items():
        settings = [dict(s, **{name: v}) for s in settings for v in values]
    return tuple(settings)


SEARCH = {
    "sd": Space(dict(gamma=tuple(range(1, 9)), tree=(0, 8, 16, 32)),
                _grid(gamma=(1, 2, 3, 4, 6, 8)) + _grid(gamma=(3, 5), tree=(16,))),
    "eagle": Space(dict(depth=tuple(range(2, 9)), top_k=(2, 4, 6, 8, 10), total_tokens=(4, 8, 16, 24, 32, 48, 64)),
                   _grid(depth=(3, 5, 7), top_k=(8,), total_tokens=(8, 16, 32, 64)) +
                   ({"depth": 6, "top_k": 10, "total_tokens": 60},)),  # EAGLE-2's own defaults on a GPU
    "ss": Space(dict(gamma=(1, 2, 3, 4), top_k=(1, 2, 4), total_tokens=(2, 4, 8, 16, 32), one_forward=(0, 1)),
                _grid(gamma=(2, 4), total_tokens=(4, 16), one_forward=(0, 1))),
    "mirror": Space(dict(gamma=tuple(range(1, 9)), kappa=(2, 4, 8), branch_budget=(4, 8, 16, 32),
                         exit_layer=(14, 18, 22), streams=(0, 1), tree=(0, 8, 16)),
                    _grid(gamma=(1, 2, 4, 6, 8), kappa=(8,), exit_layer=(22,)) +
                    _grid(gamma=(2, 4, 6), kappa=(8,), exit_layer=(14,)) +
                    _grid(gamma=(3, 5), kappa=(8,), streams=(1,), exit_layer=(14, 22)) +
                    ({"gamma": 3, "kappa": 8, "exit_layer": 22, "tree": 16},)),
}


def paper_settings(pair) -> dict:
    """The paper's Mirror-SD configuration on this pair: gamma 7, kappa 8, the exit at half the
    target's layers (the nearest layer with a trained exit head, where one is within two layers),
    the draft's speculative streams on. A draft whose streams reach fewer tokens (its trained
    streams + its main stream) drafts that many with them."""
    from ..models.exit_head import available_exit_head

    half = pair.target.num_layers // 2
    near = [layer for layer in (half, half - 1, half + 1, half - 2, half + 2) if 0 < layer < pair.target.num_layers]
    exit_layer = next((layer for layer in near if available_exit_head(pair, layer) is not None), half)
    window = stream_window(pair)
    return dict(gamma=min(7, window) if window else 7, kappa=8, exit_layer=exit_layer, streams=1 if window else 0)


def stream_window(pair) -> int:
    """The longest window the draft makes in one forward with its streams (its trained streams + its
    main stream); 0 for a draft without streams."""
    from ..models.streams import draft_streams

    try:
        return draft_streams(pair).num_streams + 1
    except MirrorSDError:
        return 0


def key(method: str, options: dict) -> str:
    """The setting as one string: the method, then its options that differ from the defaults."""
    resolved = get_method(method).resolve_options(options)
    defaults = get_method(method).resolve_options({})
    changed = {k: v for k, v in resolved.items() if v != defaults[k]}
    return method + "".join(f" {k}={v:g}" for k, v in sorted(changed.items()))


def valid(pair, method: str, options: dict) -> bool:
    """Whether the method takes these options on this pair (a setting the engine refuses is outside
    the space: a gamma past the draft's streams, tree windows with streams)."""
    m = get_method(method)
    try:
        resolved = m.resolve_options(options)
        if m.check:
            m.check(pair, resolved)
    except MirrorSDError:
        return False
    return True


def neighbours(method: str, options: dict, search: dict | None = None) -> list[dict]:
    """The settings one step away along each searched option's ladder."""
    resolved = get_method(method).resolve_options(options)
    defaults = get_method(method).resolve_options({})
    ladders = {k: v for k, v in (search or SEARCH)[method].ladders.items() if k in resolved}  # in scope here
    base = {k: resolved[k] for k in ladders if resolved[k] != defaults.get(k)}  # as given
    out = []
    for name, ladder in ladders.items():
        below = [v for v in ladder if v < resolved[name]]
        above = [v for v in ladder if v > resolved[name]]
        for v in ([below[-1]] if below else []) + ([above[0]] if above else []):
            out.append({**base, name: v})
    return out


def run_stats(rows: pd.DataFrame, vanilla_tps: float, traces: list[Trace]) -> dict:
    """One setting's measured numbers over the prompts: τ, hit rate, tokens/s and speedup over the
    same round's vanilla, and whether every prompt committed vanilla's tokens."""
    steps = [s for t in traces for s in t.steps[1:]]
    hits = [s.rendezvous.hit for s in steps if s.rendezvous is not None]
    tps = rows.new_tokens.sum() / rows.wall_s.sum()
    return dict(tau=sum(len(s.committed) for s in steps) / max(len(steps), 1),
                hit_rate=sum(hits) / len(hits) if hits else float("nan"),
                measured_speedup=tps / vanilla_tps, equal_to_vanilla=bool(rows.equal_to_vanilla.all()))


def measure(pair, prompts, settings: list[tuple[str, str, dict]], round_: int, max_new_tokens: int, failed: dict,
            **decoding) -> tuple[list[dict], dict[str, list[Trace]]]:
    """Run vanilla and every (label, method, options) of ``settings`` on the prompts, interleaved:
    one row each (``run_stats``), and each setting's traces by its key; a setting that fails is left
    out and named in ``failed`` with why."""
    runs = [("vanilla", {})] + [(method, options) for _, method, options in settings]
    traced: list[dict] = []
    results = run_interleaved(pair, prompts, runs, max_new_tokens, desc=f"tune round {round_}", traces=traced,
                              **decoding)
    by_run: dict[int, list[Trace]] = {}
    for t in traced:
        by_run.setdefault(t["run"], []).extend(t["traces"])
    failed.update({key(*runs[i]): why for i, why in results.attrs.get("failed", {}).items()})
    vanilla = results[results.run == 0]
    vanilla_tps = vanilla.new_tokens.sum() / vanilla.wall_s.sum()
    rows, traces = [], {}
    for index, (label, method, options) in enumerate([("vanilla", "vanilla", {})] + settings):
        if index not in by_run:  # failed: named in results.attrs["failed"], left out
            continue
        setting = key(method, options)
        rows.append(dict(setting=setting, label=label, method=method, options=json.dumps(options, sort_keys=True),
                         round=round_, **run_stats(results[results.run == index], vanilla_tps, by_run[index])))
        traces[setting] = by_run[index]
    return rows, traces


def modelled(rows: list[dict], traces: dict[str, list[Trace]], profiles: dict) -> pd.DataFrame:
    """``rows`` with, per profile, each setting's MODELLED steady-state speedup and ms per step."""
    table = pd.DataFrame(rows)
    for name, profile in profiles.items():
        steady = [pooled_steady_state(traces[s], profile) for s in table.setting]
        table[f"speedup@{name}"] = [s["speedup"] for s in steady]
        table[f"step_ms@{name}"] = [s["step_ms"] for s in steady]
    return table


def best_per_profile(table: pd.DataFrame, profiles) -> pd.DataFrame:
    """tuned.csv: per (profile, method) the searched setting with the highest MODELLED speedup there
    (vanilla as it ran), and the paper's configuration again as the method ``PAPER``."""
    rows = []
    for name in profiles:
        for method, group in table.groupby("method", sort=False):
            for label, part in (("best", group), ("paper", group[group.paper])):
                if part.empty:
                    continue
                r = part.loc[part[f"speedup@{name}"].idxmax()]
                rows.append(dict(profile=name, method=PAPER if label == "paper" else method,
                                 options=r.options, setting=r.setting, tau=r.tau, hit_rate=r.hit_rate,
                                 speedup=r[f"speedup@{name}"], step_ms=r[f"step_ms@{name}"],
                                 measured_speedup_here=r.measured_speedup, equal_to_vanilla=r.equal_to_vanilla,
                                 searched=len(group) if label == "best" else 1))
    return pd.DataFrame(rows)


def tune(pair, prompts: list[dict], methods=("sd", "eagle", "ss", "mirror"), profiles=PROFILES, rounds: int = 1,
         max_new_tokens: int = 48, out_dir: str | Path = "tune-out", command: str = "python -m mirror_sd tune",
         search: dict | None = None, **decoding) -> pd.DataFrame:
    """Search every method's settings (module docstring), write the outputs, return tuned.csv's table."""
    search = search or SEARCH
    methods = [m for m in methods if m != "vanilla"]
    if not methods:
        raise MirrorSDError("tune has nothing to search: name at least one method besides vanilla "
                            f"({', '.join(SEARCH)})")
    unknown = [m for m in methods if m not in search]
    if unknown:
        raise MirrorSDError(f"tune has no search for method {unknown[0]!r} (it searches {', '.join(search)})")
    out = make_folder(out_dir, "the tune's output folder")
    started = time.perf_counter()
    shipped = {n: load_profile(n) for n in profiles if n != THIS_MACHINE}
    settings = [("coarse", m, o) for m in methods for o in search[m].coarse]
    paper = None
    if "mirror" in methods:  # run in round 0 with the coarse grid, and marked (it may be one of the grid's)
        settings.append(("coarse", "mirror", paper_settings(pair)))
        paper = key(*settings[-1][1:])
    traces, fitted, failed, table = {}, None, {}, None
    for round_ in range(rounds + 1):
        seen = (set(table.setting) if table is not None else set()) | set(failed)
        fresh, keys = [], set()
        for label, method, options in settings:
            k = key(method, options) if valid(pair, method, options) else None
            if k is not None and k not in seen and k not in keys:
                fresh.append((label, method, options))
                keys.add(k)
        if not fresh:
            break
        new_rows, new_traces = measure(pair, prompts, fresh, round_, max_new_tokens, failed, **decoding)
        new_rows = [dict(r, paper=r["setting"] == paper) for r in new_rows
                    if not (r["method"] == "vanilla" and round_ > 0)]
        traces.update(new_traces)
        if fitted is None and THIS_MACHINE in profiles:  # fitted once, on round 0's spans
            fitted = fit_profile([t for ts in traces.values() for t in ts], name=THIS_MACHINE,
                                 source=f"fitted on the measured spans of the tune's first round on {cpu_model()}")
        if new_rows:  # each setting re-timed once, when it has run
            new = modelled(new_rows, traces, {**shipped, **({THIS_MACHINE: fitted} if fitted else {})})
            table = new if table is None else pd.concat([table, new], ignore_index=True)
        best = best_per_profile(table, profiles)
        settings = [("refined", m, n) for _, r in best[best.method.isin(methods)].iterrows()
                    for m in [r.method] for n in neighbours(m, json.loads(r.options), search)]
    if fitted is not None:
        (out / "profile-this-machine.json").write_text(json.dumps(fitted.to_json(), indent=1))
    table.to_csv(out / "searched.csv", index=False)
    best.to_csv(out / "tuned.csv", index=False)
    threads = {t[0].method: t[0].meta.get("threads", {}) for t in traces.values() if t}  # each method's lanes
    meta = dict(command=command, prompts=len(prompts), prompt_ids=[p["id"] for p in prompts],
                max_new_tokens=max_new_tokens, machine=cpu_model(), date=time.strftime("%Y-%m-%d"),
                minutes=round((time.perf_counter() - started) / 60, 1), rounds=int(table["round"].max()) + 1,
                settings_run=int((table.method != "vanilla").sum()), methods=methods, profiles=list(profiles),
                target_layers=pair.target.num_layers, draft=pair.draft_name, int8_drafting=pair.int8_drafting,
                threads=threads, stream_window=stream_window(pair))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    (out / "tuned.md").write_text(report(best, table, meta, failed))
    best.attrs.update(unequal=sorted(table.setting[~table.equal_to_vanilla]), failed=failed)
    return best


def report(best: pd.DataFrame, table: pd.DataFrame, meta: dict, failed: dict) -> str:
    lines = ["# Each method at its best settings per profile", "",
             f"`{meta['command']}` on {meta['machine']}, {meta['date']}: {meta['settings_run']} settings in "
             f"{meta['rounds']} rounds, {meta['prompts']} prompts of {meta['max_new_tokens']} new tokens, T = 0, "
             f"{meta['minutes']} minutes. τ and hit rates are measured here; speedups are each setting's steps "
             "re-timed on the profile (MODELLED, steady state); `measured_speedup_here` is measured on this machine.",
             ""]
    shown = best[["profile", "method", "setting", "tau", "hit_rate", "speedup", "step_ms", "measured_speedup_here"]]
    lines += [shown.to_markdown(index=False, floatfmt=".3f"), "", "## Every setting searched", "",
              "Rounds: 0 the coarse grid and the paper's configuration (`paper`); then the neighbours of each profile's "
              "best.",
              "", table.drop(columns=["options", "label"]).to_markdown(index=False, floatfmt=".3f"), ""]
    lines += [f"Left out, it failed: {setting} ({why})" for setting, why in failed.items()]
    unequal = table.setting[~table.equal_to_vanilla].tolist()
    if unequal:
        lines.append(f"WARNING: {', '.join(unequal)} committed other tokens than vanilla.")
    return "\n".join(lines) + "\n"
