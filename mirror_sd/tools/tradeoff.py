"""The trade-off Mirror-SD breaks: drafts of growing capacity, measured here, then re-timed (MODELLED).

A bigger draft accepts more tokens per step. In classic speculative decoding (``sd``) its time is on
the critical path, so sd's speedup first rises with the draft's size and then falls. Mirror-SD
rolls its draft out under the target's suffix, so the draft's time is hidden until it outgrows the
suffix (Bhendawade et al., 2025, section 4.3). ``python -m mirror_sd tradeoff`` measures that:

1. each draft's cost: one one-token forward after ``CONTEXT`` cached tokens, as drafting runs here
   (int8 copies on a CPU, unless --fp32-drafting), over the target's (median of ``REPEATS``);
2. one interleaved run on the bench prompts, prompt by prompt: vanilla, EAGLE once, and for every
   draft sd at each γ of ``gammas`` (its best γ for that draft is kept) and Mirror-SD at its
   options; every run is checked token for token against vanilla;
3. the same runs re-timed by the what-if model (whatif.py) on shipped profiles (and this machine's,
   fitted from the run), each draft costing there what it costs here against the target: MODELLED.

Outputs in ``out``: drafts.csv (the costs), results.csv (every run and prompt), tradeoff.csv (one
row per draft: cost, τ, Mirror-SD's hit rate and overlap, each method's speedup), modelled.csv
(speedups per profile and draft, and whether Mirror-SD's rollouts outgrow the suffix there),
tradeoff.md and tradeoff.html (plotly).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from ..errors import MirrorSDError
from ..trace import SpanKind, Trace
from .bench import cpu_model, make_folder, run_interleaved

DRAFTS = ("default", "exit:3", "exit:6", "exit:10", "exit:14", "exit:18", "exit:22")  # growing capacity
GAMMAS = (1, 2, 4)
PROFILES = ("this-machine", "h200-embedded", "paper-14b")
CONTEXT, REPEATS, ROUNDS = 200, 30, 3


def forward_ms(model, context: int = CONTEXT, repeats: int = REPEATS) -> float:
    """Median milliseconds of one one-token forward of ``model`` after ``context`` cached tokens (on a
    GPU, to the end of its work)."""
    cache = model.new_cache(context + 1)
    ids = torch.randint(0, min(1000, model.args.vocab_size), (1, context + 1),
                        generator=torch.Generator().manual_seed(0)).to(model.device)
    wait = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        model(ids[:, :context], cache)
        times = []
        for _ in range(repeats + 3):  # the first three warm up
            wait()
            start = time.perf_counter()
            model(ids[:, context:], cache)
            wait()
            times.append(time.perf_counter() - start)
            cache.rollback(context)
    return 1000 * statistics.median(times[3:])


def draft_costs(pair, drafts: list[str], rounds: int = ROUNDS) -> pd.DataFrame:
    """Per draft: its layers, one-token forward ms as drafting runs (int8 on a CPU lane with int8
    drafting) and that over the target's one-token forward. In each of ``rounds`` rounds every draft
    is timed between two timings of the target (so a busy spell of a shared machine moves both);
    each draft's numbers are the medians over the rounds."""
    rows = []
    for _ in range(rounds):
        for draft in drafts:
            pair.use_draft(draft)
            before = forward_ms(pair.target)
            ms = forward_ms(pair.draft)  # in int8 where the pair drafts so (ModelPair.drafting)
            target_ms = (before + forward_ms(pair.target)) / 2
            rows.append(dict(draft=draft, layers=pair.draft.num_layers, draft_ms=ms, target_ms=target_ms,
                             cost=ms / target_ms))
    return pd.DataFrame(rows).groupby(["draft", "layers"], sort=False).median().reset_index()


def per_run(results: pd.DataFrame) -> pd.DataFrame:
    """One row per run index: τ, tokens/s, speedup over vanilla (run 0; total wall time over the same
    prompts), hit rate and overlap over all its steps and time, and its share of prompts equal to vanilla."""
    g = results.assign(committed=results.mean_accepted * results.steps).groupby("run")
    out = pd.DataFrame({
        "tau": g.committed.sum() / g.steps.sum(),
        "tokens_per_s": g.new_tokens.sum() / g.wall_s.sum(),
        "hit_rate": g.hits.sum() / g.hit_steps.sum().where(g.hit_steps.sum() > 0),
        "overlap": g.overlap_s.sum() / g.draft_busy_s.sum().where(g.draft_busy_s.sum() > 0),
        "equal_to_vanilla": g.equal_to_vanilla.mean()})
    out["speedup"] = out.tokens_per_s / out.loc[0, "tokens_per_s"]
    return out


def measured_table(runs: list[tuple], stats: pd.DataFrame, costs: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """tradeoff.csv's rows (one per draft, sd at its best γ) and EAGLE's numbers, from ``per_run``."""
    eagle = next((i for i, r in enumerate(runs) if r[0] == "eagle" and i in stats.index), None)
    rows = []
    for _, c in costs.iterrows():
        sd = [i for i, r in enumerate(runs) if r[0] == "sd" and r[2] == c.draft and i in stats.index]
        mirror = next((i for i, r in enumerate(runs) if r[0] == "mirror" and r[2] == c.draft), None)
        if not sd or mirror not in stats.index:
            continue
        best = max(sd, key=lambda i: stats.speedup[i])
        rows.append(dict(draft=c.draft, layers=c.layers, cost=c.cost, sd_gamma=runs[best][1]["gamma"],
                         sd_tau=stats.tau[best], sd_speedup=stats.speedup[best], mirror_tau=stats.tau[mirror],
                         mirror_hit_rate=stats.hit_rate[mirror], mirror_overlap=stats.overlap[mirror],
                         mirror_speedup=stats.speedup[mirror], sd_run=best, mirror_run=mirror))
    if eagle is None:  # EAGLE failed (no head for this target): its columns stay empty
        return pd.DataFrame(rows), dict(tau=float("nan"), speedup=float("nan"), run=None)
    return pd.DataFrame(rows), dict(tau=stats.tau[eagle], speedup=stats.speedup[eagle], run=eagle)


def steady_speedup(traces: list[Trace], profile) -> float:
    """The runs' steady-state speedup over vanilla on ``profile``, pooled over every trace's steps
    (whatif.pooled_steady_state)."""
    from .whatif import pooled_steady_state

    return pooled_steady_state(traces, profile)["speedup"]


def rollout_vs_suffix(traces: list[Trace], profile) -> tuple[float, float]:
    """Mirror-SD's mean ms per step of its rollouts and of the target's suffix on ``profile``."""
    from .whatif import mean_work_ms

    works = [mean_work_ms(t, profile) for t in traces if len(t.steps) > 1]
    kinds = (SpanKind.DRAFT_ROLLOUT, SpanKind.TARGET_SUFFIX)
    return tuple(sum(w.get(key, 0.0) for w in works) / max(len(works), 1) for key in kinds)


def modelled_table(table: pd.DataFrame, eagle: dict, traced: dict[int, list[Trace]], profiles: dict) -> pd.DataFrame:
    """Per profile and draft: sd's, Mirror-SD's and EAGLE's steady-state speedups re-timed there, each
    draft at its measured cost against the target; Mirror-SD's rollouts against its suffix."""
    rows = []
    for name, profile in profiles.items():
        eagle_speedup = steady_speedup(traced[eagle["run"]], profile) if eagle["run"] is not None else float("nan")
        for _, r in table.iterrows():
            sized = profile.with_draft_ratio(r.cost)
            rollouts, suffix = rollout_vs_suffix(traced[r.mirror_run], sized)
            rows.append(dict(profile=name, draft=r.draft, cost=r.cost,
                             sd_speedup=steady_speedup(traced[r.sd_run], sized),
                             mirror_speedup=steady_speedup(traced[r.mirror_run], sized),
                             eagle_speedup=eagle_speedup, rollout_ms=rollouts, suffix_ms=suffix,
                             outgrows_suffix=rollouts > suffix))
    return pd.DataFrame(rows)


def verdict(rows: pd.DataFrame, where: str) -> str:
    """One sentence from the numbers: which method leads at which draft, and why (τ against EAGLE's,
    and where Mirror-SD's rollouts outgrow the target's suffix). rows: per draft, the three
    methods' speedups, sd's and Mirror-SD's τ where measured, and ``outgrows_suffix``."""
    best_sd, best_mirror = rows.loc[rows.sd_speedup.idxmax()], rows.loc[rows.mirror_speedup.idxmax()]
    eagle = rows.eagle_speedup.iloc[0]
    leads = rows[rows.mirror_speedup > rows[["sd_speedup", "eagle_speedup"]].max(axis=1)]
    grown = rows[rows.outgrows_suffix]
    text = (f"{where}: sd peaks at {best_sd.sd_speedup:.2f}x with {best_sd.draft}, Mirror-SD at "
            f"{best_mirror.mirror_speedup:.2f}x with {best_mirror.draft}, "
            + (f"EAGLE is at {eagle:.2f}x; " if eagle == eagle else "EAGLE did not run; "))
    if leads.empty:
        text += "Mirror-SD leads with none of these drafts"
        if "mirror_tau" in rows and "eagle_tau" in rows and rows.mirror_tau.max() < rows.eagle_tau.iloc[0]:
            text += (f", since even its best τ ({rows.mirror_tau.max():.2f}) is below EAGLE's "
                     f"({rows.eagle_tau.iloc[0]:.2f})")
    else:
        text += f"Mirror-SD leads with {', '.join(leads.draft)}, where its rollouts still hide under the suffix"
    if not grown.empty:
        text += f"; from {grown.draft.iloc[0]} on its rollouts outgrow the suffix, so the draft's time shows"
    return text + "."


def load_profiles(names: list[str], fitted) -> dict:
    from .whatif import load_profile

    return {name: (fitted if name == "this-machine" else load_profile(name)) for name in names
            if name != "this-machine" or fitted is not None}


def tradeoff(pair, prompts: list[dict], drafts=DRAFTS, gammas=GAMMAS, max_new_tokens: int = 48,
             out_dir: str | Path = "tradeoff-out", profiles=PROFILES, mirror_options: dict | None = None,
             command: str = "python -m mirror_sd tradeoff", **settings) -> pd.DataFrame:
    """Measure and re-time the trade-off (module docstring); write the outputs; return tradeoff.csv's table."""
    from .whatif import fit_profile

    out = make_folder(out_dir, "the trade-off's output folder")
    if pair.draft is None:
        raise MirrorSDError("the trade-off needs a draft to start from: load the pair with one")
    default = pair.draft_name
    drafts = [default if d == "default" else d for d in drafts]
    costs = draft_costs(pair, drafts)
    costs.to_csv(out / "drafts.csv", index=False)
    runs = [("vanilla", {}, None), ("eagle", {}, None)]
    for draft in drafts:
        runs += [("sd", {"gamma": g}, draft) for g in gammas] + [("mirror", dict(mirror_options or {}), draft)]
    traced: list[dict] = []
    results = run_interleaved(pair, prompts, runs, max_new_tokens, desc="trade-off", traces=traced, **settings)
    results["draft"] = [runs[i][2] for i in results.run]
    results.to_csv(out / "results.csv", index=False)
    stats = per_run(results)
    table, eagle = measured_table(runs, stats, costs)
    by_run: dict[int, list[Trace]] = {}
    for t in traced:
        by_run.setdefault(t["run"], []).extend(t["traces"])
    shipped = [i for i, r in enumerate(runs) if r[2] in (None, default) and i in by_run]
    fitted = fit_profile([t for i in shipped for t in by_run[i]], source="fitted on the trade-off run's spans") \
        if "this-machine" in profiles else None
    modelled = modelled_table(table, eagle, by_run, load_profiles(list(profiles), fitted))
    table = table.assign(eagle_tau=eagle["tau"], eagle_speedup=eagle["speedup"]).drop(columns=["sd_run", "mirror_run"])
    modelled = modelled.merge(table[["draft", "sd_tau", "mirror_tau", "eagle_tau"]], on="draft")
    table.to_csv(out / "tradeoff.csv", index=False)
    modelled.to_csv(out / "modelled.csv", index=False)
    unequal = stats.index[stats.equal_to_vanilla < 1].tolist()
    sentences = [verdict(table.assign(outgrows_suffix=False), "Measured here")] + \
        [verdict(rows, f"MODELLED on {name}") for name, rows in modelled.groupby("profile", sort=False)]
    (out / "tradeoff.md").write_text(report(table, modelled, sentences, unequal, runs, len(prompts), max_new_tokens))
    (out / "meta.json").write_text(json.dumps(dict(command=command, prompts=len(prompts), max_new_tokens=max_new_tokens,
                                                   machine=cpu_model(), date=time.strftime("%Y-%m-%d"),
                                                   int8_drafting=pair.int8_drafting), indent=1))
    try:
        plot(table, modelled, out / "tradeoff.html")  # plotly.js from its CDN: a small file
    except ImportError:  # a machine without requirements.txt's plotly: keep the numbers
        pass
    table.attrs.update(sentences=sentences, failed=results.attrs.get("failed", {}), unequal=unequal)
    return table


def report(table, modelled, sentences, unequal, runs, prompts: int, max_new_tokens: int) -> str:
    shown = table.drop(columns=["eagle_tau", "eagle_speedup"])
    lines = ["# Draft capacity against speedup", "",
             f"{prompts} prompts, {max_new_tokens} new tokens each, T = 0, one interleaved run; sd at its best γ of "
             f"{sorted({r[1]['gamma'] for r in runs if r[0] == 'sd'})} per draft. `cost`: one draft forward over one "
             f"target forward, measured here. EAGLE (no draft): τ {table.eagle_tau.iloc[0]:.3f}, "
             f"{table.eagle_speedup.iloc[0]:.2f}x.", "",
             "## Measured", "", shown.to_markdown(index=False, floatfmt=".3f"), "",
             "## MODELLED: the same runs re-timed on each profile", "",
             "Each draft costs on the profile what it costs here against the target (the profile's draft device "
             "taken at that ratio); τ, hit rates and the steps are this run's.", "",
             modelled.to_markdown(index=False, floatfmt=".3f"), "", *[f"- {s}" for s in sentences], ""]
    if unequal:
        lines.append(f"WARNING: runs {unequal} committed other tokens than vanilla.")
    return "\n".join(lines) + "\n"


def plot(table: pd.DataFrame, modelled: pd.DataFrame, path: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [("measured here", table)] + [(f"MODELLED: {p}", rows)
                                           for p, rows in modelled.groupby("profile", sort=False)]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _ in panels], shared_yaxes=False)
    for col, (_, rows) in enumerate(panels, start=1):
        first = col == 1
        fig.add_trace(go.Scatter(x=rows.cost, y=rows.sd_speedup, text=rows.draft, mode="lines+markers", name="sd",
                                 line=dict(color="#1f77b4"), showlegend=first), row=1, col=col)
        fig.add_trace(go.Scatter(x=rows.cost, y=rows.mirror_speedup, text=rows.draft, mode="lines+markers",
                                 name="Mirror-SD", line=dict(color="#2ca02c"), showlegend=first), row=1, col=col)
        fig.add_trace(go.Scatter(x=rows.cost, y=rows.eagle_speedup, mode="lines", name="EAGLE (no draft)",
                                 line=dict(color="#d62728", dash="dash"), showlegend=first), row=1, col=col)
        fig.update_xaxes(title_text="draft cost / target forward", row=1, col=col)
    fig.update_yaxes(title_text="speedup over vanilla", row=1, col=1)
    fig.update_layout(title="Draft capacity against speedup", width=420 * len(panels), height=420)
    fig.write_html(path, include_plotlyjs="cdn")
