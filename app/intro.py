"""The page's teaching text: the "How it works" panel (a picture and a few sentences per idea) and the
plain-words meaning of every number on a card (its tooltip).

The pictures are inline SVG drawn here (no downloads): schematic step timelines in the timeline's
colours, not measurements; the measured timelines are the race's own, below them on the page.
"""
from __future__ import annotations

import html
import re

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
    "MODELLED / REPORTED": "MODELLED: re-timed by a model of hardware this page does not have; REPORTED: "
                           "quoted from a paper, not run here. Everything else is measured.",
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


def sd_picture() -> str:
    """Draft proposes three tokens one by one; the target checks all three in one forward."""
    body = (_lane(8, "draft") + _lane(36, "target") +
            "".join(_bar(52 + 34 * i, 8, 30, f"d{i + 1}", DRAFT) for i in range(3)) +
            _bar(156, 36, 100, "verify d1 d2 d3", VERIFY) +
            '<text x="156" y="76" font-size="10" fill="#15803d">✓ d1  ✓ d2</text>'
            '<text x="216" y="76" font-size="10" fill="#b91c1c">✗ d3 → target’s own token</text>'
            '<text x="52" y="92" font-size="10" fill="#374151">'
            'one step: 3 cheap guesses, 1 target pass, 3 tokens</text>')
    return _svg(body, "Speculative decoding: the draft proposes, the target verifies many tokens in one forward")


def eagle_picture() -> str:
    """The target's features feed a small head that drafts a tree; the target checks the tree at once."""
    body = (_lane(8, "target") + _lane(52, "head") +
            _bar(52, 8, 70, "forward", TARGET) +
            '<path d="M 100 27 L 130 52" stroke="#6b7280" marker-end="url(#arrow)"/>'
            '<text x="110" y="44" font-size="9" fill="#6b7280">features</text>' +
            _bar(130, 52, 40, "tree", DRAFT) +
            "".join(f'<line x1="170" y1="61" x2="195" y2="{48 + 13 * i}" stroke="#f59e0b"/>'
                    f'<circle cx="198" cy="{48 + 13 * i}" r="4" fill="{DRAFT}"/>' for i in range(3)) +
            _bar(215, 8, 80, "verify tree", VERIFY) +
            '<text x="52" y="92" font-size="10" fill="#374151">drafted from the target’s own features</text>'
            '<defs><marker id="arrow" markerWidth="6" markerHeight="6" refX="5" refY="3" orient="auto">'
            '<path d="M0,0 L6,3 L0,6 z" fill="#6b7280"/></marker></defs>')
    return _svg(body, "EAGLE-2: a small head drafts a tree from the target's own features")


def mirror_picture() -> str:
    """Plain SD's step is draft + verify in turn; Mirror-SD's is the target with the draft running beside
    its last layers, so the step costs max(suffix, draft) instead of their sum."""
    body = ('<text x="0" y="10" font-size="10" font-weight="bold" fill="#374151">taking turns: draft + target</text>' +
            _lane(16, "one lane") + _bar(62, 16, 70, "draft", DRAFT) + _bar(134, 16, 60, "prefix", PREFIX) +
            _bar(196, 16, 70, "suffix", SUFFIX) +
            '<text x="0" y="54" font-size="10" font-weight="bold" fill="#374151">Mirror-SD: max(suffix, draft)</text>' +
            _lane(60, "target") + _lane(84, "draft dev.") +
            _bar(62, 60, 60, "prefix", PREFIX) + _bar(124, 60, 70, "suffix", SUFFIX) +
            '<path d="M 122 70 L 124 84" stroke="#6b7280"/>'
            '<text x="62" y="114" font-size="9" fill="#6b7280">'
            'the prefix’s early exit guesses; the draft starts at once</text>' +
            _bar(124, 84, 70, "draft next", ROLLOUT) +
            '<line x1="194" y1="56" x2="194" y2="104" stroke="#111827" stroke-dasharray="3 2"/>'
            '<text x="200" y="92" font-size="10" fill="#15803d">step ends here</text>')
    return _svg(body, "Mirror-SD: the draft works on a second device while the target runs its last layers",
                height=118)


def ss_picture() -> str:
    """No draft model: each step the target's main rows verify the tree, and its own stream rows, a short pass
    through its top layers, propose the next one."""
    body = (_lane(8, "target") +
            "".join(_bar(52 + 124 * i, 8, 70, "verify tree", VERIFY) + _bar(124 + 124 * i, 8, 48, "streams", DRAFT)
                    for i in range(2)) +
            "".join(f'<rect x="{50 + 124 * i}" y="5" width="124" height="24" rx="4" fill="none" stroke="#111827" '
                    'stroke-dasharray="3 2"/>' for i in range(2)) +
            '<text x="52" y="46" font-size="10" fill="#374151">each step: verify; stream rows draft the next tree</text>'
            '<text x="52" y="62" font-size="10" fill="#374151">no draft model, no second device</text>')
    return _svg(body, "Speculative Streaming: the target drafts the next tree in the step that verifies this one",
                height=70)


IDEAS = [
    ("1. Speculative decoding: guess cheaply, check in one pass", sd_picture,
     "A large *target* model writes one token per forward pass, and a pass costs about the same whether it "
     "checks one token or several. A small *draft* model guesses the next few tokens cheaply, and the target "
     "checks all of them in **one** forward pass, keeping the guesses it agrees with plus one token of its own. "
     "The text does not change (at temperature 0 every method writes exactly vanilla's tokens): only the number "
     "of slow target passes goes down."),
    ("2. EAGLE-2: draft from the target's own thoughts", eagle_picture,
     "EAGLE-2 has no separate draft model: a one-layer head reads the target's last hidden features and guesses "
     "the next tokens from them. It proposes a small *tree* of alternatives, and the target checks the whole "
     "tree in one pass. Most branches are rejected by design, so its acceptance looks low even when it is the "
     "fastest: acceptance and speed are different things."),
    ("3. Mirror-SD: draft while the target finishes", mirror_picture,
     "In plain speculative decoding the draft and the target take turns, so a step costs draft **plus** target. "
     "Mirror-SD runs the draft on a second device: partway through the target's pass an *early exit* guesses the "
     "next token, and the draft writes the next window for each guess while the target runs its last layers "
     "(its *suffix*). When the real token is among the guesses (a *hit*) the next window is ready, so a step "
     "costs **max(target suffix, draft)** instead of their sum. On a GPU the target's picks come right after its "
     "suffix, but the host reads them and matches the branch only once the draft is done too, so the step still "
     "ends after both (the zoomed step draws that host work in grey)."),
    ("4. Speculative Streaming: the target drafts for itself", ss_picture,
     "No draft model at all: small trained *streams* on the target's top layers predict the tokens after the "
     "next one. Each step the main rows check the tree proposed last time, and the stream rows, in a short pass "
     "through the top layers, propose the next tree. Drafting costs a little extra work in every step instead of "
     "a second model or device."),
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
        f'{picture()}<p style="margin:4px 0">{_markdown(text)}</p></div>' for title, picture, text in IDEAS)
    return (f'<div id="how-it-works" style="display:flex;flex-wrap:wrap;gap:16px">{cells}'
            f'<p id="copied-note" style="flex:1 1 100%;margin:4px 0">{_markdown(COPIED_NOTE)}</p></div>'
            f'<p style="color:#4b5563;margin-top:8px">{html.escape(LANES_NOTE)}</p>')


def _markdown(text: str) -> str:
    """The two bits of markdown the ideas use (**bold**, *italic*), as HTML."""
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"\*(.+?)\*", r"<i>\1</i>", text)
