"""Text of a run as HTML: each committed token coloured by origin, draft tokens copied from the context
(``mirror_sd/drafting/lookup.py``) underlined, and, on request, rejected draft tokens struck through.

The race's cards read as plain text: they leave rejected draft tokens out (``rejected=False``) unless
the visitor ticks "show rejected draft tokens"; the step-through always shows them.

Token ids become text through a ``pieces`` dict (id -> text) recorded with the run (see
:func:`collect_pieces`), so a stored run renders with no tokenizer at hand.
"""
from __future__ import annotations

import html
from dataclasses import asdict

from mirror_sd.trace import Trace

ORIGIN_COLOURS = {  # background of a committed token, by origin (see mirror_sd.trace)
    "target": "#e5e7eb",
    "accepted": "#bbf7d0",
    "correction": "#fed7aa",
    "bonus": "#bfdbfe",
}
ORIGIN_NAMES = {
    "target": "target token (no draft)",
    "accepted": "accepted draft token",
    "correction": "target correction",
    "bonus": "bonus token",
}
TEXT_STYLE = "overflow-wrap:anywhere;line-height:1.9;font-size:14px;"
REJECTED_STYLE = "color:#9ca3af;text-decoration:line-through;"
COPIED_STYLE = "box-shadow:inset 0 -3px 0 #0d9488;"  # teal underline, the draft trees' "copied from context"
COPIED_NAME = "copied from the context (not drafted by a model)"


def collect_pieces(trace: Trace, decode, pieces: dict[int, str] | None = None, from_step: int = 0) -> dict[int, str]:
    """Add the text of every token id that steps[from_step:] mention (committed, proposed, records)."""
    pieces = {} if pieces is None else pieces
    for step in trace.steps[from_step:]:
        for token in _ints([step.committed, step.proposed, [asdict(r) for r in step.records()]]):
            if token not in pieces:
                pieces[token] = decode([token])
    return pieces


def _ints(value):
    """Every non-negative int inside nested lists, tuples and dicts (ids, plus some harmless counts)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if value >= 0:
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _ints(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _ints(item)


def piece(pieces: dict, token: int) -> str:
    """The text of one token; JSON round trips turn int keys into strings, so both are looked up."""
    text = pieces.get(token, pieces.get(str(token)))
    return f"<{token}>" if text is None else text


def visible(text: str) -> str:
    """A token's text with whitespace made visible: newlines as ↵, a blank token as ␣."""
    text = text.replace("\n", "↵").replace("\t", "⇥")
    return text if text.strip() else "␣" * len(text) or "∅"


def _span(text: str, style: str, title: str, css: str = "tok") -> str:
    shown = html.escape(text).replace("\n", "↵<br>") or "∅"
    style += "padding:0 1px;border-radius:3px;"  # no margin: a word split into tokens still reads as one word
    return f'<span class="{css}" style="{style}" title="{html.escape(title)}">{shown}</span>'


def copied_marks(step) -> tuple[list[bool], list[bool]]:
    """Which of a step's accepted and of its rejected draft tokens (at ``step.accepted_at`` and
    ``step.rejected_at``) were copied from the context (``step.copied``)."""
    copied = step.copied
    return [i in copied for i in step.accepted_at], [i in copied for i in step.rejected_at]


def _marked(style: str, title: str, copied: bool) -> tuple[str, str]:
    """A token's style and title, with the copied-from-context underline where ``copied``."""
    return (style + COPIED_STYLE, f"{title}, {COPIED_NAME}") if copied else (style, title)


def step_html(step, pieces: dict, current: bool = False, rejected: bool = True) -> str:
    """One step: accepted tokens, then rejected draft tokens (struck through; left out unless ``rejected``),
    then the target's token; draft tokens copied from the context underlined."""
    border = "outline:2px solid #7c3aed;" if current else ""
    accepted_copied, rejected_copied = copied_marks(step)
    accepted_copied = iter(accepted_copied)
    parts = []
    for token, origin in zip(step.committed, step.origins):
        if rejected and origin in ("correction", "bonus"):
            for token_r, copied in zip(step.rejected, rejected_copied):
                style, title = _marked(REJECTED_STYLE + border, f"step {step.index}: rejected draft token", copied)
                parts.append(_span(piece(pieces, token_r), style, title, css="tok rejected"))
        copied = origin == "accepted" and next(accepted_copied, False)
        style, title = _marked(f"background:{ORIGIN_COLOURS.get(origin, '#fff')};" + border,
                               f"step {step.index}: {ORIGIN_NAMES.get(origin, origin)}", copied)
        parts.append(_span(piece(pieces, token), style, title))
    return "".join(parts)


def text_html(trace: Trace, pieces: dict, upto: int | None = None, current: int | None = None,
              rejected: bool = True) -> str:
    """All steps up to index ``upto`` (all when None); step ``current`` outlined; rejected draft tokens
    shown only when ``rejected``."""
    steps = [s for s in trace.steps if upto is None or s.index <= upto]
    body = "".join(step_html(s, pieces, current=s.index == current, rejected=rejected) for s in steps)
    return f'<div class="tokens" style="{TEXT_STYLE}">{body}</div>'


def legend_html() -> str:
    chip = "white-space:nowrap;"  # a chip wraps as a whole: 'target correction' never splits over two lines
    items = [_span(name, f"background:{ORIGIN_COLOURS[origin]};{chip}", name) for origin, name in ORIGIN_NAMES.items()]
    items.append(_span("rejected draft token", REJECTED_STYLE + chip, "a draft token the target did not accept"))
    items.append(_span("copied from the context", COPIED_STYLE + chip, "underlined: a draft token " + COPIED_NAME))
    items.append(f'<span class="legend-marks" title="{html.escape(MARKS_HELP)}">{MARKS_LEGEND}</span>')
    return '<div class="legend" style="line-height:2">' + " ".join(items) + "</div>"


MARKS_LEGEND = "<b>↵</b> line break · <b>␣</b> a token of spaces · <b>∅</b> a token with no text of its own"
MARKS_HELP = ("Tokens are pieces of words. Some have nothing to print: ↵ marks a line break, ␣ a token made of "
              "spaces, and ∅ a token that decodes to no text on its own (an end-of-text marker, or half of a "
              "character split across two tokens).")
