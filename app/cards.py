"""A method's card in the race: its name, state, the engine's measured numbers and its coloured text.

Every number carries a tooltip in plain words (app.intro.METRIC_HELP); numbers that mean nothing for
a method are left out (overlap, for methods whose lanes never work at once). After repeated runs the
numbers are medians, with the range of the runs beside them. The head carries the numbers' origin (a
LIVE or RECORDED badge) and the models the method ran (app.provenance). ``numbers`` computes a card's
figures once, for the card and for the results table (app.results_table).
"""
from __future__ import annotations

import html

from mirror_sd import METHODS

from . import presets
from .figures import ms_text
from .intro import metric
from .provenance import badge, badge_html, models
from .race import Result
from .repeat import middle, spread
from .tokens import text_html

CARD_STYLE = "border:1px solid #d1d5db;border-radius:8px;padding:8px 10px;"
STATES = {"waiting": "waiting", "warming": "warming up (untimed)…", "running": "decoding…",
          "skipped": "not run (race stopped)", "refused": "not run (race refused)", "eos": "done (end of text)",
          "length": "done (max tokens)", "stopped": "stopped: text so far kept", "error": "error"}


def _ranged(numbers: list[dict] | None, key: str, fmt: str, now: float) -> str:
    """``now`` formatted, or the median over the runs with their range when there are several."""
    values = [n[key] for n in numbers or [] if n.get(key) is not None]
    if len(values) < 2:
        return fmt.format(now)
    mid, low, high = spread(values)
    return f"{fmt.format(mid)} ({fmt.format(low)}–{fmt.format(high)})"


def acceptance_histogram(result: Result) -> str:
    """This run's steps by the tokens each committed (the histogram behind τ), as a line of text."""
    lengths = [len(s.committed) for s in result.trace.steps if s.index > 0]
    if not lengths:
        return ""
    shares = {n: lengths.count(n) / len(lengths) for n in sorted(set(lengths))}
    return "This run's steps by tokens committed: " + ", ".join(f"{n}: {100 * s:.0f}%" for n, s in shares.items())


def ms_per_step(result: Result) -> float:
    """The card's ms/step: the run's wall time over its decoding steps, so a mean that includes reading
    the prompt (over repeated runs, the medians' ratio). The reveal quotes this same figure."""
    return 1000 * middle(result, "wall_s") / max(middle(result, "steps") or 1, 1)


def measured_where(result: Result) -> str:
    """Where the timed numbers were measured, for their tooltips: a recorded race's machine and date
    ("Recorded on NVIDIA H200, 2026-11-27, not on this server."), or this server's processor."""
    kind, where = badge(result.trace.meta)
    return f"Recorded on {where}, not on this server." if kind == "RECORDED" else f"Measured live on {where}."


def numbers(result: Result, baseline_tps: float | None) -> dict:
    """The card's figures, computed once (medians over repeated runs): tokens, tokens/s, τ, acceptance,
    hit rate, ms/step, overlap, draft tokens per forward, wall time, and the speedup over vanilla's
    ``baseline_tps`` (None for vanilla, an unfinished run, a run too short to time or no baseline yet)."""
    m = {k: middle(result, k) for k in result.metrics}
    finished = result.finished in ("eos", "length")
    speedup = (m["tokens_per_s"] / baseline_tps if baseline_tps and result.method != "vanilla" and finished
               and result.timed else None)
    return dict(tokens=m.get("new_tokens"), tokens_per_s=m.get("tokens_per_s"), tau=m.get("mean_accepted"),
                acceptance=m.get("acceptance_rate"), hit_rate=m.get("hit_rate"), overlap=m.get("overlap"),
                ms_per_step=ms_per_step(result) if m.get("steps") else None, wall_s=m.get("wall_s"),
                draft_tokens_per_forward=m.get("draft_tokens_per_forward", 1.0), speedup=speedup,
                untimed=result.method != "vanilla" and finished and not result.timed)


def metrics_line(result: Result, baseline_tps: float | None) -> str:
    """tokens, tokens/s, tau, acceptance, speedup over vanilla, Mirror-SD's hit rate and overlap, and the
    draft tokens per draft forward of sd drafting with streams. Over the result's repeated runs every
    number is their median (tokens/s with its range), and the speedup is the ratio of the medians.
    When the machine was busy (``result.busy``) the speedup says so instead of being set in bold."""
    if not result.metrics:
        return ""
    n, runs = numbers(result, baseline_tps), result.runs
    parallel = result.method in METHODS and METHODS[result.method].parallel_lanes
    parts = [metric("tokens", f"{n['tokens']:g} token{'' if n['tokens'] == 1 else 's'}"),
             metric("tok/s", _ranged(runs, "tokens_per_s", "{:.1f}", n["tokens_per_s"]) + " tok/s",
                    measured_where(result)),
             metric("τ", f"τ {n['tau']:.2f}", acceptance_histogram(result))]
    if n["ms_per_step"] is not None:
        parts.append(metric("ms/step", f"{ms_text(n['ms_per_step'])}/step", measured_where(result)))
    if n["acceptance"] is not None:
        parts.append(metric("accepted", f"accepted {100 * n['acceptance']:.0f}% of drafts"))
    if n["untimed"]:
        parts.append(metric("untimed", "too short to time"))
    elif n["speedup"] is not None:
        speedup = f"{n['speedup']:.2f}× vanilla"
        shown = f"{speedup} {metric('busy', '(machine busy)')}" if result.busy else f"<b>{speedup}</b>"
        parts.append(metric("speedup", shown))
    if n["hit_rate"] is not None:
        parts.append(metric("hits", f"hits {100 * n['hit_rate']:.0f}%"))
    if parallel and n["overlap"] is not None:
        parts.append(metric("overlap", f"overlap {100 * n['overlap']:.0f}%"))
    if n["draft_tokens_per_forward"] != 1.0:  # sd drafting with its streams
        parts.append(metric("draft forwards", f"{n['draft_tokens_per_forward']:.2f} draft tokens per draft forward"))
    parts.append(metric("time", f"{n['wall_s']:.2f} s", measured_where(result)))
    if runs and len(runs) > 1:
        parts.append(metric("runs", f"median of {len(runs)} runs"))
    return " · ".join(parts)


def card_html(result: Result, baseline_tps: float | None = None, upto: int | None = None,
              rejected: bool = False, replaying: str | None = None) -> str:
    """The card; ``upto`` shows the text as it stood after that step (the replay); ``rejected`` shows the
    rejected draft tokens struck through inside the text; ``replaying`` (with ``upto``) is the state said
    while the replay clock is still inside the run, e.g. "replaying…", so no card says done before its run
    ended on that clock."""
    state = STATES.get(result.finished, result.finished) if replaying is None else replaying
    error = f'<div class="card-error" style="color:#b91c1c">{html.escape(result.error)}</div>' if result.error else ""
    note = result.trace.meta.get("note")  # the draft lane failed: the run finished target-only
    error += f'<div class="card-note" style="color:#92400e">{html.escape(note)}</div>' if note else ""
    body = text_html(result.trace, result.pieces, upto=upto, rejected=rejected) if result.trace.steps else ""
    metrics = "" if upto is not None else metrics_line(result, baseline_tps)
    data_state = "replaying" if replaying else result.finished
    return (f'<div class="card" style="{CARD_STYLE}" data-method="{html.escape(result.method)}" '
            f'data-state="{html.escape(data_state)}">'
            f'<div class="card-head"><b>{html.escape(result.title)}</b> <span class="card-state">{state}</span> '
            f'{badge_html(result.trace.meta)}</div>'
            f'<div class="card-models" style="font-size:12px;color:#4b5563">'
            f'{html.escape(models(result.trace.meta, result.method))}</div>'
            f'{form_label(result)}'
            f'<div class="card-metrics" style="font-size:13px;color:#374151;margin:4px 0">{metrics}</div>{error}{body}</div>')


def form_label(result: Result) -> str:
    """A line under the card's head when the method ran in its paper's configuration (``app.presets``)."""
    label = presets.label(result)
    return f'<div class="card-form" style="font-size:12px;color:#1d4ed8">{label}</div>' if label else ""


def baseline(results: dict[str, Result]) -> float | None:
    """Vanilla's tokens/s in this race (the median over repeated runs), once vanilla has finished."""
    vanilla = results.get("vanilla")
    if vanilla and vanilla.done and vanilla.metrics:
        return middle(vanilla, "tokens_per_s")
    return None
