"""The page's teaching text: the "How it works" panel (a picture and a few sentences per idea) and the
plain-words meaning of every number on a card (its tooltip).

The pictures are inline SVG drawn here (no downloads): schematic step timelines in the timeline's
colours, not measurements; the measured timelines are the race's own, below them on the page.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd

from mirror_sd import METHODS
from mirror_sd.methods.mirror import default_exit_layer

RECORDED = Path(__file__).parent / "recorded"  # the recorded races (app/replay.py)
TUNED = Path(__file__).parent / "tuned"  # the recorded tune (app/tuned.py)
SS_STREAMS = Path(__file__).parents[1] / "mirror_sd" / "assets" / "ss-smollm2-135m"  # ss's default streams

# Colours of the span kinds the pictures show (the same as app.figures.SPAN_KINDS).
TARGET, DRAFT, VERIFY, PREFIX, SUFFIX, ROLLOUT = "#2563eb", "#f59e0b", "#6366f1", "#1e3a8a", "#38bdf8", "#10b981"

METRIC_HELP = {
    "tokens": "New tokens this method wrote. Every method writes the same text at temperature 0.",
    "tok/s": "Tokens per second of wall time, on the machine that ran the race (a live race: this server; a "
             "recorded race: the machine its name gives): this is the speed.",
    "τ": "τ (tau): tokens committed per step, on average. Vanilla commits 1 per step; a higher τ means fewer "
         "slow target passes, but it becomes speed only when drafting is cheap.",
    "accepted": "Acceptance: the share of drafted tokens the target kept. It is not speed: EAGLE-2 drafts a whole "
                "tree of alternatives and rejects most branches by design, yet each step keeps several tokens.",
    "speedup": "This method's tokens per second divided by vanilla's, in this race (over repeated runs: the "
               "median tokens per second divided by vanilla's median).",
    "untimed": "Fewer than 8 new tokens: the time is mostly reading the prompt (the prefill), the same work for "
               "every method, so no speedup is claimed. Raise Max new tokens to compare speeds.",
    "busy": "The machine was busy with other work while this race ran (the note under the race says how), so "
            "this speedup is rough: run the race again when the machine is quiet.",
    "hits": "Mirror-SD: the share of steps where the target's real token was among the early-exit guesses, so "
            "the next draft window was already written (a hit). A miss means drafting again, on the critical path.",
    "overlap": "Mirror-SD: the share of the draft lane's work done while the target was working too. 100% means "
               "drafting was hidden behind the target's last layers.",
    "draft forwards": "Draft tokens per forward pass of the draft model (drafting with its speculative streams).",
    "ms/step": "Milliseconds per step, the mean: the run's wall time, reading the prompt included, divided by "
               "its steps. Speed is τ divided by this: EAGLE-2's steps commit the most tokens but cost a tree "
               "draft and a tree check each, so a higher τ need not mean faster. (The zoomed step under the "
               "timeline is one real step of median length, not this mean.)",
    "time": "Wall time of this method's run, from the first forward pass to the last token.",
    "runs": "Median over the repeated runs; the range in brackets is the lowest to the highest run.",
}


# Every term the page uses, one meaning each, visible on the page (not only in tooltips).
GLOSSARY = {
    "target": "the big model whose text we want; it checks every drafted token.",
    "draft": "a small, cheap model that guesses the target's next tokens.",
    "step": "one pass of the target over a window: it keeps the drafted tokens it agrees with, plus one of its own.",
    "window": "the draft tokens the target checks in one step (a chain, or a tree of alternatives).",
    "τ (tau)": "tokens committed per step. Speed is τ divided by what a step costs (ms/step on the cards), so "
               "a method with a high τ and dear steps can still be slow.",
    "copied from the context": "draft tokens no model drafted: the tokens that followed an earlier place in the "
                               "text where its last few tokens appeared (Mirror-SD's window after a miss, a "
                               "branch of EAGLE-2's or Speculative Streaming's tree).",
    "bonus token": "the target's own token after a window it accepted whole.",
    "correction": "the target's own token where it rejected a draft token.",
    "lossless": "at temperature 0 every method writes exactly vanilla's tokens; above 0 every method draws each "
                "token from the target's own distribution, so texts vary run to run as vanilla's do.",
    "prefix layers": "the target's first layers, up to the early exit (Mirror-SD). The text written so far is "
                     "called the committed text, never the prefix.",
    "suffix layers": "the target's remaining layers after the early exit.",
    "early exit": "reading the target's guess from its prefix layers, before the last layers run.",
    "token channel": "the early exit's top candidates per window row, sent to the draft's device.",
    "branch": "one guess of where the target will stop accepting and which token it will emit there.",
    "rollout": "the draft writing the next window after a branch, while the target's suffix layers run.",
    "rendezvous": "the moment the target's verdict meets the rollouts: if the verdict matches a branch, its "
                  "rollout is the next window (a hit); if not, a miss.",
    "hit / miss": "whether the next window was already drafted (hit) or must be drafted now, on the critical path (miss).",
    "fallback draft": "after a miss, the fresh draft the next step waits for.",
    "l_e": "the exit layer of Mirror-SD's early exit.",
    "T_rv": "the time of a rendezvous.",
    "lane": "a device and the work it runs, one row of the timeline.",
    "NPU role": "the second device that drafts beside the target (in the paper a neural engine; here a core "
                "group of the CPU or a second GPU stream).",
    "int8 / fp32": "8-bit integer or 32-bit float numbers; drafting on a CPU multiplies in int8 to save time, "
                   "the target always checks in fp32, so the text does not change.",
    "CUDA graphs": "a GPU's recorded sequence of kernels, replayed with one launch instead of hundreds.",
    "NVML": "NVIDIA's library for reading how busy a GPU is.",
    "acceptance per token (α)": "the chance the target accepts a draft token, given it accepted the ones before: "
                                "a window of γ tokens then commits 1 + α + α² + ... + α^γ tokens a step on average.",
    "window of γ draft tokens (gamma)": "how many tokens the draft proposes per step (sd, Mirror-SD).",
    "early-exit candidates per position (κ, kappa)": "how many of the early exit's top tokens per window row go "
                                                    "through the token channel (Mirror-SD).",
    "branches (branch budget)": "how many branches the draft rolls out per step (Mirror-SD).",
    "early exit after layer N": "where Mirror-SD reads the target's early guess (l_e).",
    "drafts in one forward with its streams": "the draft proposes the whole window in one forward pass, its "
                                              "speculative streams guessing the tokens after the next one.",
    "draft tree": "a window of alternatives: several candidates per position, verified together in one forward.",
    "tree depth, candidates per node, nodes verified": "EAGLE-2's tree: how many levels, how many children each "
                                                       "node may have, and how many nodes the target checks.",
    "stream levels": "Speculative Streaming: how many tokens ahead the target's own streams guess.",
    "one pass / a separate streams pass": "Speculative Streaming: the stream rows run inside the verify forward "
                                          "(the paper's one pass), or in a short pass of their own after it.",
    "long run": "a run's decoding steps alone, the prompt's reading left out: what a long answer approaches.",
    "draft cost": "one draft forward's time over one target forward's, on the chosen hardware.",
    "profile": "a hardware description the What if tab re-times runs on: the time of each piece of work there.",
    "best settings": "the setting of a method's options that the tune found fastest on a profile (MODELLED).",
    "LIVE / RECORDED / MODELLED / REPORTED": "where a number comes from. LIVE: a race run from this page, timed "
                                             "on the server showing it; RECORDED: measured on the machine and the "
                                             "day a recording names, not here; MODELLED: re-timed by a model of "
                                             "hardware this page does not have; REPORTED: quoted from a paper, not "
                                             "run here.",
    "residual": "in speculative sampling, where the target rejects a draft token it draws its own from "
                "norm(max(0, p − q)): its distribution p less what the draft q already covered, renormalised.",
}


def glossary_markdown() -> str:
    return "\n".join(f"- **{term}**: {meaning}" for term, meaning in GLOSSARY.items())


def metric(key: str, text: str, detail: str = "") -> str:
    """A card number with its plain-words meaning (and ``detail``, this run's) as a hover tooltip, and a
    dotted underline that says so."""
    title = METRIC_HELP[key] + (f"\n\n{detail}" if detail else "")
    return (f'<span class="metric" data-metric="{html.escape(key)}" title="{html.escape(title)}" '
            f'style="text-decoration:underline dotted #9ca3af;cursor:help">{text}</span>')


def _bar(x: float, y: float, w: float, label: str, colour: str, h: float = 18) -> str:
    text = "#fff" if colour in (TARGET, VERIFY, PREFIX) else "#111827"
    return (f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="3" fill="{colour}"/>'
            f'<text x="{x + w / 2}" y="{y + h / 2 + 4}" text-anchor="middle" font-size="10" '
            f'fill="{text}">{label}</text>')


def _lane(y: float, name: str) -> str:
    return f'<text x="0" y="{y + 13}" font-size="10" fill="#374151">{name}</text>'


def _svg(body: str, caption: str, height: int = 96) -> str:
    return (f'<svg viewBox="0 0 330 {height}" width="100%" style="max-width:420px" role="img" '
            f'aria-label="{html.escape(caption)}"><title>{html.escape(caption)}</title>{body}</svg>')


def _text(x: float, y: float, words: str, colour: str = "#374151", size: int = 10, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return f'<text x="{x}" y="{y}" font-size="{size}"{weight} fill="{colour}">{html.escape(words)}</text>'


def sd_picture() -> str:
    """The draft samples three tokens from q, one by one; the target computes p at every position in one
    forward and applies the rule: accept with min(1, p/q), resample a rejection from the residual."""
    body = (_lane(8, "draft q") + _lane(36, "target p") +
            "".join(_bar(52 + 34 * i, 8, 30, f"d{i + 1}~q", DRAFT) for i in range(3)) +
            _bar(156, 36, 120, "p at d1 d2 d3 (+1)", VERIFY) +
            _text(156, 72, "✓ d1  ✓ d2", "#15803d") + _text(216, 72, "✗ d3 → residual", "#b91c1c") +
            _text(0, 92, "accept dᵢ with probability min(1, p(dᵢ) / q(dᵢ))") +
            _text(0, 106, "first rejection: draw from norm(max(0, p − q))") +
            _text(0, 120, "all accepted: one bonus token from p") +
            _text(0, 136, "tokens per step: (1 − α^(γ+1)) / (1 − α)", bold=True))
    return _svg(body, "Speculative decoding: the draft proposes from q, the target verifies with p in one forward: "
                "accept with min(1, p/q), on a rejection resample from norm(max(0, p − q))", height=142)


def eagle_picture() -> str:
    """The target's features at position i, with the embedding of token i+1 (the shifted token), feed a
    one-layer head that drafts a tree; the target checks the tree at once."""
    body = (_lane(8, "target") + _lane(62, "head") +
            _bar(52, 8, 70, "forward", TARGET) +
            '<path d="M 100 27 L 128 62" stroke="#6b7280" marker-end="url(#arrow)"/>' +
            _text(108, 40, "feature at i", "#6b7280", 9) + _text(108, 51, "+ embed(token i+1)", "#6b7280", 9) +
            _bar(130, 62, 40, "tree", DRAFT) +
            "".join(f'<line x1="170" y1="71" x2="195" y2="{58 + 13 * i}" stroke="#f59e0b"/>'
                    f'<circle cx="198" cy="{58 + 13 * i}" r="4" fill="{DRAFT}"/>' for i in range(3)) +
            _bar(215, 8, 80, "verify tree", VERIFY) +
            _text(0, 106, "the head reads each feature with the next token’s embedding") +
            '<defs><marker id="arrow" markerWidth="6" markerHeight="6" refX="5" refY="3" orient="auto">'
            '<path d="M0,0 L6,3 L0,6 z" fill="#6b7280"/></marker></defs>')
    return _svg(body, "EAGLE-2: a small head drafts a tree from the target's features and the shifted token "
                "embedding", height=112)


def mirror_picture() -> str:
    """sd's step is the draft, then the whole target, in turn; Mirror-SD's is the target's prefix, the token
    channel, then the suffix beside the draft's rollouts on a second device, then the rendezvous."""
    body = (_text(0, 10, "sd: draft + whole target", bold=True) +
            _lane(16, "one lane") + _bar(62, 16, 60, "draft", DRAFT) + _bar(124, 16, 130, "whole target", TARGET) +
            _text(0, 52, "Mirror-SD: prefix + channel", bold=True) +
            _text(0, 64, "  + max(suffix, rollouts) + rendezvous", bold=True) +
            _lane(70, "target") + _lane(94, "draft dev.") +
            _bar(62, 70, 70, "prefix", PREFIX) + _bar(134, 70, 14, "κ", "#9ca3af") +
            _bar(150, 70, 60, "suffix", SUFFIX) + _bar(150, 94, 74, "rollouts", ROLLOUT) +
            _bar(226, 70, 16, "rv", "#9ca3af") +
            '<line x1="244" y1="66" x2="244" y2="114" stroke="#111827" stroke-dasharray="3 2"/>' +
            _text(250, 86, "step ends", "#15803d") +
            _text(0, 128, "κ: the early exit’s top-κ tokens per window row cross to the draft", "#6b7280", 9) +
            _text(0, 140, "rv: hit if (accepted length, correction) is a rolled-out branch", "#6b7280", 9))
    return _svg(body, "Mirror-SD: prefix, token channel, then the suffix beside the draft's rollouts, then the "
                "rendezvous", height=146)


def ss_picture() -> str:
    """The paper's single pass: one forward of the fine-tuned target verifies with its main rows and drafts
    with its stream rows. This project's default: the verify forward, then a short streams pass."""
    body = (_text(0, 10, "the paper: one forward a step", bold=True) + _lane(16, "target") +
            "".join(_bar(52 + 124 * i, 16, 118, "verify + streams draft", VERIFY) for i in range(2)) +
            _text(0, 54, "here by default (one_forward 0): two passes", bold=True) + _lane(60, "target") +
            "".join(_bar(52 + 124 * i, 60, 72, "verify", VERIFY) + _bar(126 + 124 * i, 60, 44, "streams", DRAFT)
                    for i in range(2)) +
            _text(0, 100, "no draft model, no second device"))
    return _svg(body, "Speculative Streaming: in the paper one forward verifies and drafts; here by default a "
                "streams pass follows the verify", height=106)


def option_default(method: str, name: str):
    """An option's default in the method registry (mirror_sd.METHODS), the engine's truth."""
    return next(o.default for o in METHODS[method].options if o.name == name)


def target_layers() -> int | None:
    """The embedded target's layer count, as the recordings' meta gives it."""
    for path in sorted(RECORDED.glob("**/*.json")):
        for run in json.loads(path.read_text())["methods"].values():
            if "target_layers" in run["trace"]["meta"]:
                return run["trace"]["meta"]["target_layers"]
    return None


def mirror_text() -> str:
    """Mirror-SD's step, its cost, the hit rule and what the project runs by default (read from the registry)."""
    layers = target_layers()
    exit_words = (f"layer {default_exit_layer(layers)} of {layers}, three quarters up" if layers else
                  "three quarters of the layers")
    streams = option_default("mirror", "streams")
    return ("In sd the draft and the target take turns: a step costs the draft's forwards **plus** the whole "
            "target's. Mirror-SD splits the target at an *early exit*: its *prefix* layers run, and the target's "
            "own final norm and LM head read the exit's **top-κ candidates at every window row** (the *token "
            f"channel*; κ = {option_default('mirror', 'kappa')} here by default, through a small trained exit head "
            "where one ships). A *branch* is a guess of where "
            "verification stops (the accepted length) and which candidate the target emits there (the "
            "correction). While the target runs its *suffix* layers, the draft on a second device rolls out a "
            "next window for each branch. At the *rendezvous* a **hit needs both the accepted length and the "
            "correction to match a branch**; its rollout is then the next window. So a step costs **prefix + "
            "channel + max(suffix, rollouts) + rendezvous**; a miss adds a fresh draft on the critical path. The "
            "paper's *dual strategy* also has the draft propose several tokens per forward with its own "
            "speculative streams; this page's Mirror-SD runs " +
            ("them by default (streams 1)" if streams else "without them by default (streams 0: the draft drafts "
             "token by token; option streams 1 turns them on)") +
            f", with the exit at {exit_words} (the paper: half). On a GPU the target's picks come right after its "
            "suffix, but the host reads them and matches the branch only once the draft is done too, so the step "
            "still ends after both (the zoomed step draws that host work in grey).")


def tune_single_pass() -> str:
    """What the recorded tune measured of SS's single pass against the pass of its own: each setting's pair
    that differs only in one_forward, τ and the speedup measured on the tune's CPU. '' where none ships."""
    if not (TUNED / "searched.csv").exists():
        return ""
    rows = pd.read_csv(TUNED / "searched.csv")
    rows = rows[rows.method == "ss"].assign(options=lambda t: t.options.map(json.loads))
    key = lambda o: json.dumps({k: v for k, v in o.items() if k != "one_forward"}, sort_keys=True)  # noqa: E731
    rows = rows.assign(key=rows.options.map(key), one=rows.options.map(lambda o: o.get("one_forward", 0)))
    pairs = rows[rows.one == 1].merge(rows[rows.one == 0], on="key", suffixes=("_1", "_0"))
    if pairs.empty:
        return ""
    meta = json.loads((TUNED / "meta.json").read_text())
    return (f" In the recorded tune (RECORDED on {meta['machine']}, {meta['date']}), the {len(pairs)} single-pass "
            f"settings committed τ {pairs.tau_1.min():.2f}–{pairs.tau_1.max():.2f} tokens a step against "
            f"{pairs.tau_0.min():.2f}–{pairs.tau_0.max():.2f} for the same settings with the pass of their own, and "
            f"measured {pairs.measured_speedup_1.min():.2f}–{pairs.measured_speedup_1.max():.2f}× against "
            f"{pairs.measured_speedup_0.min():.2f}–{pairs.measured_speedup_0.max():.2f}× there.")


def ss_text() -> str:
    """SS as the paper has it (a fine-tuned target, one forward a step) and as this project runs it."""
    config = json.loads((SS_STREAMS / "streams.json").read_text())["config"] if (SS_STREAMS / "streams.json").exists() \
        else {}
    trained = (f"{config['num_streams']} stream embeddings and LoRA adapters on its top {config['stream_layers']} "
               "layers, applied to stream rows only" if config else "stream embeddings and adapters on its top layers")
    one = option_default("ss", "one_forward")
    return ("No draft model at all. In the paper the target itself is **fine-tuned** with speculative streams: in "
            "its top layers each position also carries γ stream rows that predict the tokens 2, 3, … places ahead, "
            "so **one forward** both verifies the last tree (main rows) and drafts the next one (the stream rows of "
            "the last accepted row). This project keeps the target frozen, so its text cannot change, and trains "
            f"only {trained}. " +
            ("By default it runs the paper's single pass (one_forward 1)." if one else
             "By default (one_forward 0) the stream rows run in a short pass of their own after the verify, so "
             "they see the step's correction; one_forward 1 is the paper's single pass, with streams trained "
             "blind to the correction.") + tune_single_pass() +
            " Drafting costs a little extra work in every step instead of a second model or device.")


def ideas() -> list[tuple]:
    """The panel's four ideas: (title, picture, text), the texts read from the engine's defaults and files."""
    return [
        ("1. Speculative decoding: guess cheaply, check in one pass", sd_picture,
         "A large *target* model writes one token per forward pass, and a pass costs about the same whether it "
         "checks one token or several. A small *draft* model proposes γ tokens, sampled from its distribution "
         "*q*; the target computes its own distribution *p* at every one of them in **one** forward. The rule "
         "(Leviathan et al.; Chen et al.): accept each draft token with probability **min(1, p/q)**; at the first "
         "rejection draw the token from the residual **norm(max(0, p − q))**; if all pass, add a bonus token "
         "from *p*. Every committed token is then distributed exactly as the target's (at temperature 0: the "
         "longest prefix that matches the target's choice, then its own token). With acceptance α per token a "
         "step commits **(1 − α^(γ+1)) / (1 − α)** tokens on average, for γ draft forwards and one target "
         "forward."),
        ("2. EAGLE-2: draft from the target's own features", eagle_picture,
         "EAGLE-2 has no separate draft model: a one-layer head reads the target's last hidden features "
         "together with the **embedding of the next token** (the shifted token: the feature at position i "
         "paired with token i+1, so the head knows which token was sampled) and predicts the next feature, "
         "which the target's own LM head turns into tokens. It grows a *tree* of alternatives from the most "
         "confident nodes, and the target checks the whole tree in one pass. Most branches are rejected by "
         "design, so its acceptance looks low even when it is the fastest: acceptance and speed are different "
         "things."),
        ("3. Mirror-SD: draft while the target finishes", mirror_picture, mirror_text()),
        ("4. Speculative Streaming: the target drafts for itself", ss_picture, ss_text()),
    ]


COPIED_NOTE = ("**Copied from the context**: some windows are not drafted by any model. When the last few tokens "
               "appeared earlier in the prompt or the answer, the tokens that followed them there are a free guess, "
               "copied. After a miss, Mirror-SD copies its next window this way when it can, instead of drafting "
               "one; EAGLE-2 and Speculative Streaming may add a copied branch to their tree. The target checks "
               "copied tokens like drafted ones, so the text does not change. The step-through marks them "
               "*copied from the context*.")

LANES_NOTE = ("Here the two devices may be stand-ins: the line below this panel says which real device each "
              "lane runs on. "
              "When both lanes are parts of one processor they share it, and the draft's work is not free.")


def how_it_works_html() -> str:
    """The panel's body: one picture and a few sentences per idea, side by side where there is room."""
    cells = "".join(
        f'<div class="idea" style="flex:1 1 300px;min-width:260px"><h3 style="margin:4px 0">{html.escape(title)}</h3>'
        f'{picture()}<p style="margin:4px 0">{_markdown(text)}</p></div>' for title, picture, text in ideas())
    return (f'<div id="how-it-works" style="display:flex;flex-wrap:wrap;gap:16px">{cells}'
            f'<p id="copied-note" style="flex:1 1 100%;margin:4px 0">{_markdown(COPIED_NOTE)}</p></div>'
            f'<p style="color:#4b5563;margin-top:8px">{html.escape(LANES_NOTE)}</p>')


def _markdown(text: str) -> str:
    """The two bits of markdown the ideas use (**bold**, *italic*), as HTML."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"\*(.+?)\*", r"<i>\1</i>", text)
