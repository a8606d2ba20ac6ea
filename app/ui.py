"""The page: layout (gr.Blocks) and event wiring; what the events do is in :mod:`app.handlers`.

Runs go through :mod:`app.race` (the engine's ``stream``); everything on screen is drawn from the
traces those runs record. The app never times anything and never calls a model itself. Methods,
and their options in the "Advanced" drawer, come from the registry ``mirror_sd.METHODS``.
"""
from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace

import gradio as gr
import torch

from mirror_sd import METHODS, MirrorSDError, load_pair
from mirror_sd.bench import DEFAULT_PROMPTS, first_per_category, read_prompts
from mirror_sd.devices import cpu_cores

from . import handlers
from .handlers import AUTO
from .tokens import legend_html

QUEUE_SIZE = 16  # runs waiting beyond this are refused with a "queue full" message
INTRO = ("# mirror-sd: a race of decoding methods\n"
         "The same prompt and the same models, decoded by each method the engine has. Every number, "
         "timeline and tree below comes from a real run on the machine serving this page.")
SERIAL_NOTE = ("Methods run **one after another**, not at the same time: on this machine's {cores} CPU cores, "
               "running them together would distort each other's timings. When all are done, **Replay** "
               "shows the race side by side at the speed each method was measured to decode.")


@lru_cache(maxsize=1)
def default_pair(target_device: str | None = None, draft_device: str | None = None):
    """The embedded default target and draft, on the given lanes (None: this machine's defaults)."""
    return load_pair(target_device=target_device, draft_device=draft_device)


def device_choices() -> list[str]:
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return [AUTO, "cpu", *cuda]


def example_prompts() -> list[list[str]]:
    """The first bench prompt (first turn) of each Spec-Bench category."""
    return [[item["turns"][0]] for item in first_per_category(read_prompts(DEFAULT_PROMPTS), 1)]


def option_controls() -> list[tuple[str, object, gr.Number]]:
    """(method, Option, control) for every option of every registered method, in the Advanced drawer."""
    controls = []
    for name, method in METHODS.items():
        if not method.options:
            continue
        with gr.Group():
            gr.Markdown(f"**{method.title}** (`{name}`)")
            with gr.Row():
                for opt in method.options:
                    box = gr.Number(opt.default, label=opt.name, info=f"{opt.help} [{opt.low}–{opt.high}]",
                                    precision=0 if opt.kind is int else None, min_width=160)
                    controls.append((name, opt, box))
    return controls


def race_tab(names: list[str]) -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row():
        ui.prompt = gr.Textbox(label="Prompt", value=example_prompts()[0][0], lines=3, scale=5)
        with gr.Column(scale=1, min_width=140):
            ui.run = gr.Button("Run", variant="primary", elem_id="run")
            ui.stop = gr.Button("Stop", variant="stop", elem_id="stop")
    gr.Examples(example_prompts(), [ui.prompt], label="Examples: one per Spec-Bench category", cache_examples=False)
    with gr.Row():
        ui.methods = gr.CheckboxGroup([(METHODS[n].title, n) for n in names], value=names, label="Methods", scale=3)
        ui.temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)", scale=2)
        ui.max_tokens = gr.Slider(1, 512, value=48, step=1, label="Max new tokens", scale=2)
    with gr.Accordion("Advanced", open=False):
        with gr.Row():
            ui.top_p = gr.Number(1.0, label="top_p", info="nucleus sampling, (0, 1]")
            ui.seed = gr.Number(0, label="seed", precision=0)
            ui.target_device = gr.Dropdown(device_choices(), value=AUTO, label="target device")
            ui.draft_device = gr.Dropdown(device_choices(), value=AUTO, label="draft device")
        ui.specs = option_controls()
    ui.status = gr.Markdown(SERIAL_NOTE.format(cores=cpu_cores()))
    gr.HTML(legend_html())
    with gr.Row(equal_height=False):
        ui.cards = [gr.HTML(f"<b>{METHODS[n].title}</b>", elem_id=f"card-{n}", min_height=80) for n in names]
    ui.replay = gr.Button("Replay the race side by side at measured speed", interactive=False)
    ui.timeline = gr.Plot(label="Timeline: one row per lane, real spans (shared time axis)", elem_id="timeline")
    return ui


def steps_tab() -> SimpleNamespace:
    ui = SimpleNamespace()
    with gr.Row():
        ui.method = gr.Dropdown([], label="Method", scale=2)
        ui.slider = gr.Slider(0, 1, value=0, step=1, label="Step", scale=4, elem_id="step")
        ui.prev = gr.Button("◀ Prev", elem_id="prev", min_width=80)
        ui.next = gr.Button("Next ▶", elem_id="next", min_width=80)
        ui.play = gr.Button("Play", elem_id="play", min_width=80)
    ui.sentence = gr.Markdown(elem_id="sentence")
    ui.text = gr.HTML()
    ui.timeline = gr.Plot(label="This step and its neighbours on the timeline (other steps faded; "
                                "double-click the chart for the whole run)")
    ui.tree = gr.Plot(label="Branches: the step's hypothesis tree")
    return ui


def build_demo(pair_factory=None) -> gr.Blocks:
    """The app. ``pair_factory(target_device=..., draft_device=...)`` gives the model pair (tests pass tiny ones)."""
    get_pair = pair_factory or default_pair
    names = list(METHODS)
    with gr.Blocks(title="mirror-sd: a race of decoding methods") as demo:
        results = gr.State({})
        gr.Markdown(INTRO)
        notice = gr.Markdown()
        with gr.Tab("Race"):
            race = race_tab(names)
        with gr.Tab("Utilisation"):
            gr.Markdown("Per lane: the share of the run it spent working, and how that share moved over time. "
                        "Computed from the spans of each run; on NVIDIA GPUs a dotted line adds the GPU's own "
                        "busy readings (NVML), sampled while the run went on.")
            utilisation = gr.Plot(label="Utilisation", elem_id="utilisation")
        with gr.Tab("Step-through"):
            steps = steps_tab()
        with gr.Tab("Export"):
            gr.Markdown("Each method's trace: spans and steps as CSV, the trace as JSON (`Trace.from_json` "
                        "reads it back), and Chrome-trace JSON for [Perfetto](https://ui.perfetto.dev).")
            files = gr.File(label="Downloads", file_count="multiple")
        wire_race(race, results, get_pair, names, [race.timeline, utilisation, files, steps.method])
        wire_steps(steps, results)
        demo.load(lambda: notice_for(get_pair), None, notice, api_name=False)
    return demo


def wire_race(race, results, get_pair, names, view_outputs):
    stops = handlers.Stops()
    run_fn = _on_gpu(handlers.make_race(get_pair, stops, race.specs, names))
    inputs = [race.prompt, race.methods, race.max_tokens, race.temperature, race.top_p, race.seed,
              race.target_device, race.draft_device, *[box for _, _, box in race.specs]]
    run = race.run.click(run_fn, inputs, [race.status, race.replay, *race.cards, results], api_name="run",
                         concurrency_limit=1)
    run.then(handlers.views, [results], view_outputs, api_name="views")

    def stop(request: gr.Request):
        stops.stop(request.session_hash)

    race.stop.click(stop, None, None, api_name="stop", queue=False)
    race.replay.click(handlers.make_replay(names), [results], [*race.cards, race.timeline], api_name=False)
    race.methods.change(lambda chosen: [gr.update(visible=n in chosen) for n in names], [race.methods], race.cards,
                        api_name=False)


def wire_steps(steps, results):
    here = [results, steps.method, steps.slider]
    views = [steps.sentence, steps.text, steps.timeline, steps.tree]
    steps.method.change(handlers.pick_method, [results, steps.method], [steps.slider], api_name=False)
    steps.method.change(handlers.show_step, here, views, api_name=False)
    steps.slider.change(handlers.show_step, here, views, api_name=False)
    playing = steps.play.click(handlers.play, here, [steps.slider], api_name=False)
    for button, delta in ((steps.prev, -1), (steps.next, 1)):
        button.click(lambda c, m, i, d=delta: handlers.move(c, m, i, d), here, [steps.slider], api_name=False,
                     cancels=[playing])


def notice_for(get_pair) -> str:
    try:
        return handlers.hardware_notice(get_pair())
    except MirrorSDError as e:
        return f"**The models could not be loaded:** {e}"


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


def serve(host: str | None = None, port: int | None = None):
    """Build and serve the app (host/port None: Gradio's defaults or GRADIO_SERVER_NAME/PORT)."""
    build_demo().queue(max_size=QUEUE_SIZE).launch(server_name=host, server_port=port)
