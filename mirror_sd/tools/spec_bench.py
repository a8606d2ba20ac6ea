"""A bench run reported as Spec-Bench reports one, and the acceptance-length histograms behind its τ.

Spec-Bench (hemingkx/Spec-Bench, ``evaluation/speed.py``) gives per method, for each of its six
tasks and overall: the speedup, the mean over the task's questions of the method's tokens per second
over the same mean of vanilla's, and the mean accepted tokens, the mean over every decoding step of
the tokens it committed (τ). Its leaderboard lays them out one row per method: a speedup per task,
the overall mean accepted tokens, the overall speedup. ``table`` computes exactly those from a
bench's results (one row per method and question; a question's turns together, as speed.py sums
them), ``histogram`` the distribution of the tokens each step committed, per method and task, which
the mean hides (vLLM's per-request acceptance metrics give the same histogram).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd


# Spec-Bench's six tasks, in its report's column order; MT-Bench's eight categories make its first task.
SPEC_BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
BUNDLED_TASKS = {"multi-turn": "mt_bench", "math": "math_reasoning"}  # the bundled prompts' names for two
TITLES = {"mt_bench": "Multi-turn Conversation", "translation": "Translation", "summarization": "Summarization",
          "qa": "Question Answering", "math_reasoning": "Mathematical Reasoning",
          "rag": "Retrieval-aug. Generation"}


def accept_lengths(results: pd.DataFrame) -> pd.DataFrame:
    """One row per decoding step: method, task, length (tokens the step committed)."""
    rows = [(r.method, r.task, int(n)) for r in results.itertuples() for n in str(r.accept_lengths).split() if n]
    return pd.DataFrame(rows, columns=["method", "task", "length"])


def table(results: pd.DataFrame) -> pd.DataFrame:
    """Spec-Bench's leaderboard row per method (vanilla first, at 1.00): each task's speedup, the overall
    mean accepted tokens and the overall speedup; and, per task, its mean accepted tokens (``tau_<task>``)."""
    speeds = results.assign(speed=results.new_tokens / results.wall_s)
    steps = accept_lengths(results)
    tasks = [t for t in SPEC_BENCH_TASKS if t in set(results.task)] + \
        sorted(set(results.task) - set(SPEC_BENCH_TASKS))
    rows = []
    for method, mine in speeds.groupby("method", sort=False):
        base = speeds[(speeds.method == "vanilla") & speeds.id.isin(mine.id)]
        row = {"method": method}
        for task in [*tasks, "overall"]:
            here = mine if task == "overall" else mine[mine.task == task]
            there = base if task == "overall" else base[base.task == task]
            lengths = steps[(steps.method == method) & ((steps.task == task) | (task == "overall"))].length
            row[task] = here.speed.mean() / there.speed.mean() if len(here) and len(there) else float("nan")
            row[f"tau_{task}"] = lengths.mean() if len(lengths) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def markdown(spec: pd.DataFrame, caption: str) -> str:
    """Spec-Bench's leaderboard layout (speedups per task, #Mean Accepted Tokens, Overall), then the mean
    accepted tokens per task, each under ``caption``."""
    tasks = [c for c in spec.columns if c not in ("method", "overall") and not c.startswith("tau_")]
    board = pd.DataFrame({"Models": spec.method,
                          **{TITLES.get(t, t): spec[t].map("{:.2f}x".format) for t in tasks},
                          "#Mean Accepted Tokens": spec.tau_overall.map("{:.2f}".format),
                          "Overall": spec.overall.map("{:.2f}x".format)})
    taus = pd.DataFrame({"Models": spec.method, **{TITLES.get(t, t): spec[f"tau_{t}"].map("{:.2f}".format)
                                                   for t in [*tasks, "overall"]}})
    return (f"{caption}\n\n" + board.to_markdown(index=False) + "\n\nMean accepted tokens (τ) per task:\n\n"
            + taus.to_markdown(index=False) + "\n")


def histogram(results: pd.DataFrame) -> pd.DataFrame:
    """Per method and task (and ``overall``): how many decoding steps committed each number of tokens,
    and their share of the steps."""
    steps = accept_lengths(results)
    both = pd.concat([steps, steps.assign(task="overall")])
    counts = both.groupby(["method", "task", "length"], sort=False).size().rename("steps").reset_index()
    counts["share"] = counts.steps / counts.groupby(["method", "task"]).steps.transform("sum")
    return counts.sort_values(["method", "task", "length"], kind="stable").reset_index(drop=True)


def plot_histogram(hist: pd.DataFrame, path: Path):
    """The overall histogram per method as grouped bars, one panel per task below (plotly, small file)."""
    import plotly.express as px

    fig = px.bar(hist, x="length", y="share", color="method", barmode="group", facet_row="task",
                 labels=dict(length="tokens committed in a step", share="share of steps"),
                 title="Acceptance length: tokens committed per decoding step")
    fig.update_layout(height=220 * hist.task.nunique() + 120, width=900)
    fig.write_html(path, include_plotlyjs="cdn")
