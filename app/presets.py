"""Two settings forms for the race: the registry's defaults, and each method's paper form.

The defaults (``mirror_sd.METHODS``) were chosen on this project's 2-core CPU, where the papers'
settings decoded slower (docs/tune.md); the papers ran on GPUs and NPUs, with bigger models. "Paper
form" sets each method to its paper's own configuration, so a student can race both and see what the
choice does. A run in paper form says so on its card and in the exports (``trace.meta["form"]``).
"""
from __future__ import annotations

import gradio as gr

from mirror_sd import METHODS

DEFAULTS, PAPER = "defaults (chosen on a 2-core CPU)", "paper form"
FORMS = [DEFAULTS, PAPER]

# Per method: its paper's options where they differ from the defaults, and where they come from.
# Mirror-SD's depend on the pair (its layers, its draft's streams): ``paper_options`` adds them.
PAPER_FORM = {
    "ss": ({"one_forward": 1, "lookup": 0},
           "Speculative Streaming (arXiv 2402.11131): one target forward per step verifies the draft and "
           "drafts the next with its streams; no copying from the context"),
    "eagle": ({"depth": 6, "top_k": 10, "total_tokens": 60, "lookup": 0},
              "EAGLE-2 (arXiv 2406.16858): its reference tree of 6 levels, 10 children per node, 60 nodes; "
              "no copying from the context"),
    "mirror": ({"lookup": 0},
               "Mirror-SD (arXiv 2510.13161): gamma 7, kappa 8, the exit at half the target's layers, the draft "
               "drafting with its own speculative streams (mirror_sd.tools.tune.paper_settings, as tune runs "
               "it); no copying from the context"),
}

NOTE = ("**Paper form** sets Speculative Streaming to its single pass (`one_forward` 1), Mirror-SD to the draft's "
        "own speculative streams (`streams` 1) with the early exit at half the target's layers (and the paper's "
        "gamma 7 and kappa 8, as far as the draft's streams reach), EAGLE-2 to its reference tree (6 levels, "
        "top-k 10, 60 nodes), and turns copying from the context off (`lookup` 0; prompt lookup is this "
        "project's addition, in no paper) for all three. Vanilla and speculative decoding have no "
        "paper-specific settings. **The defaults** differ because they were chosen on this "
        "project's 2-core CPU, where the papers' settings decoded slower: in the recorded tune run "
        "(docs/tune.md, app/tuned/, a busy machine, so rough) Speculative Streaming's single pass measured "
        "0.90x vanilla against 1.25x for its two passes, EAGLE-2's 60-node tree 0.73x, and Mirror-SD's paper "
        "configuration 1.09x against 1.53x for the setting tune picked for that CPU. The papers ran on GPUs "
        "and NPUs, with bigger models.")
HOT_NOTE = (" At temperature {t:g} the options that act at temperature 0 only (`lookup`, tree sizes) stay at "
            "their defaults: they do nothing when sampling.")


def paper_options(pair) -> dict[str, dict]:
    """{method: options} of the paper form on ``pair``: Mirror-SD's window, channel, exit layer and
    streams from ``paper_settings`` (the draft's streams only where it has them)."""
    from mirror_sd.tools.tune import paper_settings

    options = {m: dict(values) for m, (values, _) in PAPER_FORM.items()}
    options["mirror"].update(paper_settings(pair))
    return options


def acting(method: str, options: dict, temperature: float) -> dict:
    """``options`` less those that do nothing at this temperature (greedy-only options at T > 0)."""
    greedy = {o.name for o in METHODS[method].options if o.greedy_only}
    return {k: v for k, v in options.items() if not (temperature > 0 and k in greedy)}


def control_values(specs, form: str, pair, temperature: float = 0.0) -> list:
    """The Advanced drawer's values for ``form``: every option at its default, and in paper form the
    paper's where they act at this temperature. ``specs``: the drawer's (method, Option, control)."""
    paper = paper_options(pair) if form == PAPER else {}
    chosen = {m: acting(m, values, temperature) for m, values in paper.items()}
    return [chosen.get(method, {}).get(opt.name, opt.default) for method, opt, _ in specs]


def form_of(pair, method: str, options: dict, temperature: float) -> str | None:
    """PAPER when a run's resolved ``options`` hold every paper setting of ``method`` that acts at this
    temperature, else None (the defaults, or the visitor's own settings)."""
    paper = paper_options(pair).get(method)
    if not paper:
        return None
    wanted = acting(method, paper, temperature)
    return PAPER if all(options.get(k) == v for k, v in wanted.items()) else None


def mark(results: dict, pair, temperature: float):
    """Write each finished run's form into its trace's meta (the card's label and the exports read it)."""
    for r in results.values():
        if r.trace.meta.get("options") is not None:
            r.trace.meta["form"] = form_of(pair, r.method, r.trace.meta["options"], temperature)


def label(result) -> str:
    """The card head's label: 'paper form' for a run in its paper's configuration, else ''."""
    return PAPER if result.trace.meta.get("form") == PAPER else ""


def make_set_form(pair_for, specs):
    """The Settings radio's handler: the Advanced drawer's boxes set to the chosen form, and the note under
    it. ``pair_for(target_device, draft_device)`` gives the pair the race will use (the paper form reads
    its layers and its draft's streams), loading it if it is not yet."""

    def set_form(form, temperature, target_device, draft_device):
        t = float(temperature or 0)
        pair = pair_for(target_device, draft_device) if form == PAPER else None
        note = NOTE + (HOT_NOTE.format(t=t) if form == PAPER and t > 0 else "")
        return (*control_values(specs, form, pair, t), note)

    return set_form


def make_follow_temperature(pair_for, specs):
    """On a new temperature, the paper form's boxes again (its options that act at temperature 0 only go
    back to their defaults when sampling, which the engine would refuse otherwise); nothing changes in
    the defaults form, so a visitor's own settings stay."""
    set_form = make_set_form(pair_for, specs)

    def follow(form, temperature, target_device, draft_device):
        if form != PAPER:
            return (gr.update(),) * (len(specs) + 1)
        return set_form(form, temperature, target_device, draft_device)

    return follow
