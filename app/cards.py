"""A method's card in the race: its name, state, the engine's measured numbers and its coloured text."""
from __future__ import annotations

import html

from .race import Result
from .tokens import text_html

CARD_STYLE = "border:1px solid #d1d5db;border-radius:8px;padding:8px 10px;"
STATES = {"waiting": "waiting", "running": "decoding…", "skipped": "not run (race stopped)", "eos": "done (end of text)",
          "length": "done (max tokens)", "stopped": "stopped: text so far kept", "error": "error"}


def metrics_line(result: Result, baseline_tps: float | None) -> str:
    """tokens, tokens/s, tau, acceptance, speedup over vanilla, Mirror-SD's hit rate and overlap, and the
    draft tokens per draft forward of sd drafting with streams."""
    m = result.metrics
    if not m:
        return ""
    parts = [f"{m['new_tokens']} tokens", f"{m['tokens_per_s']:.1f} tok/s", f"τ {m['mean_accepted']:.2f}"]
    if m.get("acceptance_rate") is not None:
        parts.append(f"accepted {100 * m['acceptance_rate']:.0f}% of drafts")
    if baseline_tps and result.method != "vanilla":
        parts.append(f"<b>{m['tokens_per_s'] / baseline_tps:.2f}× vanilla</b>")
    if m.get("hit_rate") is not None:
        parts.append(f"hits {100 * m['hit_rate']:.0f}%")
    if m.get("overlap") is not None:
        parts.append(f"overlap {100 * m['overlap']:.0f}%")
    if m.get("draft_tokens_per_forward", 1.0) != 1.0:  # sd drafting with its streams
        parts.append(f"{m['draft_tokens_per_forward']:.2f} draft tokens per draft forward")
    parts.append(f"{m['wall_s']:.2f} s")
    return " · ".join(parts)


def card_html(result: Result, baseline_tps: float | None = None, upto: int | None = None) -> str:
    """The card; ``upto`` shows the text as it stood after that step (the replay)."""
    state = STATES.get(result.finished, result.finished)
    error = f'<div class="card-error" style="color:#b91c1c">{html.escape(result.error)}</div>' if result.error else ""
    note = result.trace.meta.get("note")  # the draft lane failed: the run finished target-only
    error += f'<div class="card-note" style="color:#92400e">{html.escape(note)}</div>' if note else ""
    body = text_html(result.trace, result.pieces, upto=upto) if result.trace.steps else ""
    metrics = "" if upto is not None else metrics_line(result, baseline_tps)
    return (f'<div class="card" style="{CARD_STYLE}" data-method="{html.escape(result.method)}" data-state="{html.escape(result.finished)}">'
            f'<div class="card-head"><b>{html.escape(result.title)}</b> <span class="card-state">{state}</span></div>'
            f'<div class="card-metrics" style="font-size:13px;color:#374151;margin:4px 0">{metrics}</div>{error}{body}</div>')


def baseline(results: dict[str, Result]) -> float | None:
    """Vanilla's tokens/s in this race, once vanilla has finished."""
    vanilla = results.get("vanilla")
    if vanilla and vanilla.done and vanilla.metrics:
        return vanilla.metrics["tokens_per_s"]
    return None
