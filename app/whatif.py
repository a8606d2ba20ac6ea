"""The "What if" tab: the race just run, re-timed on another machine's profile (mirror_sd/tools/whatif.py).

Everything drawn here is MODELLED: the steps (windows, trees, branches, hits) are this run's, the
time each piece of work takes comes from a hardware profile. The banner says so on every view.
The table puts the speedup measured in the race beside the one modelled there; the controls swap this
run's acceptance and Mirror-SD hit rate for chosen ones. Below, the draft-capacity view
(app/capacity.py): the recorded trade-off run, measured and modelled, beside the paper's Table 1.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import gradio as gr
import pandas as pd

from mirror_sd.errors import MirrorSDError
from mirror_sd.tools import whatif
from mirror_sd.trace import SpanKind

from . import capacity, figures, held_out, tuned
from .cards import baseline
from .inputs import ClampedSlider, show_in_range
from .repeat import middle

FITTED = "the race's own machine (fitted to its spans)"
DEFAULT_PROFILE = "paper-14b"
BANNER = ("<div id='whatif-banner' style='background:#fef3c7;border:3px solid #b45309;border-radius:8px;"
          "padding:10px 14px;font-size:1.15em;color:#78350f'><b>MODELLED from this run's steps, not measured.</b> "
          "The windows, trees, branches and hits are this run's; how long each piece of work takes comes from the "
          "hardware profile you pick. No model ran on that hardware.</div>")
ASSUMES = """**What the model assumes.** A step costs what its work costs on the profile, stage by stage:
vanilla one target forward; sd its draft forwards, then one target forward over the window; EAGLE its head
steps, then one target forward over the tree; Mirror-SD the target's layers up to the early exit, the token
channel, then **the larger of** the target's remaining layers and the draft's branch rollouts (they run on two
devices at once), then the rendezvous. On a miss no branch holds the next window, so a fresh draft runs first,
on the critical path: the more often it misses, the more those fallbacks, not the overlap, decide Mirror-SD's
step time. This small pair's acceptance and hit rate carry over to the profile's bigger models; a bigger pair
with a stronger draft would accept more and hit more. Untick the box below to set the draft model's acceptance per
token, Mirror-SD's hit rate and the window: sd and Mirror-SD are then priced as the map prices them (a typical step,
with the tune's best settings for the profile), EAGLE and Speculative Streaming at their own acceptance."""

NOTHING = (gr.update(visible=False), "", None, None)  # the race's views, before a race
BEST_WINDOW = "each method's best"
TITLE = tuned.TITLES


def profile_choices() -> list[str]:
    return whatif.profile_names() + [FITTED]


def whatif_tab() -> SimpleNamespace:
    """The tab's components; call inside a ``gr.Tab``."""
    ui = SimpleNamespace()
    gr.HTML(BANNER)
    with gr.Row():
        ui.profile = gr.Dropdown(profile_choices(), value=DEFAULT_PROFILE, label="Hardware profile",
                                 elem_id="whatif-profile")
        ui.draft_speed = ClampedSlider(0.05, 2.0, value=whatif.load_profile(DEFAULT_PROFILE).draft_speed, step=0.05,
                                       label="Speed of the draft's device, relative to the profile's figures for it")
    with gr.Accordion("Where this profile's figures come from", open=False):
        ui.source = gr.Markdown()
    gr.Markdown("### When does Mirror-SD beat EAGLE on this profile?")
    ui.verdict = gr.Markdown(elem_id="whatif-verdict")
    ui.best = gr.Dataframe(label=f"Each method at its best settings for this profile: settings, τ and hits "
                                 f"{tuned.TUNE_WHERE}; speedups and step times MODELLED on the profile", interactive=False, elem_id="whatif-best", wrap=True,
                           column_widths=["13%", "37%", "9%", "9%", "16%", "16%"])
    ui.map = gr.Plot(label="Where each method leads, MODELLED", elem_id="whatif-map")
    ui.map_text = gr.Markdown(elem_id="whatif-map-text")
    gr.Markdown(tuned.CAPTION)
    gr.Markdown("### This race, re-timed on the profile")
    ui.table = gr.Dataframe(label="Speedup over vanilla: measured in the race (LIVE, or RECORDED where the race's "
                                  "name gives a machine and day) vs MODELLED on the profile", interactive=False,
                            elem_id="whatif-table", wrap=True, visible=False)
    ui.why = gr.Markdown(elem_id="whatif-why")
    ui.timeline = gr.Plot(label="MODELLED timeline: this run's steps on the profile's devices", elem_id="whatif-timeline")
    ui.utilisation = gr.Plot(label="MODELLED utilisation of the profile's devices", elem_id="whatif-utilisation")
    gr.Markdown(ASSUMES)
    with gr.Row():
        ui.own = gr.Checkbox(True, label="Use this run's acceptance and hit rate")
        ui.alpha = ClampedSlider(0.05, 0.95, value=0.6, step=0.05, label="The draft model's acceptance per token "
                                 "(sd, Mirror-SD)", visible=False)  # shown only when the controls, not the run, set it
        ui.hit = ClampedSlider(0.0, 1.0, value=0.5, step=0.05, label="Mirror-SD hit rate", visible=False)
        ui.window = gr.Dropdown([BEST_WINDOW, *map(str, whatif.MAP_GAMMAS)], value=BEST_WINDOW, visible=False,
                                label="Window: draft tokens per step (sd, Mirror-SD)", elem_id="whatif-window")
    gr.Markdown("### Draft capacity: when does Mirror-SD pay?")
    ui.curve = gr.Plot(label=f"Speedup as the draft grows: {tuned.TRADEOFF_WHERE} (solid), MODELLED on the "
                             "profile (dashed)",
                       elem_id="whatif-curve")
    ui.capacity = gr.Markdown(elem_id="whatif-capacity")
    gr.Markdown(capacity.REPORTED_CAPTION)
    gr.Dataframe(capacity.REPORTED, label="REPORTED (Bhendawade et al., 2025, Table 1): speedup over autoregressive",
                 interactive=False, elem_id="whatif-reported")
    return ui


def wire_whatif(ui, results, drawn, tab):
    """Redraw after every race's views are drawn (``drawn``: a new race, a recorded one opened), when
    the tab opens and whenever a control moves."""
    inputs = [results, ui.profile, ui.draft_speed, ui.own, ui.alpha, ui.hit, ui.window]
    outputs = [ui.source, ui.table, ui.why, ui.timeline, ui.utilisation, ui.curve, ui.capacity, ui.verdict, ui.best,
               ui.map, ui.map_text]
    for event in drawn:
        event.then(render, inputs, outputs, api_name=False)
    tab.select(render, inputs, outputs, api_name=False)
    ui.profile.change(speed_of, [ui.profile, results], ui.draft_speed, api_name=False).then(
        render, inputs, outputs, api_name=False)
    for slider in (ui.draft_speed, ui.alpha, ui.hit):  # dragged or typed; a drag redraws once, at its last value
        show_in_range(slider)
        slider.change(render, inputs, outputs, api_name=False, trigger_mode="always_last")
    ui.window.change(render, inputs, outputs, api_name=False, trigger_mode="always_last")
    ui.own.change(lambda own: (gr.update(visible=not own),) * 3, [ui.own], [ui.alpha, ui.hit, ui.window], queue=False,
                  api_name=False).then(render, inputs, outputs, api_name=False)


def speed_of(name, current):
    """The draft-speed slider at the newly picked profile's own value."""
    try:
        return profile_for(name, current).draft_speed
    except MirrorSDError:
        return gr.update()


def race_runs(current) -> dict:
    """Finished runs of the race with decoding steps, by method."""
    return {m: r for m, r in (current or {}).items() if r.trace.steps[1:] and r.trace.spans}


def profile_for(name: str, current) -> whatif.Profile:
    if name == FITTED:
        runs = race_runs(current)
        if not runs:
            raise MirrorSDError("run a race first: this profile is fitted to its spans")
        return whatif.fit_profile([r.trace for r in runs.values()], name="the race's own machine",
                                  source="fitted to the spans of the race just run (in sample: it should give back "
                                         "roughly what was measured)")
    return whatif.load_profile(name)


def render(current, name, draft_speed, own, alpha, hit, window=None):
    """Every view of the tab for one profile and one setting of the controls."""
    trade, trade_text = capacity_view(name)
    knobs = dict(alpha=None, hit_rate=None, window=None) if own else \
        dict(alpha=alpha, hit_rate=hit, window=None if window in (None, BEST_WINDOW) else int(window))
    answer = best_view(name, draft_speed, knobs)
    runs = race_runs(current)
    if not runs:
        return ("Run a race, or open a recorded one, first: the What if view re-times its steps.", *NOTHING,
                trade, trade_text, *answer)
    try:
        profile = profile_for(name, current)
    except MirrorSDError as e:
        return f"**{e}**", *NOTHING, trade, trade_text, *answer
    if name != FITTED:
        profile = profile.with_draft_speed(draft_speed)
    modelled = {f"{r.title} (MODELLED)": profile.retime(r.trace) for r in runs.values()}
    charts = (figures.timeline(modelled), figures.utilisation(modelled))
    why = (own_text(runs) + "\n\n" if own else "") + why_text(runs, profile, knobs)
    return (source_text(profile), gr.update(value=speedup_table(current, runs, profile, knobs, name), visible=True),
            why, *map(figures.fresh, charts), trade, trade_text, *answer)  # fresh: drawn at the tab's width


def tuned_profile(name: str) -> str:
    """The tune's profile for the dropdown's choice (the race's own machine: the tune's, fitted to its spans)."""
    return tuned.THIS_MACHINE if name == FITTED else name


def best_view(name: str, draft_speed: float, knobs: dict):
    """The verdict, the best-settings table, the map and its sentence for the chosen profile, from the
    recorded tune run; the map at the controls' hit rate where they are in use, else at the measured
    hit rate of Mirror-SD's best setting there."""
    recorded = tuned.load()
    profile = tuned_profile(name)
    if recorded is None or profile not in set(recorded.best.profile):
        return (f"No recorded tune run covers {profile} (python -m mirror_sd tune --out app/tuned records one).",
                None, None, "")
    hit = knobs["hit_rate"] if knobs["hit_rate"] is not None else tuned.hit_rate_of(recorded, profile)
    verdict, table, chart, text = answer(name, None if name == FITTED else float(draft_speed), float(hit))
    return verdict, table, figures.fresh(chart), text


@functools.lru_cache(maxsize=64)
def answer(name: str, draft_speed: float | None, hit: float):
    """``best_view``'s views for one profile, draft speed and hit rate (the map takes a second to price)."""
    recorded, profile = tuned.load(), tuned_profile(name)
    model = tuned.profile_for(recorded, profile, draft_speed)
    table = tuned.lead_map(recorded, profile, model, hit)
    shipped = (tuned.draft_alpha(recorded), model.draft_ratio())
    paper_alpha, paper_text = tuned.paper_point(recorded, profile, model, hit)
    chart = tuned.map_figure(table, profile, shipped, tuned.exit_drafts(), paper_alpha)
    text = tuned.map_sentence(recorded, profile, model, shipped, hit) + " " + paper_text
    return (tuned.verdict(recorded, profile) + "\n\n" + trust_text(name) + "\n\n" + tuned.caption(recorded, profile),
            tuned.best_table(recorded, profile), chart, text)


def trust_text(name: str) -> str:
    """How far the profile's model has been checked against measured runs it was not fitted on."""
    if name == held_out.PROFILE:
        pooled = held_out.pooled()
        checks = "; ".join(f"{TITLE[m]} {r.measured_speedup:.2f}× measured, {r.modelled_speedup:.2f}× MODELLED "
                           f"({r.error:+.0%})" for m, r in pooled.iterrows() if m != "vanilla")
        text = (f"**How far to trust this profile:** checked on the six races recorded on an H200, which it was not "
                f"fitted on (each method's speedup, pooled over the six): {checks}.")
        for r in held_out.worst().itertuples():
            kind, measured, modelled = held_out.largest_gap(r.race, r.method)
            text += (f" Off by more than 15%: {TITLE[r.method]} on {r.race} ({r.error:+.0%}), where one {kind} took "
                     f"{measured:.2f} ms against {modelled:.2f} MODELLED, a cost the profile does not price.")
        return text
    if name == FITTED:
        return ("**How far to trust this profile:** it is fitted to the spans of the tune's own runs on the processor "
                "named below, so it gives back roughly what was measured there (in sample).")
    return ("**How far to trust this profile:** no run on this hardware checks it: its figures are forward times "
            "measured on other models or GPUs (the drawer above says which), so read its numbers as a model's.")


def capacity_view(name: str):
    """The recorded trade-off run's chart and sentences for the chosen profile (the race's own
    machine: the trade-off run's, fitted to its spans), or a note where none ships."""
    recorded = capacity.load()
    if recorded is None:
        return None, "No trade-off run ships with this copy (python -m mirror_sd tradeoff records one)."
    measured, modelled, meta = recorded
    profile = capacity.THIS_MACHINE if name == FITTED else name
    chart = figures.fresh(capacity.figure(measured, modelled, profile, meta))
    return chart, capacity.sentences(measured, modelled, profile, tuned.recorded(meta)) + "\n\n" + \
        capacity.caption(meta)


def own_text(runs) -> str:
    """This run's own acceptance per draft token (from τ and the window) and Mirror-SD's hit rate:
    what the steady-state column uses while the box is ticked."""
    parts = []
    for method, r in runs.items():
        window = r.trace.meta.get("options", {}).get(whatif.WINDOW_OPTION.get(method, ""), 0)
        steps = r.trace.steps[1:]
        if method == "vanilla" or not window or not steps:
            continue
        tau = sum(len(s.committed) for s in steps) / len(steps)
        parts.append(f"{r.title} α {whatif.acceptance_of(tau, window):.2f} (τ {tau:.2f}, window {window})")
        if method == "mirror":
            parts.append(f"Mirror-SD hit rate {sum(bool(s.rendezvous.hit) for s in steps) / len(steps):.2f}")
    return ("**This run's own acceptance and hit rate** (the long-run column uses them: the decoding steps alone, "
            "the prompt's reading left out): " + "; ".join(parts) + ".")


def source_text(profile: whatif.Profile) -> str:
    devices = ", ".join(f"{role}: {device}" for role, device in profile.devices.items())
    shipped = whatif.load_profile(profile.name).draft_speed if profile.name in whatif.profile_names() else None
    assumed = f" (the profile's own assumption: {shipped:g}×)" if shipped not in (None, profile.draft_speed) else ""
    return (f"**Profile {profile.name}** ({devices}). The draft device runs at {profile.draft_speed:g}× the speed of "
            f"the profile's draft figures{assumed}. {profile.notes}\n\n<small>Source: {profile.source}</small>")


def speedup_table(current, runs, profile, knobs, name) -> pd.DataFrame:
    """Per method: tokens per step, speedup measured in the race (when vanilla ran), and MODELLED speedup
    there with this run's steps, and in steady state (``steady_text``)."""
    rate = baseline(current)
    rows = []
    for method, r in runs.items():
        row = whatif.summary(r.trace, profile)
        layers = r.trace.meta.get("target_layers") or 30
        rows.append({"method": r.title,
                     "settings in this race": tuned.in_words(method, r.trace.meta.get("options", {}), layers),
                     "τ this run": round(r.metrics.get("mean_accepted", 0.0), 3),
                     "measured in the race": (f"{middle(r, 'tokens_per_s') / rate:.2f}×" if rate and r.metrics else "—"),
                     f"MODELLED on {profile.name}": f"{row['vanilla_seconds'] / row['seconds']:.2f}×",
                     "MODELLED step ms": round(1000 * row["step_seconds"] / row["steps"], 2),
                     "MODELLED in the long run (controls)": steady_text(r.trace, profile, knobs, name)})
    return pd.DataFrame(rows)


def steady_text(trace, profile, knobs, name) -> str:
    """A run's steady state: its own steps and acceptance; or, under the controls, sd and Mirror-SD as
    the map prices them (a typical step at the controls' acceptance, hit rate and window, or the best
    window, with the tune's best settings for the profile), EAGLE and ss at their own acceptance."""
    recorded = tuned.load()
    method, profile_name = trace.method, tuned_profile(name)
    if knobs["alpha"] is not None and method in ("sd", "mirror") and recorded is not None \
            and profile_name in set(recorded.best.profile):
        s = tuned.controls_speedup(recorded, profile_name, profile, method, knobs["alpha"], knobs["hit_rate"],
                                   knobs["window"])
        form = ", streams" if s["streams"] else ""
        return f"{s['speedup']:.2f}× at τ {s['tokens_per_step']:.2f} (window {s['gamma']}{form})"
    s = whatif.steady_state(trace, profile)
    return f"{s['speedup']:.2f}× at τ {s['tokens_per_step']:.2f}"


PART_WORDS = {"host": "the host's turns", SpanKind.TARGET_PREFIX: "target prefix", "token channel": "token channel",
              f"{SpanKind.TARGET_SUFFIX} | {SpanKind.DRAFT_ROLLOUT}":
                  "the larger of the target suffix and the draft's rollouts",
              "verify + match branch": "rendezvous", SpanKind.FALLBACK_DRAFT: "fresh drafts after misses",
              SpanKind.CORRECTION_ROLLOUT: "what correction rollouts outlast", SpanKind.DRAFT: "draft",
              SpanKind.VERIFY: "verify", SpanKind.DECODE: "one target forward"}


def parts_text(trace, profile) -> str:
    """Every part of a run's modelled step time, the host's turns included, and their sum: the
    table's step time (``whatif.step_parts``)."""
    parts = whatif.step_parts(trace, profile)
    named = " + ".join(f"{PART_WORDS.get(name, name)} {ms:.2f} ms" for name, ms in parts.items())
    return f"{named} = **{sum(parts.values()):.2f} ms**"


def why_text(runs, profile, knobs) -> str:
    """Where Mirror-SD's and EAGLE's modelled step time goes on this profile, part by part (the parts
    sum to the table's step time), and the hit rate at which Mirror-SD would lead EAGLE with this
    run's settings."""
    if "mirror" not in runs:
        return ""
    trace = runs["mirror"].trace
    ms = whatif.mean_work_ms(trace, profile)
    suffix, rollouts = ms.get(SpanKind.TARGET_SUFFIX, 0.0), ms.get(SpanKind.DRAFT_ROLLOUT, 0.0)
    hides = ("the rollouts hide under the suffix" if rollouts <= suffix else
             "the rollouts do not fit under the suffix, so the draft sets the pace")
    steps = trace.steps[1:]
    misses = sum(not s.rendezvous.hit for s in steps) / len(steps)
    miss = ("the draft's correction rollout, begun at the last step's picks, holds the next window, and what of "
            "it outlasts the host's turn between the steps is on the critical path" if whatif.corrects(trace) else
            "the next step first drafts afresh on the critical path")
    text = (f"**Mirror-SD's step here (MODELLED, mean over this run's steps):** {parts_text(trace, profile)}, the "
            f"table's step time. The target suffix ({suffix:.2f} ms) and the draft's rollouts ({rollouts:.2f} ms) run "
            f"on two devices at once: {hides}. A miss leaves no branch to continue from, so {miss}: "
            f"{whatif.fallback_ms(trace, profile):.2f} ms (this run missed {misses:.0%} of its steps).")
    if "eagle" in runs:
        eagle = runs["eagle"].trace
        lead = whatif.hit_rate_to_lead(trace, eagle, profile, knobs["alpha"])
        acceptance = "this run's acceptance" if knobs["alpha"] is None else f"acceptance α = {knobs['alpha']:.2f}"
        text += (f"\n\n**EAGLE's step:** {parts_text(eagle, profile)}, on the target's device alone. With this "
                 f"run's Mirror-SD settings (window {trace.meta.get('options', {}).get('gamma', 2)}) and {acceptance}, "
                 + (f"Mirror-SD leads EAGLE on this profile from a hit rate of {lead:.2f}." if lead is not None else
                    "Mirror-SD does not lead EAGLE on this profile at any hit rate: its step commits too few tokens "
                    "for what it costs. Each method at its best settings: above."))
    return text
