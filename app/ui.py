"""The page: layout (gr.Blocks) and event wiring.

Runs go through :mod:`app.race` (the engine's ``stream``); everything on screen is drawn from the
traces those runs record (:mod:`app.cards`, :mod:`app.figures`, :mod:`app.explain`). The app
never times anything and never calls a model itself. Methods, and their options in the
"Advanced" drawer, come from the registry ``mirror_sd.METHODS``.
"""
from __future__ import annotations

import importlib.util
import threading
import time
from functools import lru_cache

import gradio as gr
import torch

from mirror_sd import METHODS, MirrorSDError, load_pair
from mirror_sd.bench import DEFAULT_PROMPTS, first_per_category, read_prompts
from mirror_sd.devices import cpu_cores

from . import figures
from .cards import baseline, card_html
from .explain import explain
from .export import export_files
from .race import run_race
from .replay import frame_times, last_step_at
from .tokens import legend_html, text_html

QUEUE_SIZE = 16  # runs waiting beyond this are refused with a "queue full" message
MAX_PROMPT_CHARS = 20_000  # far beyond any context here; the engine checks the real token limit
AUTO = "auto"
INTRO = ("# mirror-sd: a race of decoding methods\n"
         "The same prompt and the same models, decoded by each method the engine has. Every number, "
         "timeline and tree below comes from a real run on the machine serving this page.")


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


def hardware_notice(pair) -> str:
    target, draft = pair.target_lane, pair.draft_lane
    lanes = f"Target lane: **{target.label}**; draft lane: **{draft.label}**."
    if target.device.type != draft.device.type:
        return lanes
    return (f"{lanes} Both lanes are on the same kind of hardware ({target.device.type}): here they stand in for "
            f"the two separate devices Mirror-SD is designed for (a GPU and an NPU). "
            f"{'They are two groups of one CPU' + chr(39) + 's cores.' if target.device.type == 'cpu' else ''}")


SERIAL_NOTE = ("Methods run **one after another**, not at the same time: on this machine's {cores} CPU cores, "
               "running them together would distort each other's timings. When all are done, **Replay** "
               "shows the race side by side at the speed each method was measured to decode.")


class Stops:
    """One stop flag per browser session: the Stop button sets it, the running race polls it."""

    def __init__(self):
        self._flags: dict[str, threading.Event] = {}

    def fresh(self, session: str) -> threading.Event:
        self._flags[session] = threading.Event()
        return self._flags[session]

    def stop(self, session: str):
        if session in self._flags:
            self._flags[session].set()


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


def gather_options(specs, values) -> dict[str, dict]:
    options: dict[str, dict] = {}
    for (method, opt, _), value in zip(specs, values):
        if value is not None:
            options.setdefault(method, {})[opt.name] = value
    return options


def race_views(results: dict) -> dict:
    """Traces of the methods that did any work, keyed by title (the figures' row names)."""
    return {r.title: r.trace for r in (results or {}).values() if r.trace.spans}


def _on_gpu(fn):
    """On a Hugging Face ZeroGPU Space, ask for a GPU while ``fn`` runs; elsewhere ``fn`` unchanged."""
    if importlib.util.find_spec("spaces") is None:
        return fn
    import spaces

    return spaces.GPU(fn)


def build_demo(pair_factory=None) -> gr.Blocks:
    """The app. ``pair_factory(target_device=..., draft_device=...)`` gives the model pair (tests pass tiny ones)."""
    get_pair = pair_factory or default_pair
    stops = Stops()
    names = list(METHODS)
    with gr.Blocks(title="mirror-sd: a race of decoding methods") as demo:
        results = gr.State({})
        gr.Markdown(INTRO)
        notice = gr.Markdown()
        with gr.Tab("Race"):
            with gr.Row():
                prompt = gr.Textbox(label="Prompt", value=example_prompts()[0][0], lines=3, scale=5)
                with gr.Column(scale=1, min_width=140):
                    run_btn = gr.Button("Run", variant="primary", elem_id="run")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
            gr.Examples(example_prompts(), [prompt], label="Examples: one per Spec-Bench category",
                        cache_examples=False)
            with gr.Row():
                methods = gr.CheckboxGroup([(METHODS[n].title, n) for n in names], value=names, label="Methods",
                                           scale=3)
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)", scale=2)
                max_tokens = gr.Slider(1, 512, value=48, step=1, label="Max new tokens", scale=2)
            with gr.Accordion("Advanced", open=False):
                with gr.Row():
                    top_p = gr.Number(1.0, label="top_p", info="nucleus sampling, (0, 1]")
                    seed = gr.Number(0, label="seed", precision=0)
                    target_device = gr.Dropdown(device_choices(), value=AUTO, label="target device")
                    draft_device = gr.Dropdown(device_choices(), value=AUTO, label="draft device")
                specs = option_controls()
            status = gr.Markdown(SERIAL_NOTE.format(cores=cpu_cores()))
            gr.HTML(legend_html())
            with gr.Row(equal_height=False):
                cards = [gr.HTML(f"<b>{METHODS[n].title}</b>", elem_classes="method-card", elem_id=f"card-{n}",
                                 min_height=80) for n in names]
            with gr.Row():
                replay_btn = gr.Button("Replay the race side by side at measured speed", interactive=False)
            race_timeline = gr.Plot(label="Timeline: one row per lane, real spans (shared time axis)",
                                    elem_id="timeline")
        with gr.Tab("Utilisation"):
            gr.Markdown("Per lane: the share of the run it spent working, and how that share moved over time. "
                        "Computed from the spans of each run.")
            util_plot = gr.Plot(label="Utilisation", elem_id="utilisation")
        with gr.Tab("Step-through"):
            with gr.Row():
                step_method = gr.Dropdown([], label="Method", scale=2)
                step_slider = gr.Slider(0, 1, value=0, step=1, label="Step", scale=4, elem_id="step")
                prev_btn = gr.Button("◀ Prev", elem_id="prev", min_width=80)
                next_btn = gr.Button("Next ▶", elem_id="next", min_width=80)
                play_btn = gr.Button("Play", elem_id="play", min_width=80)
            sentence = gr.Markdown(elem_id="sentence")
            step_text = gr.HTML()
            step_timeline = gr.Plot(label="This step on the timeline (other steps faded)")
            step_tree = gr.Plot(label="Branches: the step's hypothesis tree")
        with gr.Tab("Export"):
            gr.Markdown("Each method's trace: spans and steps as CSV, the trace as JSON (`Trace.from_json` "
                        "reads it back), and Chrome-trace JSON for [Perfetto](https://ui.perfetto.dev).")
            files = gr.File(label="Downloads", file_count="multiple")

        def race(request: gr.Request, prompt_text, chosen, max_new, temp, p, seed_value, t_dev, d_dev,
                 *option_values):
            """Run the race; yields (status, replay button, *cards, results) after every step."""
            idle = (gr.update(),) * len(cards)
            problem = _check_prompt(prompt_text, chosen)
            if problem:
                gr.Warning(problem)
                yield (f"**Cannot run:** {problem}", gr.update(), *idle, {})
                return
            try:
                pair = get_pair(target_device=None if t_dev == AUTO else t_dev,
                                draft_device=None if d_dev == AUTO else d_dev)
            except MirrorSDError as e:
                gr.Warning(str(e))
                yield (f"**Cannot run:** {e}", gr.update(), *idle, {})
                return
            stop = stops.fresh(request.session_hash if request else "")
            options = gather_options(specs, option_values)
            settings = dict(max_new_tokens=int(max_new), temperature=float(temp), options=options,
                            top_p=float(p if p is not None else 1.0), seed=int(seed_value or 0))
            warned, current = set(), {}
            for current in run_race(pair, prompt_text, chosen, stop, **settings):
                for r in current.values():
                    if r.error and r.method not in warned:
                        warned.add(r.method)
                        gr.Warning(f"{r.title}: {r.error}")
                yield (_race_status(current), gr.update(interactive=False), *_cards(current, names), current)
            yield (_race_status(current, done=True), gr.update(interactive=True), *_cards(current, names), current)

        race = _on_gpu(race)

        def views(current):
            traces = race_views(current)
            if not traces:
                return None, None, None, gr.update(choices=[], value=None)
            choices = [(r.title, r.method) for r in current.values() if r.trace.steps]
            return (figures.timeline(traces), figures.utilisation(traces), export_files(
                {r.method: r.trace for r in current.values() if r.trace.spans}),
                gr.update(choices=choices, value=choices[-1][1] if choices else None))

        def replay(current):
            traces = race_views(current)
            if not traces:
                return
            rate = baseline(current)
            start = time.perf_counter()
            for t in frame_times(list(traces.values()), fps=4):
                time.sleep(max(0.0, t - (time.perf_counter() - start)))
                cards_now = [card_html(current[n], rate, upto=last_step_at(current[n].trace, t)) if n in current
                             else gr.update() for n in names]
                yield (*cards_now, figures.timeline(traces, now_ms=1000 * t))
            yield (*_cards(current, names), figures.timeline(traces))

        def pick_method(current, method):
            steps = current[method].trace.steps if method in (current or {}) else []
            return gr.update(maximum=max(steps[-1].index, 1) if steps else 1, value=0)

        def show_step(current, method, index):
            if method not in (current or {}):
                return "Run the race first.", "", None, None
            r, index = current[method], int(index)
            x_max = figures.run_end_ms(list(race_views(current).values()))
            step = next((s for s in r.trace.steps if s.index == index), None)
            tree = figures.tree(step, r.pieces, title=f"{r.title}, step {index}") if step else None
            return (explain(r.trace, index, r.pieces), text_html(r.trace, r.pieces, upto=index, current=index),
                    figures.timeline({r.title: r.trace}, x_max_ms=x_max, step=index), tree)

        def move(current, method, index, delta):
            steps = current[method].trace.steps if method in (current or {}) else []
            last = steps[-1].index if steps else 0
            return min(max(int(index) + delta, 0), last)

        def play(current, method, index):
            steps = current[method].trace.steps if method in (current or {}) else []
            for i in range(int(index) + 1, (steps[-1].index if steps else 0) + 1):
                time.sleep(1.0)
                yield i

        run_event = run_btn.click(race, [prompt, methods, max_tokens, temperature, top_p, seed, target_device,
                                         draft_device, *[box for _, _, box in specs]],
                                  [status, replay_btn, *cards, results], api_name="run", concurrency_limit=1)
        run_event.then(views, [results], [race_timeline, util_plot, files, step_method], api_name="views")
        def stop(request: gr.Request):
            stops.stop(request.session_hash)

        stop_btn.click(stop, None, None, api_name="stop", queue=False)
        replay_btn.click(replay, [results], [*cards, race_timeline], api_name=False)
        step_method.change(pick_method, [results, step_method], [step_slider], api_name=False)
        step_slider.change(show_step, [results, step_method, step_slider],
                           [sentence, step_text, step_timeline, step_tree], api_name=False)
        step_method.change(show_step, [results, step_method, step_slider],
                           [sentence, step_text, step_timeline, step_tree], api_name=False)
        prev_btn.click(lambda c, m, i: move(c, m, i, -1), [results, step_method, step_slider], [step_slider],
                       api_name=False)
        next_btn.click(lambda c, m, i: move(c, m, i, 1), [results, step_method, step_slider], [step_slider],
                       api_name=False)
        play_btn.click(play, [results, step_method, step_slider], [step_slider], api_name=False)
        methods.change(lambda chosen: [gr.update(visible=n in chosen) for n in names], [methods], cards,
                       api_name=False)
        demo.load(lambda: hardware_notice(get_pair()), None, notice, api_name=False)
    return demo


def serve(host: str | None = None, port: int | None = None):
    """Build and serve the app (host/port None: Gradio's defaults or GRADIO_SERVER_NAME/PORT)."""
    build_demo().queue(max_size=QUEUE_SIZE).launch(server_name=host, server_port=port)


def _check_prompt(prompt_text: str, chosen: list[str]) -> str | None:
    if not chosen:
        return "pick at least one method."
    if not (prompt_text or "").strip():
        return "the prompt is empty: type some text or pick an example."
    if len(prompt_text) > MAX_PROMPT_CHARS:
        return f"the prompt is {len(prompt_text)} characters; keep it under {MAX_PROMPT_CHARS}."
    return None


def _cards(current: dict, names: list[str]) -> list:
    rate = baseline(current)
    return [card_html(current[n], rate) if n in current else gr.update() for n in names]


def _race_status(current: dict, done: bool = False) -> str:
    running = [r.title for r in current.values() if r.finished == "running"]
    if running and not done:
        order = list(current)
        name = next(r.method for r in current.values() if r.finished == "running")
        return f"Running **{running[0]}** ({order.index(name) + 1} of {len(order)}); methods run one after another."
    stopped = any(r.finished in ("stopped", "skipped") for r in current.values())
    errors = [f"{r.title}: {r.error}" for r in current.values() if r.error]
    head = "Stopped: the text so far is kept." if stopped else "Done."
    tail = " Errors: " + "; ".join(errors) if errors else ""
    return f"{head} Replay the race below; step through it in **Step-through**.{tail}"
