"""The What if tab's answer to "when does Mirror-SD beat EAGLE?": each method at its best settings
for the chosen profile, and a map of where each method leads.

Both read the recorded run of ``python -m mirror_sd tune --out app/tuned``: every setting it
searched ran once on the CPU named in its meta (τ, acceptance and hits at temperature 0 do not
depend on the hardware), and was re-timed on each profile (MODELLED). The map prices a typical step
of sd and Mirror-SD (``whatif.lead_map``) over the draft's acceptance per token and its cost per
forward, each at its best window; EAGLE and ss, which draft without a draft model, stay at their
best measured acceptance, re-timed there.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from mirror_sd.methods import get_method
from mirror_sd.tools import whatif

FOLDER = Path(__file__).parent / "tuned"  # python -m mirror_sd tune --out app/tuned
THIS_MACHINE = "this-machine"  # tuned.csv's profile fitted to the tune's own spans
PAPER = "mirror (paper)"
REPORTED_SPEEDUP = 3.82  # the paper's mean Mirror-SD speedup on Qwen3-14B (Table 1), REPORTED
TITLES = {"vanilla": "Vanilla", "sd": "Speculative decoding", "eagle": "EAGLE-2", "ss": "Speculative Streaming",
          "mirror": "Mirror-SD", PAPER: "Mirror-SD, the paper's configuration"}
COLOURS = {"mirror": "#059669", "eagle": "#dc2626", "sd": "#2563eb", "ss": "#9333ea", "tie": "#d1d5db"}
ALPHAS = tuple(np.round(np.arange(0.10, 0.951, 0.025), 3))  # the map's x: the draft's acceptance per token
RATIOS = tuple(np.round(np.geomspace(0.02, 1.0, 18), 4))  # the map's y: a draft forward / a target forward


def recorded(meta: dict) -> str:
    """Where and when a recorded run ran, as a provenance label: 'RECORDED on AMD EPYC, 2026-12-05'."""
    where = meta.get("machine") or meta.get("hardware") or "a machine its files do not name"
    return f"RECORDED on {where}" + (f", {meta['date']}" if meta.get("date") else "")


def _meta(folder: Path) -> dict:
    return json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").exists() else {}


TUNE_WHERE = recorded(_meta(FOLDER))  # the tune's settings, τ and hits
TRADEOFF_WHERE = recorded(_meta(Path(__file__).parent / "tradeoff"))  # the exit drafts' acceptance and cost

CAPTION = ("**How the best settings and the map are found.** `python -m mirror_sd tune` ran every setting it "
           f"searched once ({TUNE_WHERE}) and checked each against vanilla token for token. At temperature 0 what "
           "a setting does to a step (tokens committed, Mirror-SD's hits) does not depend on the hardware, so each "
           "run was re-timed on every profile and each method kept its fastest setting there (MODELLED on the "
           "profile). The map prices a typical step of sd and Mirror-SD at every acceptance and draft cost, each at "
           "its best window and drafting form (chains; Mirror-SD with the other options and the measured hit rate "
           "of its fastest chain setting, unless the controls below set the hit rate); EAGLE and Speculative "
           "Streaming draft without a draft model, so their level is their best setting's, at their own measured "
           "acceptance. Settings, symbols and profiles: the glossary.")


@dataclass
class Tuned:
    best: pd.DataFrame  # tuned.csv
    searched: pd.DataFrame  # searched.csv
    meta: dict
    fitted: whatif.Profile | None  # the this-machine profile the tune fitted


@functools.cache
def load(folder: Path = FOLDER) -> Tuned | None:
    """The recorded tune run, or None where none ships (read once)."""
    if not (folder / "tuned.csv").exists():
        return None
    fitted = folder / "profile-this-machine.json"
    return Tuned(pd.read_csv(folder / "tuned.csv"), pd.read_csv(folder / "searched.csv"),
                 json.loads((folder / "meta.json").read_text()),
                 whatif.Profile.from_json(json.loads(fitted.read_text())) if fitted.exists() else None)


def caption(tuned: Tuned, profile: str) -> str:
    """Where the table's numbers come from: the tune's command, processor, date and search."""
    m = tuned.meta
    searched = ", ".join(f"{TITLES[k]} {v}" for k, v in profile_rows(tuned, profile).searched.items()
                         if k in SEARCHED)
    return (f"<small>From `{m['command']}`, {recorded(m)}: {m['settings_run']} settings in "
            f"{m['rounds']} rounds (searched per method: {searched}), {m['prompts']} prompts of "
            f"{m['max_new_tokens']} new tokens each. τ and hit rates are RECORDED there; speedups and step times are "
            f"MODELLED on {profile}, in the long run (the prompt's reading left out).</small>")


# -- settings in plain words -----------------------------------------------------------------------
WORDS = {  # option -> how the page says its value
    "gamma": lambda v, m: f"{v} stream level{'s' * (v != 1)}" if m == "ss" else
                          f"window of {v} draft token{'s' * (v != 1)}",
    "kappa": lambda v, m: f"{v} early-exit candidates per position",
    "branch_budget": lambda v, m: f"{v} branches",
    "exit_layer": lambda v, m: f"early exit after layer {v}",
    "streams": lambda v, m: "drafts the window in one forward with its streams" if v == 1 else "drafts token by token",
    "tree": lambda v, m: f"draft tree of {v} nodes" if v else "",
    "depth": lambda v, m: f"tree {v} levels deep",
    "top_k": lambda v, m: f"{v} candidates per node" if m == "eagle" else f"{v} candidates per stream",
    "total_tokens": lambda v, m: f"{v} nodes verified",
    "one_forward": lambda v, m: "streams in the verify forward (the paper's one pass)" if v else
                                "a separate streams pass",
}
GLOSSED = {  # option -> the glossary's term for what the page calls it
    "gamma": "window of γ draft tokens (gamma)", "kappa": "early-exit candidates per position (κ, kappa)",
    "branch_budget": "branches (branch budget)", "exit_layer": "early exit after layer N",
    "streams": "drafts in one forward with its streams", "tree": "draft tree",
    "depth": "tree depth, candidates per node, nodes verified", "top_k": "tree depth, candidates per node, nodes verified",
    "total_tokens": "tree depth, candidates per node, nodes verified", "one_forward": "one pass / a separate streams pass"}
SEARCHED = {"sd": ("gamma", "streams", "tree"), "eagle": ("depth", "top_k", "total_tokens"),
            "ss": ("gamma", "top_k", "total_tokens", "one_forward"),
            "mirror": ("gamma", "kappa", "branch_budget", "exit_layer", "streams", "tree")}


def in_words(method: str, options: str | dict, layers: int) -> str:
    """A setting's searched options, defaults filled in, in plain words (``layers``: the target's)."""
    from mirror_sd.methods.mirror import default_exit_layer

    method = "mirror" if method == PAPER else method
    if method not in SEARCHED:
        return "one target forward per token"
    given = json.loads(options) if isinstance(options, str) else options
    known = {o.name for o in get_method(method).options}  # a recording may name options since removed
    resolved = get_method(method).resolve_options({k: v for k, v in given.items() if k in known})
    if method == "mirror" and not resolved.get("exit_layer"):
        resolved["exit_layer"] = default_exit_layer(layers)
    words = [WORDS[k](resolved[k], method) for k in SEARCHED[method] if k in resolved]
    return ", ".join(w for w in words if w)


def profile_rows(tuned: Tuned, profile: str) -> pd.DataFrame:
    return tuned.best[tuned.best.profile == profile].set_index("method")


def best_table(tuned: Tuned, profile: str) -> pd.DataFrame:
    """The page's table: each method's best setting on ``profile`` in plain words, with its τ and hit
    rate (measured by the tune) and its speedup and step time there (MODELLED)."""
    rows = profile_rows(tuned, profile)
    return pd.DataFrame([{
        "method": TITLES.get(m, m), "best settings (searched)": in_words(m, r.options, tuned.meta["target_layers"]),
        "τ (RECORDED)": round(r.tau, 2), "hit rate (RECORDED)": "" if pd.isna(r.hit_rate) else round(r.hit_rate, 2),
        f"speedup on {profile} (MODELLED)": f"{r.speedup:.2f}×", "ms per step (MODELLED)": round(r.step_ms, 2)}
        for m, r in rows.iterrows()])


def verdict(tuned: Tuned, profile: str) -> str:
    """One computed sentence: whether Mirror-SD at its best leads the others at theirs on ``profile``,
    by how much, and why (tokens per step against the time a step takes)."""
    rows = profile_rows(tuned, profile)
    if "mirror" not in rows.index:
        return "The recorded tune did not search Mirror-SD."
    others = rows.drop(index=[m for m in ("mirror", PAPER, "vanilla") if m in rows.index])
    mirror = rows.loc["mirror"]
    rival_name = others.speedup.idxmax()
    rival = others.loc[rival_name]
    lead = mirror.speedup / rival.speedup - 1
    why = (f"Mirror-SD commits {mirror.tau:.2f} tokens per step in {mirror.step_ms:.2f} ms, "
           f"{TITLES[rival_name]} {rival.tau:.2f} in {rival.step_ms:.2f} ms")
    if lead > 0:
        return (f"**On {profile}, Mirror-SD leads** (MODELLED, every method at its best settings): {mirror.speedup:.2f}× "
                f"against {TITLES[rival_name]}'s {rival.speedup:.2f}×, {lead:.0%} ahead, because {why}.")
    return (f"**On {profile}, Mirror-SD does not lead** (MODELLED, every method at its best settings): "
            f"{TITLES[rival_name]} reaches {rival.speedup:.2f}×, Mirror-SD {mirror.speedup:.2f}× at best, "
            f"{-lead:.0%} behind, because {why}.")


# -- the map ---------------------------------------------------------------------------------------
def draft_alpha(tuned: Tuned) -> float:
    """The shipped draft's acceptance per token: the median over sd's token-by-token chain windows that
    the tune ran of the α at which the geometric model gives their measured τ."""
    sd = tuned.searched[tuned.searched.method == "sd"]
    alphas = []
    for _, r in sd.iterrows():
        options = get_method("sd").resolve_options(json.loads(r.options))
        if not options.get("tree") and not options.get("streams"):
            alphas.append(whatif.acceptance_of(r.tau, options["gamma"]))
    return float(np.median(alphas)) if alphas else float("nan")


def profile_for(tuned: Tuned, profile: str, draft_speed: float | None = None) -> whatif.Profile:
    if profile == THIS_MACHINE:
        return tuned.fitted
    loaded = whatif.load_profile(profile)
    return loaded if draft_speed is None else loaded.with_draft_speed(draft_speed)


def chain_setting(tuned: Tuned, profile: str) -> pd.Series:
    """Mirror-SD's fastest searched setting on ``profile`` with chain windows (the map prices chains):
    the map's other Mirror-SD options and its measured hit rate come from it."""
    mirror = tuned.searched[tuned.searched.method == "mirror"]
    chains = mirror[[not json.loads(o).get("tree") for o in mirror.options]]
    return chains.loc[chains[f"speedup@{profile}"].idxmax()]


def forms(tuned: Tuned, profile: str) -> dict:
    """What the map tries for sd and Mirror-SD: each drafting form (token by token; one forward with
    the draft's streams) at every window it allows, Mirror-SD with the other options of its fastest
    chain setting (``chain_setting``)."""
    window = tuned.meta.get("stream_window", 0)
    mirror = json.loads(chain_setting(tuned, profile).options)
    mirror = {k: v for k, v in mirror.items() if k not in ("gamma", "tree", "branching", "streams")}
    out = {"sd": [({}, whatif.MAP_GAMMAS)], "mirror": [(mirror, whatif.MAP_GAMMAS)]}
    if window > 1:
        out["sd"].append(({"streams": 1}, tuple(range(1, window + 1))))
        out["mirror"].append(({**mirror, "streams": 1}, tuple(range(1, window + 1))))
    return out


def levels(tuned: Tuned, profile: str) -> dict:
    """EAGLE's and ss's best MODELLED speedups on ``profile``: the map's levels."""
    rows = profile_rows(tuned, profile)
    return {m: float(rows.loc[m].speedup) for m in ("eagle", "ss") if m in rows.index}


def typical_meta(tuned: Tuned) -> dict:
    return dict(target_layers=tuned.meta.get("target_layers"), threads=tuned.meta.get("threads", {}).get("mirror", {}))


def hit_rate_of(tuned: Tuned, profile: str) -> float:
    """The measured hit rate of Mirror-SD's fastest chain setting on ``profile``: the map's default."""
    return float(chain_setting(tuned, profile).hit_rate)


MARGIN = 0.05  # a lead smaller than this is a tie: the model misses measured runs by a few percent


def clear_leader(table: pd.DataFrame) -> pd.Series:
    """Per point, the method that leads by at least ``MARGIN`` over the next, else "tie"."""
    speedups = table[[m for m in ("sd", "mirror", "eagle", "ss") if m in table]]
    top = speedups.apply(lambda row: sorted(row, reverse=True)[:2], axis=1)
    clear = [a >= (1 + MARGIN) * b for a, b in top]
    return table.leader.where(clear, "tie")


def lead_map(tuned: Tuned, profile: str, model: whatif.Profile, hit_rate: float) -> pd.DataFrame:
    table = whatif.lead_map(model, ALPHAS, RATIOS, forms(tuned, profile), levels(tuned, profile), hit_rate,
                            typical_meta(tuned))
    return table.assign(clear=clear_leader(table))


def controls_speedup(tuned: Tuned, profile: str, model: whatif.Profile, method: str, alpha: float, hit_rate: float,
                     window: int | None = None) -> dict:
    """sd's or Mirror-SD's steady state at the controls' acceptance and hit rate, on the profile's own
    draft: at ``window``, or (None) at the best window and form, as the map prices every point."""
    choices = [(options, [g for g in gammas if window in (None, g)])
               for options, gammas in forms(tuned, profile)[method]]
    return whatif.best_window(method, choices, model, alpha, hit_rate, typical_meta(tuned))


FINE = 200  # points of the exact scans behind the map's sentence


def lead_threshold(tuned: Tuned, profile: str, model: whatif.Profile, hit_rate: float, ratio: float,
                   against: str | None = None) -> float | None:
    """The lowest acceptance at which Mirror-SD leads by ``MARGIN`` at exactly the draft cost ``ratio``
    (a fine scan of the map's model): every other method, or only ``against``; None where it does at
    no acceptance up to 0.99."""
    row = whatif.lead_map(model, np.linspace(ALPHAS[0], 0.99, FINE), [ratio], forms(tuned, profile),
                          levels(tuned, profile), hit_rate, typical_meta(tuned))
    ahead = clear_leader(row) == "mirror" if against is None else row.mirror >= (1 + MARGIN) * row[against]
    leads = row[ahead].alpha
    return float(leads.min()) if not leads.empty else None


def cost_threshold(tuned: Tuned, profile: str, model: whatif.Profile, hit_rate: float, alpha: float) -> float | None:
    """The highest draft cost at which Mirror-SD leads by ``MARGIN`` at exactly the acceptance ``alpha``
    (a fine scan over the map's costs), or None where it does at no cost on the map."""
    col = whatif.lead_map(model, [alpha], np.geomspace(RATIOS[0], RATIOS[-1], FINE // 2), forms(tuned, profile),
                          levels(tuned, profile), hit_rate, typical_meta(tuned))
    leads = col[clear_leader(col) == "mirror"].ratio
    return float(leads.max()) if not leads.empty else None


def exit_drafts(folder: Path = Path(__file__).parent / "tradeoff") -> pd.DataFrame:
    """The trade-off run's drafts (``exit:N``: the target's first N layers and their exit head) at their
    measured acceptance per token (from sd's τ at its best window) and cost in that run."""
    path = folder / "tradeoff.csv"
    if not path.exists():
        return pd.DataFrame(columns=["draft", "alpha", "cost"])
    t = pd.read_csv(path)
    t = t[t.draft.str.startswith("exit:")]
    return pd.DataFrame({"draft": t.draft, "cost": t.cost,
                         "alpha": [whatif.acceptance_of(tau, int(g)) for tau, g in zip(t.sd_tau, t.sd_gamma)]})


def paper_point(tuned: Tuned, profile: str, model: whatif.Profile, hit_rate: float) -> tuple[float | None, str]:
    """The acceptance per token at which the map's Mirror-SD reaches the paper's REPORTED mean speedup
    at the profile's own draft cost, and a sentence saying so, or why it cannot."""
    choices = forms(tuned, profile)["mirror"]
    best = whatif.alpha_for_speedup(REPORTED_SPEEDUP, choices, model, hit_rate, typical_meta(tuned))
    if best is not None:
        return best, (f"The paper's REPORTED mean of {REPORTED_SPEEDUP}× on Qwen3-14B needs, in this model at this "
                      f"draft cost and hit rate, an acceptance of {best:.2f} per token (REPORTED + MODELLED).")
    top = controls_speedup(tuned, profile, model, "mirror", 0.999, hit_rate)
    return None, (f"In this model the paper's REPORTED {REPORTED_SPEEDUP}× is out of reach at this draft cost and hit "
                  f"rate: even a draft accepting every token reaches {top['speedup']:.2f}×, since its best window "
                  f"({top['gamma']}) commits {top['tokens_per_step']:.1f} tokens a step in {top['step_ms']:.2f} ms, "
                  f"misses' fresh drafts included, against {top['vanilla_ms']:.2f} ms for one vanilla token.")


def map_figure(table: pd.DataFrame, profile: str, shipped: tuple[float, float], drafts: pd.DataFrame,
               paper_alpha: float | None) -> go.Figure:
    """Each point coloured by the method that leads there, Mirror-SD's region the strongest; the
    shipped draft, the exit drafts and the paper's REPORTED result placed on it. Hover: every method's
    speedup and sd's and Mirror-SD's best window."""
    methods = [m for m in ("mirror", "eagle", "sd", "ss") if m in table]
    index = {m: i for i, m in enumerate([*methods, "tie"])}
    alphas, ratios = sorted(table.alpha.unique()), sorted(table.ratio.unique())
    grid = table.pivot(index="ratio", columns="alpha", values="clear").loc[ratios, alphas]
    z = grid.apply(lambda col: col.map(index)).to_numpy(dtype=float)
    hover = table.set_index(["ratio", "alpha"])
    text = [[" ".join([f"acceptance {a:.3f}, draft cost {r:.3f}<br>"] +
                      [f"{TITLES[m]} {hover.loc[(r, a), m]:.2f}×"
                       + (f" (window {hover.loc[(r, a), m + '_gamma']:g}"
                          f"{', streams' if hover.loc[(r, a), m + '_streams'] else ''})" if m in ("sd", "mirror")
                          else "") + "<br>" for m in methods]) for a in alphas] for r in ratios]
    n = len(index)
    scale = []
    for m, i in index.items():
        scale += [(i / n, COLOURS[m]), ((i + 1) / n, COLOURS[m])]
    fig = go.Figure(go.Heatmap(x=alphas, y=ratios, z=z, zmin=-0.5, zmax=n - 0.5, colorscale=scale, showscale=False,
                               text=text, hoverinfo="text", opacity=0.55))
    for m in index:  # the legend: which colour is which method's lead
        name = f"within {MARGIN:.0%}: too close to call" if m == "tie" else f"{TITLES[m]} leads by {MARGIN:.0%} or more"
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=14, color=COLOURS[m], opacity=0.55)))
    fig.add_trace(go.Scatter(x=[shipped[0]], y=[shipped[1]], mode="markers+text", name="the shipped draft (measured "
                             "acceptance; the profile's draft cost)", text=["shipped draft"], textposition="top right",
                             marker=dict(symbol="star", size=16, color="black")))
    if not drafts.empty:
        fig.add_trace(go.Scatter(x=drafts.alpha, y=drafts.cost, mode="markers+text", text=drafts.draft,
                                 textposition="bottom right", name=f"exit:N drafts (acceptance and cost {TRADEOFF_WHERE})", marker=dict(symbol="diamond", size=10, color="#374151")))
    if paper_alpha is not None:
        fig.add_trace(go.Scatter(x=[paper_alpha], y=[shipped[1]], mode="markers+text", text=["paper (REPORTED)"],
                                 textposition="top left", name=f"the paper's {REPORTED_SPEEDUP}×: REPORTED + MODELLED",
                                 marker=dict(symbol="x", size=14, color="#b45309", line=dict(width=2))))
    fig.update_layout(title=f"Who leads on {profile}, MODELLED: each method at its best window",
                      xaxis_title="the draft's acceptance per token (α)",
                      yaxis=dict(title="draft cost: one draft forward / one target forward", type="log",
                                 tickvals=[0.02, 0.05, 0.1, 0.2, 0.5, 1.0], ticktext=["0.02", "0.05", "0.1", "0.2",
                                                                                      "0.5", "1"]),
                      height=520, margin=dict(l=10, r=10, t=50, b=40), legend=dict(orientation="h", y=-0.22),
                      font=dict(size=14))
    return fig


def map_sentence(tuned: Tuned, profile: str, model: whatif.Profile, shipped: tuple[float, float],
                 hit_rate: float) -> str:
    """The answer read off the map's model at the profile's own draft cost and the shipped draft's
    acceptance: where Mirror-SD passes EAGLE-2, where it leads every method."""
    alpha, cost = shipped
    passes = lead_threshold(tuned, profile, model, hit_rate, cost, against="eagle")
    at_cost = lead_threshold(tuned, profile, model, hit_rate, cost)
    below = cost_threshold(tuned, profile, model, hit_rate, alpha)
    text = (f"**Read off the map (MODELLED, Mirror-SD's hit rate {hit_rate:.2f}):** on {profile}, at the profile's "
            f"draft cost ({cost:.2f} of a target forward), ")
    text += ("Mirror-SD passes EAGLE-2 by 5% at no acceptance up to 0.99" if passes is None else
             f"Mirror-SD passes EAGLE-2 by {MARGIN:.0%} once the draft accepts {passes:.2f} per token")
    text += (" and is never clearly ahead of every method" if at_cost is None else
             f" and leads every method by {MARGIN:.0%} from {at_cost:.2f}")
    text += f"; the shipped draft accepts {alpha:.2f}"
    if below is not None:
        text += (f", and at that acceptance Mirror-SD leads every method wherever a draft forward costs up to "
                 f"{below:.3f} of a target's.")
    else:
        text += ", and at that acceptance Mirror-SD leads at no draft cost on the map."
    return text
