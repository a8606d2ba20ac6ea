"""The race's results as one compact table: a row per method with its tokens/s, τ, acceptance, hit rate,
speedup and badge (LIVE or RECORDED), the models named above it and each column's meaning written out
below it (an audience never sees a hover tooltip).

It is for a projector, where five tall cards do not fit one screen, and for homework: in homework mode
each column says whether its number depends on the server's load (tokens/s and speedup do: other
visitors' races slow every method) or not (τ, acceptance, hit rate, and whether the method committed
vanilla's very tokens are the same on a busy server as on a quiet one). The numbers are the cards' own
(``app.cards.numbers``), computed once per row.
"""
from __future__ import annotations

import html

from .cards import baseline, numbers
from .intro import METRIC_HELP
from .provenance import badge_html, race_models
from .race import Result
from .summary import vanilla_match

EMPTY = "Run a race, or open a recorded one: its results appear here, one row per method."
LOAD = "depends on the server's load"
FREE = "same on any load"
# (header, METRIC_HELP key, whether the number depends on the server's load)
COLUMNS = [("tok/s", "tok/s", True), ("τ", "τ", False), ("acceptance", "accepted", False),
           ("hit rate", "hits", False), ("speedup", "speedup", True)]
SAME_TOKENS = ("Whether the method committed exactly vanilla's tokens. At temperature 0 every method must: "
               "the target checks each token, so the text never depends on the method or on the load.")


SAME_WORDS = {"vanilla": "reference", "missing": "–", "sampled": "sampled: not compared", "yes": "yes", "no": "no"}


def same_as_vanilla(result: Result, vanilla: Result | None) -> str:
    """The homework column, by the summary's rule (``app.summary.vanilla_match``): 'yes' (for a run cut
    short, 'yes (first n tokens)'), 'no', 'reference' for vanilla, 'sampled: not compared' at temperature
    > 0 (sampled runs differ by chance), '–' with nothing to compare."""
    verdict, compared = vanilla_match(result, vanilla)
    return f"yes (first {compared} tokens)" if verdict == "yes" and compared else SAME_WORDS[verdict]


def _cell(value, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def _percent(share) -> str:
    return "–" if share is None else f"{100 * share:.0f}%"


def row(result: Result, rate: float | None, vanilla: Result | None, homework: bool) -> str:
    """One method's row: its numbers (the cards' own), its badge, and in homework mode whether it
    committed vanilla's tokens."""
    n = numbers(result, rate) if result.metrics else {}
    speedup = ("1.00×" if result.method == "vanilla" and n else
               "too short to time" if n.get("untimed") else _cell(n.get("speedup"), "{:.2f}×"))
    cells = [_cell(n.get("tokens_per_s"), "{:.1f}"), _cell(n.get("tau"), "{:.2f}"),
             _percent(n.get("acceptance")), _percent(n.get("hit_rate")), speedup]
    if homework:
        cells.append(same_as_vanilla(result, vanilla))
    tds = "".join(f"<td>{html.escape(c)}</td>" for c in cells)
    return (f'<tr data-method="{html.escape(result.method)}"><th scope="row">{html.escape(result.title)}</th>'
            f'{tds}<td>{badge_html(result.trace.meta)}</td></tr>')


def header(homework: bool) -> str:
    """The column names; in homework mode each with whether its number depends on the server's load."""
    columns = [(name, load) for name, _, load in COLUMNS] + ([("same tokens as vanilla", False)] if homework else [])
    cells = "".join(
        f'<th scope="col" data-load="{"yes" if load else "no"}">{html.escape(name)}'
        + (f'<div class="load-mark">{LOAD if load else FREE}</div>' if homework else "") + "</th>"
        for name, load in columns)
    return f'<tr><th scope="col">method</th>{cells}<th scope="col">measured</th></tr>'


def definitions(homework: bool) -> str:
    """Each column's meaning, written out (the cards' tooltips, shown inline)."""
    items = [(name, METRIC_HELP[key]) for name, key, _ in COLUMNS]
    if homework:
        items.append(("same tokens as vanilla", SAME_TOKENS))
    return '<dl class="definitions">' + "".join(
        f"<dt>{html.escape(name)}</dt><dd>{html.escape(text)}</dd>" for name, text in items) + "</dl>"


def table_html(results: dict[str, Result] | None, homework: bool = False) -> str:
    """The results table of a race (``{method: Result}``), or a line saying how to get one."""
    shown = [r for r in (results or {}).values() if r.metrics]
    if not shown:
        return f'<div id="results-empty">{html.escape(EMPTY)}</div>'
    rate, vanilla = baseline(results), results.get("vanilla")
    named = race_models([r.trace.meta for r in shown])
    rows = "".join(row(r, rate, vanilla, homework) for r in shown)
    return (f'<div class="results-models">Models: <b>{html.escape(named)}</b></div>'
            f'<table class="results" data-homework="{"yes" if homework else "no"}">'
            f"<thead>{header(homework)}</thead><tbody>{rows}</tbody></table>{definitions(homework)}")
