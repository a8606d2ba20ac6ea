"""The What if tab's draft-capacity view: the trade-off Mirror-SD is built to break.

A bigger draft accepts more tokens per step. sd pays for it on the critical path; Mirror-SD hides
its draft under the target's suffix until the draft outgrows it. This view draws the recorded run
of ``python -m mirror_sd tradeoff`` (``app/tradeoff/``): per draft, its measured cost, τ,
Mirror-SD's hit rate and each method's speedup measured on the run's CPU, and the same runs re-timed on
the chosen profile (MODELLED). Beside it, the paper's own Table 1, REPORTED. Three kinds of number,
each labelled: measured (on the trade-off run's CPU, named in the caption), modelled, reported.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from mirror_sd.tools.tradeoff import verdict
from mirror_sd.trace import SpanKind

from . import figures
from .tuned import recorded

FOLDER = Path(__file__).parent / "tradeoff"  # python -m mirror_sd tradeoff --out app/tradeoff
THIS_MACHINE = "this-machine"  # the trade-off run's own profile, fitted to its spans

# Table 1 of Bhendawade et al. (2025): Qwen3-14B, T = 0, speedup over autoregressive decoding on Spec-Bench.
REPORTED = pd.DataFrame({
    "task": ["translation", "summarization", "question answering", "mathematical reasoning",
             "retrieval-augmented generation", "multi-turn conversation"],
    "EAGLE3": [2.53, 2.91, 3.09, 3.36, 2.66, 3.29],
    "Vanilla-SD": [2.34, 1.76, 1.81, 2.80, 2.02, 2.07],
    "Mirror-SD": [4.13, 3.07, 3.18, 5.32, 3.49, 3.70]})
REPORTED_CAPTION = ("**REPORTED by the paper** (Bhendawade et al., 2025, Table 1), not run here: Qwen3-14B on "
                    "Spec-Bench, T = 0, speedup over autoregressive decoding, with a 0.6B draft on 8 NPUs beside "
                    "8 GPUs. Its draft is as big as it is because Mirror-SD hides it. Its EAGLE column is EAGLE3, the "
                    "paper's strongest baseline; the app runs EAGLE-2, to which the same table gives a lower "
                    "speedup than EAGLE3 on every task.")


def load(folder: Path = FOLDER):
    """(measured, modelled, meta) of the recorded trade-off run, or None where none ships."""
    if not (folder / "tradeoff.csv").exists():
        return None
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}
    return pd.read_csv(folder / "tradeoff.csv"), pd.read_csv(folder / "modelled.csv"), meta


def modelled_on(modelled: pd.DataFrame, profile: str) -> pd.DataFrame:
    """The modelled rows of one profile (empty where the run did not re-time on it)."""
    return modelled[modelled.profile == profile].reset_index(drop=True)


def sentences(measured: pd.DataFrame, modelled: pd.DataFrame, profile: str, where: str = "RECORDED on its CPU") -> str:
    """What the numbers say, measured where the run's meta says (``where``: 'RECORDED on AMD EPYC, 2026-12-05')
    and MODELLED on ``profile``: which method leads at which draft, and why (tradeoff.verdict)."""
    text = [verdict(measured.assign(outgrows_suffix=False), f"**Measured: {where}**") +
            " There both lanes were cores of one CPU, so Mirror-SD's draft was never free."]
    rows = modelled_on(modelled, profile)
    if rows.empty:
        text.append(f"The trade-off run was not re-timed on {profile}.")
    else:
        text.append(verdict(rows, f"**MODELLED on {profile}**"))
    return "\n\n".join(text)


def figure(measured: pd.DataFrame, modelled: pd.DataFrame, profile: str, meta: dict) -> go.Figure:
    """Speedup over vanilla against the draft's cost: sd and Mirror-SD per draft, EAGLE (no draft) as a
    level; solid measured, dashed MODELLED on ``profile``; a line where Mirror-SD's rollouts
    outgrow the target's suffix there. Hover: each draft's τ and Mirror-SD's hit rate."""
    fig = go.Figure()
    kinds = (("sd", SpanKind.DRAFT), ("mirror", SpanKind.DRAFT_ROLLOUT), ("eagle", SpanKind.VERIFY))
    colour = {m: figures.kind_style(k)[0] for m, k in kinds}
    measured = measured.assign(hover=[
        f"{d}<br>cost {c:.2f}<br>sd τ {t:.2f} (γ {g})<br>Mirror-SD τ {m:.2f}, hit rate {h:.2f}"
        for d, c, t, g, m, h in zip(measured.draft, measured.cost, measured.sd_tau, measured.sd_gamma,
                                    measured.mirror_tau, measured.mirror_hit_rate)])
    rows = modelled_on(modelled, profile).merge(measured[["draft", "hover"]], on="draft")
    for method, title in (("sd", "Speculative decoding"), ("mirror", "Mirror-SD")):
        for table, where, dash in ((measured, "measured", None), (rows, f"MODELLED on {profile}", "dash")):
            if table.empty:
                continue
            exits = table.draft.str.startswith("exit:")  # the family is a curve; a distilled draft, a point apart
            line, point = table[exits].sort_values("cost"), table[~exits]
            named = dash is None and method == "mirror"  # each draft named once, on the measured Mirror-SD line
            fig.add_trace(go.Scatter(x=line.cost, y=line[f"{method}_speedup"], name=f"{title}, {where}",
                                     mode="lines+markers+text" if named else "lines+markers",
                                     text=line.draft if named else line.hover, textposition="top center",
                                     hovertext=line.hover, hoverinfo="text+y",
                                     line=dict(color=colour[method], width=3, dash=dash)))
            fig.add_trace(go.Scatter(x=point.cost, y=point[f"{method}_speedup"], name=f"{title}, {where}: the shipped "
                                     "distilled draft", mode="markers+text" if named else "markers",
                                     text=[f"{d} (the shipped distilled draft)" for d in point.draft] if named else None,
                                     textposition="bottom center", hovertext=point.hover, hoverinfo="text+y",
                                     marker=dict(symbol="star" if dash is None else "star-open", size=14,
                                                 color=colour[method])))
    x = [measured.cost.min(), measured.cost.max()]
    fig.add_trace(go.Scatter(x=x, y=[measured.eagle_speedup.iloc[0]] * 2, name="EAGLE (no draft), measured",
                             mode="lines", line=dict(color=colour["eagle"], width=2)))
    if not rows.empty:
        fig.add_trace(go.Scatter(x=x, y=[rows.eagle_speedup.iloc[0]] * 2, name=f"EAGLE, MODELLED on {profile}",
                                 mode="lines", line=dict(color=colour["eagle"], width=2, dash="dash")))
        grown = rows[rows.outgrows_suffix]
        if not grown.empty:
            fig.add_vline(x=grown.cost.iloc[0], line=dict(dash="dot", color="#374151"),
                          annotation_text=f"Mirror-SD's draft outgrows the suffix (MODELLED on {profile})",
                          annotation_position="bottom right")
    fig.add_hline(y=1.0, line=dict(color="#9ca3af", width=1))
    fig.update_layout(title="Draft capacity: speedup over vanilla as the draft grows "
                            f"({meta.get('prompts', '?')} prompts, {meta.get('max_new_tokens', '?')} tokens)",
                      xaxis_title=f"draft cost: one draft forward / one target forward ({recorded(meta)})",
                      yaxis_title="speedup over vanilla", height=460, margin=dict(l=10, r=10, t=50, b=40),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def caption(meta: dict) -> str:
    return (f"From the recorded trade-off run: `{meta.get('command', 'python -m mirror_sd tradeoff')}`, "
            f"{recorded(meta)}. Drafts `exit:N` are the target's first N layers read by a trained exit head; the "
            "shipped 4-layer draft is distilled. Solid lines are measured there (RECORDED); dashed lines are the "
            "same runs re-timed on the profile, each draft costing there, against the target, what it cost in that "
            "run: **MODELLED**. This chart is the trade-off run's, not this race's.")
