"""The page: layout (gr.Blocks) and event wiring; what the events do is in :mod:`app.handlers`.

Runs go through :mod:`app.race` (the engine's ``stream``); everything on screen is drawn from the
traces those runs record. The app never times anything and never calls a model itself. Methods,
and their options in the "Advanced" drawer, come from the registry ``mirror_sd.METHODS``.
"""
from __future__ import annotations

import re
from types import SimpleNamespace

import gradio as gr
import torch

from mirror_sd import METHODS, load_pair
from mirror_sd.devices import cpu_cores
from mirror_sd.tools.bench import DEFAULT_PROMPTS, first_per_category, read_prompts

from . import figures, handlers, links, models_note, presenter, presets, replay, results_table, whatif
from .handlers import AUTO
from .inputs import LIMITS, ClampedSlider, show_in_range
from .intro import glossary_markdown, how_it_works_html
from .loading import Loader
from .page import Outputs
from .predict import HIT_CHOICES, HIT_QUESTION, guess_choices, guess_made, noted
from .prompt_kinds import typical_prompt
from .tokens import legend_html
from .waiting import Line

QUEUE_SIZE = 16  # runs waiting beyond this are refused with a "queue full" message
INTRO = ("# mirror-sd: a race of decoding methods\n"
         "The same prompt and the same models, decoded by each method the engine has: {pair}.\n\n"
         "Where each number comes from, as its label says: **LIVE**, a race you run (**Run**), timed on the "
         "server showing this page ({here}); **RECORDED**, a race that ran on the machine and the day its name "
         "gives ({machines}), not here; **MODELLED**, re-timed on a hardware profile this page does not have "
         "(What if tab); **REPORTED**, quoted from a paper, not run here (What if tab).")
AFTER_A_RACE = "Run a race, or open a recorded one: {}"
RACING = "Racing: this race's timeline is drawn when it ends."
SERIAL_NOTE = ("Methods run **one after another**, not at the same time: on this machine's {cores} CPU cores, "
               "running them together would distort each other's timings. When all are done, **Replay** "
               "shows the race side by side at the speed each method was measured to decode.")


EXPORT_HELP = (
    "Every file's name starts with the race's stamp: its time for a live race (`race-20261205-203000`), its day, "
    "prompt category and machine for a recorded one (`recorded-20261127-qa-nvidia-h200`).\n"
    "- `<stamp>.zip`: every file below in one download, to hand in.\n"
    "- `<stamp>-summary.csv`: one row per method: the prompt, the target and draft models and their parameters, "
    "the method's options (defaults or paper form), temperature, top-p, seed and max new tokens, where it ran "
    "(LIVE on this server and its processor, or RECORDED with the machine and the day), and the card's numbers: "
    "tokens/s, τ, acceptance, hit rate, ms/step, speedup over vanilla, and whether it committed vanilla's "
    "tokens (at temperature 0; sampling gives the same distribution, not the same text).\n"
    "- `<stamp>-<method>-steps.csv`: one row per step: the token ids it committed, their origins and text, "
    "the draft tokens the target checked and how many it accepted.\n"
    "- `<stamp>-<method>-spans.csv`: one row per span of work on a lane, start and end in seconds.\n"
    "- `<stamp>-<method>.json`: the whole trace with its settings (`Trace.from_json` reads it back).\n"
    "- `<stamp>-<method>.chrome.json`: the spans for [Perfetto](https://ui.perfetto.dev) or chrome://tracing.")


def default_pair(target_device: str | None = None, draft_device: str | None = None):
    """The embedded default target and draft, on the given lanes (None: this machine's defaults)."""
    return load_pair(target_device=target_device, draft_device=draft_device)


def device_choices() -> list[str]:
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return [AUTO, "cpu", *cuda]


def example_prompts() -> list[list[str]]:
    """The first bench prompt (first turn) of each Spec-Bench category."""
    return [[item["turns"][0]] for item in first_per_category(read_prompts(DEFAULT_PROMPTS), 1)]


def plain_help(text: str) -> str:
    """An option's help without the repository file paths some of them cite (a visitor has no checkout)."""
    text = re.sub(r";?\s*[\w./]+\.py\b", "", text)
    return re.sub(r"\(\s*\)", "", text).strip()


def option_controls() -> list[tuple[str, object, gr.Number]]:
    """(method, Option, control) for every option of every registered method: one tab per method in the
    Advanced drawer, each option with its plain help, its default and its range."""
    controls = []
    for name, method in METHODS.items():
        if not method.options:
            continue
        with gr.Tab(method.title):
            gr.Markdown(f"{method.summary[0].upper()}{method.summary[1:]}.")
            with gr.Row():
                for opt in method.options:
                    info = f"{plain_help(opt.help)}. Default {opt.default}; {opt.low} to {opt.high}."
                    box = gr.Number(opt.default, label=opt.name, info=info,
                                    precision=0 if opt.kind is int else None, min_width=220)
                    controls.append((name, opt, box))
    return controls


def _limit_info(name: str) -> str:
    limit = LIMITS[name]
    return f"{limit.low:g} to {limit.high:g}"


def race_tab(names: list[str]) -> SimpleNamespace:
    ui = SimpleNamespace()
    # the results as one table: shown in the presenter view and in homework mode (app.presenter's CSS)
    ui.table = gr.HTML(results_table.table_html({}), elem_id="results-table")
    gr.Markdown(models_note.small_target_note(), elem_id="small-target-race")  # the presenter view's copy
    with gr.Row():
        ui.prompt = gr.Textbox(label="Prompt", value=typical_prompt(example_prompts()[0][0]), lines=3, scale=5,
                               min_width=260)  # the example whose drafts accept the middle amount
        with gr.Column(scale=1, min_width=140):
            ui.run = gr.Button("Run", variant="primary", elem_id="run")
            ui.stop = gr.Button("Stop", variant="stop", elem_id="stop", interactive=False)  # while a race runs
    ui.prompt_info = gr.Markdown(elem_id="prompt-info")  # its tokens, expected prefill and race time here
    gr.Examples(example_prompts(), [ui.prompt], label="Examples: one per Spec-Bench category", cache_examples=False)
    ui.recorded = gr.Dropdown(replay.recorded_races(), value=None, elem_id="recorded",
                              label="Or open a recorded race of an example: instant, no model runs. Each was "
                                    f"measured on another machine ({' or '.join(replay.recorded_machines())}), "
                                    "named with its day in the list")
    with gr.Row():
        ui.methods = gr.CheckboxGroup([(METHODS[n].title, n) for n in names], value=names, label="Methods", scale=3,
                                      min_width=260)
        ui.temperature = gr.Number(0.0, label="Temperature (0 = greedy)", info=_limit_info("temperature"), scale=1,
                                   min_width=140, elem_id="temperature")
        ui.max_tokens = gr.Number(48, label="Max new tokens", info=_limit_info("max_new"), precision=0, scale=1,
                                  min_width=140, elem_id="max-tokens")
        ui.runs = gr.Number(1, label="Runs", info="repeat the race; cards show the median", precision=0, scale=1,
                            min_width=140, elem_id="runs")
    with gr.Row():  # each method's paper configuration, or the defaults chosen on this CPU (app/presets.py)
        ui.form = gr.Radio(presets.FORMS, value=presets.DEFAULTS, label="Settings", elem_id="form", scale=1,
                           min_width=200, info="sets the options in Advanced")
        ui.form_note = gr.Markdown(presets.NOTE, elem_id="form-note")
    with gr.Accordion("Advanced", open=False):
        with gr.Tab("Sampling and devices"):
            with gr.Row():
                ui.top_p = gr.Number(1.0, label="top_p", info="nucleus sampling: keep the likeliest tokens up to this "
                                     "share of probability (1: all). Used when temperature > 0.")
                ui.seed = gr.Number(0, label="seed", precision=0, info="the random seed for sampling")
                ui.target_device = gr.Dropdown(device_choices(), value=AUTO, label="target device",
                                               info="where the target model runs (auto: this machine's default)")
                ui.draft_device = gr.Dropdown(device_choices(), value=AUTO, label="draft device",
                                              info="where the draft model runs (auto: this machine's default)")
        ui.specs = option_controls()
    ui.settings_note = gr.Markdown(elem_id="settings-note")
    ui.wait = gr.Markdown(elem_id="wait")
    ui.status = gr.Markdown(SERIAL_NOTE.format(cores=cpu_cores()), elem_id="status")
    ui.guess = gr.Radio(guess_choices({METHODS[n].title: n for n in names}), value=None, elem_id="guess",
                        label="Predict: which method will be fastest (most tokens per second)? One click, or skip.")
    ui.reveal = gr.Markdown(elem_id="reveal")
    with gr.Row():
        gr.HTML(legend_html())
        ui.show_rejected = gr.Checkbox(False, label="Show rejected draft tokens in the text (struck through)",
                                       elem_id="show-rejected", min_width=200)
    gr.Markdown("Hover any number on a card (dotted underline) for what it means.", elem_id="hover-note")
    with gr.Row(equal_height=False, elem_id="cards"):
        ui.cards = []
        for n in names:
            with gr.Column(min_width=240):
                ui.cards.append(gr.HTML(f"<b>{METHODS[n].title}</b>", elem_id=f"card-{n}", min_height=80))
    ui.replay = gr.Button("Replay the race side by side at measured speed", interactive=False)
    ui.clock = gr.Number(None, visible="hidden", elem_id="replay-clock")  # the replay's clock, ms: the cursor
    ui.timeline = gr.Plot(figures.placeholder(AFTER_A_RACE.format("each method's lanes appear here, span by span.")),
                          label="Timeline: one row per lane, real spans (shared time axis)", elem_id="timeline")
    ui.zoom = gr.Plot(figures.placeholder(AFTER_A_RACE.format("one typical step of each method, side by side.")),
                      label="One typical step of each method, zoomed: a real step of median length (the cards' "
                            "ms/step is each run's mean, reading the prompt included); why one step costs less "
                            "than another (one millisecond axis)", elem_id="zoomed-step")
    return ui


def steps_tab() -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row():
        ui.method = gr.Dropdown([], label="Method", scale=2)
        ui.slider = ClampedSlider(0, 1, value=0, step=1, label="Step", scale=4, elem_id="step")
        ui.prev = gr.Button("◀ Prev", elem_id="prev", min_width=80)
        ui.next = gr.Button("Next ▶", elem_id="next", min_width=80)
        ui.play = gr.Button("Play", elem_id="play", min_width=80)
    ui.sentence = gr.Markdown(AFTER_A_RACE.format("then step through it here, one sentence a step, with its tree."),
                              elem_id="sentence")
    with gr.Row():
        ui.hit_guess = gr.Radio(HIT_CHOICES, value=None, visible=False, elem_id="hit-guess", min_width=260,
                                label=HIT_QUESTION)
        ui.hit_reveal = gr.Markdown(elem_id="hit-reveal")
    ui.text = gr.HTML(elem_id="step-text")
    ui.timeline = gr.Plot(label="This step and its neighbours on the timeline (other steps faded; "
                                "double-click the chart for the whole run)")
    ui.tree = gr.Plot(label="Branches: the step's hypothesis tree", elem_id="tree")
    return ui


def view_bar() -> SimpleNamespace:
    """The view's controls: presenter view, homework mode, and a link to this view with its copy button."""
    ui = SimpleNamespace()
    with gr.Row(elem_id="view-bar", equal_height=True):
        ui.present = gr.Checkbox(False, label="Presenter view", elem_id="present", min_width=160,
                                 info="large text, the results as one table")
        ui.homework = gr.Checkbox(False, label="Homework mode", elem_id="homework", min_width=160,
                                  info="marks which numbers depend on the server's load")
        ui.copy = gr.Button("Copy link to this view", elem_id="copy-link", min_width=160, scale=0)
        ui.link = gr.Textbox(label="Link to this view", elem_id="view-link", interactive=False, scale=2,
                             min_width=200, buttons=["copy"])
    gr.Markdown(links.LIVE_NOTE, elem_id="view-note")
    ui.linked = gr.Textbox("", visible="hidden", elem_id="linked-race")  # a link's race, set when the page opens
    return ui


def wire_view(demo, view, race, steps, tabs, how, results, drawn, tab_events):
    """The view in the URL (race, tab, method, step, modes: app.links), the modes' looks, the results table
    after every race's views, and the view a link names restored when the page opens."""
    for event in drawn:
        event.then(results_table.table_html, [results, view.homework], race.table, api_name=False)
    view.homework.change(results_table.table_html, [results, view.homework], race.table, api_name=False)
    view.homework.change(None, [view.homework], None, js="(on) => mirrorView.mode('homework', on)")
    view.present.change(None, [view.present], None, js="(on) => mirrorView.mode('presenter', on)")
    view.present.change(lambda on: gr.update(open=False) if on else gr.update(), [view.present], how,
                        api_name=False, queue=False)  # the results in sight, not the explainer
    view.copy.click(None, None, view.link, js="() => mirrorView.copy()")
    race.recorded.change(None, [race.recorded], None, js="(path) => mirrorView.race(path)")
    steps.method.change(None, [steps.method], None, js="(method) => mirrorView.set('method', method)")
    steps.slider.change(None, [steps.slider], None, js="(step) => mirrorView.set('step', step)")
    for tab_id, event in tab_events.items():
        event(None, None, None, js=f"() => mirrorView.tab('{tab_id}')")
    restored = demo.load(links.restore, None, [race.recorded, tabs, steps.method, steps.slider, view.present,
                                               view.homework, view.linked], api_name=False,
                         concurrency_limit=None)  # every visitor at once: a class opening one link
    restored.then(None, None, None, js="() => { mirrorView.ready = true; }")  # the URL follows the view from now


def page_style() -> dict:
    """The page's theme, style sheet and head scripts, for ``launch`` (Gradio 6 takes them there)."""
    return dict(theme=presenter.THEME, css=presenter.CSS, head=links.JS + presenter.JS)


def build_demo(pair_factory=None) -> gr.Blocks:
    """The app. ``pair_factory(target_device=..., draft_device=...)`` gives the model pair (tests pass tiny ones)."""
    get_pair = Loader(pair_factory or default_pair)
    names = list(METHODS)
    with gr.Blocks(title="mirror-sd: a race of decoding methods") as demo:
        results = gr.State({})
        seen = gr.BrowserState(False, storage_key="mirror-sd-seen-intro", secret="mirror-sd")
        gr.Markdown(INTRO.format(machines=" or ".join(replay.recorded_machines()), pair=models_note.pair_words(),
                                 here=models_note.processor_name()),
                    elem_id="intro")
        gr.Markdown(models_note.small_target_note(), elem_id="small-target")  # in the presenter view: under the table
        with gr.Accordion("How it works: speculative decoding, EAGLE-2, Mirror-SD and Speculative Streaming in four "
                          "pictures", open=True,
                          elem_id="how") as how:
            gr.HTML(how_it_works_html())
        with gr.Accordion("Glossary: every term on this page, one meaning each", open=False, elem_id="glossary"):
            gr.Markdown(glossary_markdown())
        view = view_bar()
        notice = gr.Markdown(elem_id="notice")
        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Race", id="race") as race_tab_:
                race = race_tab(names)
            with gr.Tab("Utilisation", id="utilisation") as utilisation_tab:
                gr.Markdown("Per lane: the share of the run it spent working, and how that share moved over time. "
                            "Computed from the spans of each run; on NVIDIA GPUs a dotted line adds the GPU's own "
                            "busy readings (NVML), read every 50 ms while the run went on. Each reading is the GPU's "
                            "busy share over the driver's last 1/6 s to 1 s, so on the H200 recordings' short runs "
                            "(30 to 130 ms) there are one to three, mostly about the time before the run; where a "
                            "run has one or none, its chart says so.")
                utilisation = gr.Plot(figures.placeholder(AFTER_A_RACE.format("each lane's busy share appears here.")),
                                      label="Utilisation", elem_id="utilisation")
            with gr.Tab("Step-through", id="steps") as steps_tab_:
                steps = steps_tab()
            with gr.Tab("Export", id="export") as export_tab:
                gr.Markdown(EXPORT_HELP)
                files = gr.File(label="Downloads", file_count="multiple", elem_id="export")
            with gr.Tab("What if", id="whatif") as what_if_tab:
                what_if = whatif.whatif_tab()
        page = Outputs(names, prompt=race.prompt, status=race.status, replay=race.replay, cards=race.cards,
                       results=results, clock=race.clock, timeline=race.timeline, zoom=race.zoom,
                       utilisation=utilisation, files=files, step_method=steps.method)  # app.page: by name
        drawn = wire_race(demo, race, page, get_pair, names, notice, view.linked)
        wire_steps(steps, results, drawn)
        wire_view(demo, view, race, steps, tabs, how, results, drawn,
                  {"race": race_tab_.select, "utilisation": utilisation_tab.select, "steps": steps_tab_.select,
                   "export": export_tab.select, "whatif": what_if_tab.select})
        whatif.wire_whatif(what_if, results, drawn, what_if_tab)
        # drawn while its tab was hidden, the chart took a default width; drawn again when shown, the page's
        utilisation_tab.select(handlers.redraw_utilisation, [results], utilisation, api_name=False)

        def opened():
            yield from handlers.page_open(get_pair)

        loaded = demo.load(opened, None, notice, api_name=False, concurrency_limit=None)  # every visitor at once
        info = handlers.make_prompt_info(get_pair)
        info_inputs = [race.prompt, race.methods, race.max_tokens, race.runs, race.recorded]  # no estimate on a recording
        loaded.then(info, info_inputs, race.prompt_info, api_name=False, show_progress="hidden")
        gr.on([box.change for box in info_inputs], info, info_inputs, race.prompt_info, api_name=False,
              show_progress="hidden", trigger_mode="always_last")  # one event: the last change's line wins
        drawn[0].then(info, info_inputs, race.prompt_info, api_name=False, show_progress="hidden")  # the speed now
        def explainer(was_seen, request: gr.Request):
            """Open on a first visit, closed after, and closed in the presenter view (results in sight)."""
            present = links.flag(request.query_params if request else {}, "present")
            return gr.update(open=not was_seen and not present), True

        demo.load(explainer, [seen], [how, seen], api_name=False)
    return demo


RUN = ("status", "replay", "cards", "results")  # what the Run handler sets (app.page.Page's names)
OPEN_RECORDED = ("prompt", *RUN)  # opening a recorded race: the same, and its prompt
VIEWS = ("timeline", "utilisation", "files", "step_method", "zoom")  # a race's views, once it has run
REPLAY = ("cards", "clock")


def wire_race(demo, race, page: Outputs, get_pair, names, notice, linked):
    """Run (settings checked first, then the race, then its views and the reveal), Stop, Replay, the
    visitor's place in line while waiting, and the end of a visitor's race when their tab closes. The
    device line (``notice``) names a recorded race's devices while it is open, the live lanes for a race.
    A recorded race opens from the dropdown or from a link (``linked``, set when the page opens). Returns
    the events that draw a race's views: after a new race, after a recorded one opens."""
    stops, line = handlers.Stops(), Line()
    results, method = page.components["results"], page.components["step_method"]
    run_fn = _on_gpu(page.wrap(handlers.make_race(get_pair, stops, race.specs, line), *RUN))
    settings = [race.max_tokens, race.temperature, race.top_p, race.seed, race.runs]
    inputs = [race.prompt, race.methods, race.max_tokens, race.temperature, race.top_p, race.seed,
              race.target_device, race.draft_device, race.runs, race.show_rejected, *[box for _, _, box in race.specs]]
    waiting = gr.Timer(1.0, active=False)
    titles = {n: METHODS[n].title for n in names}

    def join(guess, request: gr.Request):
        """Run clicked: a place in line, its message ticking each second, the last race's reveal replaced
        by this race's guess, if any, and Stop live; the last race's timeline and the recorded race's
        name cleared, so nothing on the page speaks for a race no longer shown."""
        line.click(request.session_hash)
        return (line.message(request.session_hash), gr.Timer(active=True), noted(guess, titles),
                gr.update(interactive=True), figures.placeholder(RACING), figures.placeholder(RACING),
                gr.update(value=None))

    def tick(request: gr.Request):
        message = line.message(request.session_hash)
        return message, gr.Timer(active=bool(message))

    length = [race.prompt, race.methods, race.max_tokens, race.runs, race.target_device, race.draft_device]
    checked = race.run.click(handlers.make_check_length(get_pair), length, None, queue=False, api_name=False).success(
        handlers.settle_boxes, settings, [*settings, race.settings_note], queue=False, api_name=False)
    checked.then(join, [race.guess], [race.wait, waiting, race.reveal, race.stop, race.timeline, race.zoom,
                                      race.recorded], queue=False, api_name=False)
    checked.then(handlers.make_live_devices(get_pair), [race.target_device, race.draft_device], notice,
                 api_name=False, show_progress="hidden")
    run = checked.then(run_fn, inputs, page.of(*RUN), api_name="run",
                       concurrency_limit=1, show_progress="minimal",
                       validator=handlers.make_enter(get_pair, line, race.specs))  # queued: in line, one each
    run.then(lambda: gr.update(interactive=False), None, race.stop, queue=False, api_name=False)  # nothing to stop
    views = page.wrap(handlers.views, *VIEWS)  # the step-through's method: a new race keeps it where it ran
    shown = run.then(views, [results, method], page.of(*VIEWS), api_name="views")
    def answer(current, guess):
        """The race's answer to the guess, or with none which method won and why (``handlers.race_answer``),
        and the choice cleared for the next."""
        return handlers.race_answer(current, guess), None

    shown.then(answer, [results, race.guess], [race.reveal, race.guess], api_name=False)
    waiting.tick(tick, None, [race.wait, waiting], queue=False, api_name=False)

    race.guess.input(lambda current, guess: guess_made(current, guess, titles), [results, race.guess], race.reveal,
                     api_name=False)

    def stop(request: gr.Request):
        stops.stop(request.session_hash)

    def gone(request: gr.Request):
        """The tab closed or the connection dropped: end this visitor's race after its current step, and
        never start one it had queued."""
        stops.leave(request.session_hash)
        line.leave(request.session_hash)

    race.stop.click(stop, None, None, api_name="stop", queue=False)
    def pair_for(target_device, draft_device):
        return get_pair(**handlers.lane_devices(target_device, draft_device))

    form_in = [race.form, race.temperature, race.target_device, race.draft_device]
    form_out = [*[box for _, _, box in race.specs], race.form_note]
    race.form.input(presets.make_set_form(pair_for, race.specs), form_in, form_out, api_name=False)
    race.temperature.change(presets.make_follow_temperature(pair_for, race.specs), form_in, form_out, api_name=False)
    recorded = gr.on([race.recorded.input, linked.change], page.wrap(replay.open_recorded, *OPEN_RECORDED),
                     [race.recorded, race.show_rejected], page.of(*OPEN_RECORDED), api_name=False)
    recorded.then(replay.open_recorded_devices, [race.recorded], notice, api_name=False, show_progress="hidden")
    opened = recorded.then(views, [results, method], page.of(*VIEWS), api_name=False)
    opened.then(answer, [results, race.guess], [race.reveal, race.guess], api_name=False)  # a recorded race is over
    demo.unload(gone)
    race.replay.click(page.wrap(handlers.replay, *REPLAY), [results, race.show_rejected], page.of(*REPLAY),
                      api_name="replay", show_progress="hidden")
    race.clock.change(None, [race.clock], None, js=handlers.CURSOR_JS, api_name=False)
    race.show_rejected.change(page.wrap(handlers.rerender, "cards"), [results, race.show_rejected], page.of("cards"),
                              api_name=False)
    race.methods.change(lambda chosen: [gr.update(visible=n in chosen) for n in names], [race.methods], race.cards,
                        api_name=False)
    return shown, opened


def wire_steps(steps, results, drawn):
    """Step-through events; each of ``drawn`` (a race's views drawn: a new race, a recorded one opened)
    draws it again, at the same method and step where the race has them (a link's, when it opened one)."""
    here = [results, steps.method, steps.slider]
    views = [steps.sentence, steps.text, steps.timeline, steps.tree]
    for event in drawn:
        event.then(handlers.pick_method, here, [steps.slider], api_name=False).then(
            handlers.show_step, here, views, api_name=False).then(
            handlers.hit_question, here, [steps.hit_guess, steps.hit_reveal], api_name=False)
    # .input, not .change: a race's views set the method too, and the chains above already follow that
    picked = steps.method.input(handlers.pick_method, here, [steps.slider], api_name=False)
    picked.then(handlers.show_step, here, views, api_name=False).then(
        handlers.hit_question, here, [steps.hit_guess, steps.hit_reveal], api_name=False)
    show_in_range(steps.slider)
    steps.slider.change(handlers.show_step, here, views, api_name="step")
    steps.slider.change(handlers.hit_question, here, [steps.hit_guess, steps.hit_reveal], api_name=False)
    steps.hit_guess.input(handlers.answer_hit, [*here, steps.hit_guess], steps.hit_reveal, api_name=False)
    playing = steps.play.click(handlers.play, here, [steps.slider], api_name=False)
    for button, delta in ((steps.prev, -1), (steps.next, 1)):
        button.click(lambda c, m, i, d=delta: handlers.move(c, m, i, d), here, [steps.slider], api_name=False,
                     cancels=[playing])


def _on_gpu(fn):
    """On a Hugging Face ZeroGPU Space, ask for a GPU while ``fn`` runs; elsewhere ``fn`` unchanged.

    ZeroGPU runs the decorated function in a forked process (lanes start new workers there, see
    mirror_sd.devices); ``spaces.GPU`` does nothing on other Space hardware.
    """
    try:
        import spaces
    except ImportError:  # not on a Space
        return fn
    return spaces.GPU(fn)


def serve(host: str | None = None, port: int | None = None, pair_factory=None):
    """Build and serve the app (host/port None: Gradio's defaults or GRADIO_SERVER_NAME/PORT) on the
    models ``pair_factory`` loads (None: the embedded pair)."""
    build_demo(pair_factory).queue(max_size=QUEUE_SIZE).launch(server_name=host, server_port=port, **page_style())
