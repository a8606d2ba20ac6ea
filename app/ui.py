"""A first page: run the engine's methods on one prompt and compare their real, measured numbers.

The app never times anything itself: every number comes from the engine's metrics of a run on the
machine serving the page. (The full race view with timelines and step-through is a later piece.)
"""
from __future__ import annotations

from functools import lru_cache

import gradio as gr
import pandas as pd

from mirror_sd import METHODS, MirrorSDError, generate, load_pair


@lru_cache(maxsize=1)
def get_pair():
    return load_pair()


def run_methods(prompt: str, methods: list[str], max_new_tokens: int):
    """Returns (status markdown, metrics table, texts markdown)."""
    if not methods:
        return "Pick at least one method.", pd.DataFrame(), ""
    pair = get_pair()
    rows, texts, base_tps = [], [], None
    for name in ["vanilla"] + [m for m in methods if m != "vanilla"]:
        try:
            out = generate(pair, prompt, method=name, max_new_tokens=int(max_new_tokens))
        except MirrorSDError as e:
            return f"**Cannot run:** {e}", pd.DataFrame(), ""
        m = out.metrics
        base_tps = base_tps or m["tokens_per_s"]
        if name in methods:
            rows.append(dict(method=name, tokens=m["new_tokens"], steps=m["steps"],
                             mean_accepted=round(m["mean_accepted"], 2), tokens_per_s=round(m["tokens_per_s"], 1),
                             speedup=round(m["tokens_per_s"] / base_tps, 2),
                             hit_rate=_round(m.get("hit_rate")), overlap=_round(m.get("overlap")),
                             finished=out.finished))
            note = f"\n\n> stopped early: {out.error}" if out.error else ""
            texts.append(f"### {METHODS[name].title}\n{out.text}{note}")
    lanes = f"target lane: {pair.target_lane.label}; draft lane: {pair.draft_lane.label}"
    status = (f"Measured on this machine ({lanes}). Both lanes are CPU core groups here; "
              f"speedups are relative to vanilla in this same run.")
    return status, pd.DataFrame(rows), "\n\n".join(texts)


def _round(x):
    return None if x is None else round(x, 2)


def build_demo() -> gr.Blocks:
    with gr.Blocks(title="mirror-sd") as demo:
        gr.Markdown("# mirror-sd\nSpeculative decoding methods on the same prompt and the same models. "
                    "Every number below is measured in a real run.")
        prompt = gr.Textbox(label="Prompt", value="Why is the sky blue?", lines=3)
        with gr.Row():
            methods = gr.CheckboxGroup(list(METHODS), value=list(METHODS), label="Methods")
            max_new_tokens = gr.Slider(8, 256, value=64, step=8, label="Max new tokens")
        run = gr.Button("Run", variant="primary")
        status = gr.Markdown()
        table = gr.Dataframe(label="Measured")
        texts = gr.Markdown()
        run.click(run_methods, [prompt, methods, max_new_tokens], [status, table, texts])
    return demo
