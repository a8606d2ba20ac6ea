"""Plotly figures drawn from traces: timelines, utilisation, hypothesis trees. Nothing here times anything.

Timelines put one row per lane (labelled by real device and role, e.g. "target on cpu:0 / plays the GPU (same
CPU as the other lane)")
and draw each span as a horizontal bar (``go.Bar`` with ``base``) on a numeric millisecond axis.
"""
from __future__ import annotations

import time

from html import escape as html_escape

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from mirror_sd.nvml import PERIOD_S as NVML_PERIOD_S
from mirror_sd.trace import SpanKind, Trace

from .lanes import row_label
from .tokens import piece, visible
from .trees import layout as tree_layout
from .trees import step_tree

SPAN_KINDS = {  # kind -> (colour, legend text): every SpanKind
    SpanKind.PREFILL: ("#64748b", "prefill: read the prompt"),
    SpanKind.DECODE: ("#2563eb", "decode: target makes 1 token"),
    SpanKind.DRAFT: ("#f59e0b", "draft: draft proposes a window"),
    SpanKind.VERIFY: ("#6366f1", "verify: target checks the window"),
    SpanKind.TARGET_PREFIX: ("#1e3a8a", "target prefix: layers up to the early exit"),
    SpanKind.TARGET_SUFFIX: ("#38bdf8", "target suffix: remaining layers"),
    SpanKind.DRAFT_ROLLOUT: ("#10b981", "draft rollout: branches drafted in parallel"),
    SpanKind.RENDEZVOUS: ("#a855f7", "rendezvous: verify + pick branch (on a GPU: the target's picks)"),
    SpanKind.FALLBACK_DRAFT: ("#ef4444", "fallback draft: no branch hit, draft again"),
    SpanKind.CORRECTION_ROLLOUT: ("#f97316", "correction rollout: the next window if no branch hits"),
}
BRIEF = 0.003  # a span kind whose spans all last less than this share of the run gets a tick mark per span
LANE_ORDER = {"target": 0, "draft": 1}
LANE_COLOURS = {"target": "#2563eb", "draft": "#10b981"}  # the utilisation's bars and lines, per lane role


def ms_text(ms: float) -> str:
    """A time as the page writes it: to 0.1 ms under 10 ms (the H200 recordings' steps take 1 to 3 ms, and
    whole milliseconds would read "2 ms against 2 ms"), to the whole ms above, where tenths are noise."""
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def kind_style(kind: SpanKind) -> tuple[str, str]:
    """A span kind's colour and legend text."""
    return SPAN_KINDS[kind]


def lanes_of(trace: Trace) -> list[str]:
    """Lane labels, target first."""
    return sorted(trace.lanes, key=lambda label: LANE_ORDER.get(trace.lanes[label], 9))


def fresh(fig: go.Figure) -> go.Figure:
    """``fig``, made new: the page skips a figure equal to the one it shows, which keeps the width it was
    drawn at, and a chart drawn while its tab was hidden took plotly's default width."""
    fig.update_layout(meta=time.time())
    return fig


def placeholder(text: str) -> go.Figure:
    """An empty chart that says what will appear in it."""
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=15, color="#6b7280"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=120, margin=dict(l=10, r=10, t=10, b=10), plot_bgcolor="white")
    return fig


def run_end_ms(traces: list[Trace]) -> float:
    """End of the last span of any trace, in ms: the shared x-range of the timelines."""
    return 1000 * max((s.end for t in traces for s in t.spans), default=0.0)


def timeline(traces: dict[str, Trace], x_max_ms: float | None = None, step: int | None = None) -> go.Figure:
    """One row per method (titles: dict keys), lanes as bars; ``step`` highlighted. The replay's cursor is
    drawn on the page (``app.handlers.CURSOR_JS``), so a replay never redraws the chart."""
    names = list(traces)
    fig = make_subplots(rows=max(len(names), 1), cols=1, shared_xaxes=True, subplot_titles=names,
                        vertical_spacing=0.12 / max(len(names), 1))
    shown = set()
    for row, name in enumerate(names, start=1):
        _timeline_row(fig, traces[name], row, step, shown)
    x_max = x_max_ms if x_max_ms else run_end_ms(list(traces.values()))
    fig.update_xaxes(range=[0, 1.02 * x_max if x_max else 1])
    fig.update_xaxes(title_text="time since the run began (ms)", row=len(names), col=1)
    fig.update_layout(barmode="overlay", height=140 + 150 * len(names), margin=dict(l=10, r=10, t=40, b=40),
                      legend=dict(title="span kind", orientation="h", y=-0.08 - 0.3 / max(len(names), 1)),
                      hoverlabel=dict(align="left"))
    return fig


def _timeline_row(fig, trace: Trace, row: int, step: int | None, shown: set):
    by_kind: dict[str, list] = {}
    for s in trace.spans:
        by_kind.setdefault(s.kind, []).append(s)
    run_s = max((s.end for s in trace.spans), default=0.0)
    hover = ("step %{customdata[0]}: %{customdata[1]}<br>%{customdata[4]}<br>"
             "tokens %{customdata[2]}<br>%{customdata[3]:.2f} ms<extra>%{y}</extra>")
    for kind, spans in by_kind.items():
        colour, legend = kind_style(kind)
        opacity = [_opacity(s, step) for s in spans]
        data = [[s.step, s.kind, s.tokens, 1000 * s.duration, s.label] for s in spans]
        fig.add_trace(go.Bar(
            base=[1000 * s.start for s in spans], x=[1000 * s.duration for s in spans],
            y=[s.lane for s in spans], orientation="h", name=legend, legendgroup=kind,
            showlegend=kind not in shown, marker=dict(color=colour, line=dict(width=0.5, color="white"),
                                                      opacity=opacity),
            customdata=data, hovertemplate=hover), row=row, col=1)
        if all(s.duration < BRIEF * run_s for s in spans):  # too brief to see as bars: a tick marks each
            fig.add_trace(go.Scatter(
                x=[1000 * s.start for s in spans], y=[s.lane for s in spans], mode="markers", name=legend,
                legendgroup=kind, showlegend=False, customdata=data, hovertemplate=hover,
                marker=dict(symbol="line-ns", size=16, color=colour, opacity=opacity, line=dict(width=2, color=colour))),
                row=row, col=1)
        shown.add(kind)
    lanes = list(reversed(lanes_of(trace)))
    clocks = trace.meta.get("span_clocks", {})  # lane name -> "host" or "CUDA events"
    events = "<br>bars: when the GPU itself worked (CUDA events)"
    fig.update_yaxes(categoryorder="array", categoryarray=lanes, tickmode="array", tickvals=lanes,
                     ticktext=[row_label(lane, lanes) + (events if clocks.get(trace.lanes.get(lane)) == "CUDA events"
                                                         else "") for lane in lanes], row=row, col=1)


def step_spans(trace: Trace, step: int) -> list:
    """The spans of one decoding step."""
    return [s for s in trace.spans if s.step == step]


def typical_steps(trace: Trace) -> list[tuple[str, int]]:
    """(what, step) of a run's typical steps: the decoding step of median duration; for Mirror-SD the
    median step after a hit (its window ready) and after a miss (a fallback draft first), as each
    kind of step costs."""
    def median_of(steps: list) -> int | None:
        timed = sorted((max(s.end for s in spans) - min(s.start for s in spans), k)
                       for k in steps if (spans := step_spans(trace, k)))
        return timed[(len(timed) - 1) // 2][1] if timed else None

    steps = [s.index for s in trace.steps[1:]]
    if trace.method == "mirror":
        ready = median_of([s.index for s in trace.steps[1:] if s.rendezvous and not s.rendezvous.fallback])
        fallback = median_of([s.index for s in trace.steps[1:] if s.rendezvous and s.rendezvous.fallback])
        return [(what, k) for what, k in (("after a hit", ready), ("after a miss, a fallback draft first", fallback))
                if k is not None]
    k = median_of(steps)
    return [("a typical step", k)] if k is not None else []


def queued_on_gpu(trace: Trace) -> bool:
    """Whether a Mirror-SD trace's steps ran queued on CUDA streams (mirror_sd/executors.py: ``Streams``,
    chosen by executors.executor_for at T = 0 without the draft's streams on two CUDA lanes; a recording
    made before issue 71 says ``queued`` 0 in its options where its steps ran on the lanes' threads).
    Its ``rendezvous`` span is then only the target's picks (argmax) on the target stream, right after
    the suffix: the host reads them with the rollouts' table once both lanes are done, and verifies
    and matches the branch itself, in no span (docs/methods/mirror.md, Queued steps on a GPU)."""
    options, clocks = trace.meta.get("options", {}), trace.meta.get("span_clocks", {})
    return (trace.method == "mirror" and not trace.meta.get("temperature") and not options.get("streams")
            and options.get("queued", -1) in (1, -1) and len(clocks) == 2
            and set(clocks.values()) == {"CUDA events"})


HOST_COLOUR = "#d1d5db"
HOST_LEGEND = "host, after both lanes (no span): verify + match the branch, queue the next step"
HOST_TEXT = "verify + match"
QUEUED_LEGEND = "rendezvous on a GPU: the target's picks, verified on the host after both lanes"
QUEUED_NOTE = "target's picks only"  # by the rendezvous tick of a queued GPU step


def _host_rendezvous(fig, trace: Trace, k: int, t0: float, row: int, shown: set) -> float:
    """On a queued GPU step's row (``queued_on_gpu``): where the host's one wait returns (the end of the
    step's work on both lanes, the correction rollout aside: nothing waits for it), a dotted line; from
    there to the next step's first span, a grey bar on the target lane, the host's verify + match; a note
    on the rendezvous tick. Returns the end of what it drew (s, from the step's start)."""
    spans = step_spans(trace, k)
    waited = max(s.end for s in spans if s.kind != SpanKind.CORRECTION_ROLLOUT) - t0
    after = [s.start for s in trace.spans if s.step == k + 1]
    rendezvous = next((s for s in spans if s.kind == SpanKind.RENDEZVOUS), None)
    if rendezvous is None:
        return waited
    target, upto = rendezvous.lane, max(waited, min(after) - t0) if after else waited
    if upto > waited:
        fig.add_trace(go.Bar(base=[1000 * waited], x=[1000 * (upto - waited)], y=[target], orientation="h",
                             name=HOST_LEGEND, legendgroup="host", showlegend="host" not in shown,
                             text=[HOST_TEXT], textposition="inside", insidetextanchor="middle",
                             textfont=dict(size=10, color="#111827"),
                             marker=dict(color=HOST_COLOUR, pattern=dict(shape="/", fgcolor="#6b7280")),
                             hovertemplate="the host, once both lanes are done: reads the picks and the "
                                           "rollouts' table, verifies, matches the branch, queues the next "
                                           "step (no span: untimed host work, up to the next step's first "
                                           "GPU work)<br>%{x:.2f} ms<extra></extra>"), row=row, col=1)
        shown.add("host")
    fig.add_vline(x=1000 * waited, line=dict(color="#111827", width=1, dash="dot"), row=row, col=1)
    fig.add_annotation(x=1000 * (rendezvous.end - t0), y=target, row=row, col=1, ax=22, ay=0, showarrow=True,
                       arrowhead=2, arrowsize=0.7, arrowwidth=1, xanchor="left", font=dict(size=10),
                       bgcolor="rgba(255,255,255,0.85)", text=QUEUED_NOTE)
    return upto


def zoomed_steps(traces: dict[str, Trace]) -> go.Figure:
    """One typical step of each method (``typical_steps``) on one millisecond axis from the step's start:
    why one step costs less than another, at a glance (Mirror-SD's rollouts under its suffix, its
    rendezvous, a miss's fallback draft; sd's draft then verify; EAGLE's head levels then verify)."""
    rows = [(name, trace, what, k) for name, trace in traces.items() for what, k in typical_steps(trace)]
    titles = []
    for name, trace, what, k in rows:
        spans = step_spans(trace, k)
        ms = 1000 * (max(s.end for s in spans) - min(s.start for s in spans))
        step = next(s for s in trace.steps if s.index == k)
        titles.append(f"{name}: {what} (step {k}), {ms:.1f} ms, {len(step.committed)} token"
                      f"{'' if len(step.committed) == 1 else 's'}")
    fig = make_subplots(rows=max(len(rows), 1), cols=1, shared_xaxes=True, subplot_titles=titles,
                        vertical_spacing=0.12 / max(len(rows), 1))
    shown, longest = set(), 0.0
    for row, (name, trace, what, k) in enumerate(rows, start=1):
        spans = step_spans(trace, k)
        t0 = min(s.start for s in spans)
        longest = max(longest, max(s.end for s in spans) - t0)
        queued = queued_on_gpu(trace)
        for s in spans:
            colour, legend = kind_style(s.kind)
            if queued and s.kind == SpanKind.RENDEZVOUS:  # what the span times on a queued GPU step
                legend = QUEUED_LEGEND
                label = (f"{s.label}: on the GPU only the target's picks (argmax), right after the suffix; the host "
                         f"verifies and matches the branch only once the rollouts are done too")
            else:
                label = s.label
            fig.add_trace(go.Bar(base=[1000 * (s.start - t0)], x=[max(1000 * s.duration, 0.05)], y=[s.lane],
                                 orientation="h", name=legend, legendgroup=s.kind, showlegend=s.kind not in shown,
                                 marker=dict(color=colour, line=dict(width=0.5, color="white")),
                                 hovertemplate=f"{html_escape(label)}<br>%{{x:.2f}} ms<extra>%{{y}}</extra>"),
                          row=row, col=1)
            shown.add(s.kind)
        if queued:  # the verdict is read on the host after both lanes: drawn, and said
            longest = max(longest, _host_rendezvous(fig, trace, k, t0, row, shown))
        lanes = list(reversed(lanes_of(trace)))
        fig.update_yaxes(categoryorder="array", categoryarray=lanes, tickmode="array", tickvals=lanes,
                         ticktext=[row_label(lane, lanes) for lane in lanes], row=row, col=1)
    fig.update_xaxes(range=[0, 1.02 * 1000 * longest if longest else 1])
    fig.update_xaxes(title_text="ms since the step began (one axis for every method)", row=max(len(rows), 1), col=1)
    fig.update_layout(barmode="overlay", height=120 + 120 * len(rows), margin=dict(l=10, r=10, t=40, b=40),
                      legend=dict(title="span kind", orientation="h", y=-0.1 - 0.3 / max(len(rows), 1)),
                      dragmode="zoom")
    return fig


def step_window_ms(trace: Trace, step: int) -> tuple[float, float]:
    """The x-range (ms) that shows a step with its neighbours: from step-1's start to step+1's end."""
    near = [s for s in trace.spans if s.step is not None and abs(s.step - step) <= 1] or trace.spans
    return 1000 * min(s.start for s in near), 1000 * max(s.end for s in near)


def _opacity(span, step: int | None) -> float:
    return 1.0 if step is None or span.step == step else 0.25


def utilisation(traces: dict[str, Trace]) -> go.Figure:
    """Per lane, busy share of the whole run (left) and over time until the run ended (right, per method),
    from the spans, lanes in the timeline's order (target on top); on NVIDIA GPUs the GPU's own NVML
    readings too (a dotted line)."""
    names = list(traces)
    fig = make_subplots(rows=max(len(names), 1), cols=2, column_widths=[0.35, 0.65], shared_xaxes="columns",
                        horizontal_spacing=0.08, subplot_titles=[t for n in names for t in (n, "")])
    x_max = run_end_ms(list(traces.values()))
    shown = set()
    for row, name in enumerate(names, start=1):
        trace = traces[name]
        end = max((s.end for s in trace.spans), default=0.0)
        busy = trace.busy_seconds()
        lanes = lanes_of(trace)
        for lane in lanes:
            role = trace.lanes.get(lane, lane)
            colour = LANE_COLOURS.get(role, "#6b7280")
            share = busy.get(lane, 0.0) / end if end else 0.0
            fig.add_trace(go.Bar(x=[100 * share], y=[lane], orientation="h", marker_color=colour, showlegend=False,
                                 text=[f"{100 * share:.0f}%"], textposition="auto",
                                 hovertemplate="%{y}: busy %{x:.1f}% of the run<extra></extra>"), row=row, col=1)
            times, shares = busy_over_time(trace, lane, x_max / 1000)
            shares = [None if t > 1000 * end else x for t, x in zip(times, shares)]  # no line after its run ended
            fig.add_trace(go.Scatter(x=times, y=shares, mode="lines", line=dict(color=colour, shape="hv"),
                                     name=f"{role} lane", legendgroup=role, showlegend=role not in shown,
                                     hovertemplate=f"{lane}<br>%{{x:.0f}} ms: busy %{{y:.0f}}%<extra></extra>"),
                          row=row, col=2)
            shown.add(role)
        for device, (times, shares) in nvml_over_time(trace).items():  # markers: one reading is a dot
            fig.add_trace(go.Scatter(x=times, y=shares, mode="lines+markers", line=dict(color="#f59e0b", dash="dot"),
                                     name=f"{device} (NVML)", legendgroup=device, showlegend=device not in shown,
                                     hovertemplate=f"{device}, NVML<br>%{{x:.0f}} ms: GPU busy %{{y:.0f}}%"
                                                   "<extra></extra>"),
                          row=row, col=2)
            shown.add(device)
        if note := nvml_note(trace):
            fig.add_annotation(text=note, row=row, col=2, xref="x domain", yref="y domain", x=0, y=1,
                               xanchor="left", yanchor="bottom", showarrow=False, font=dict(size=11, color="#92400e"))
        top_first = list(reversed(lanes))  # plotly stacks categories from the bottom up
        fig.update_yaxes(categoryorder="array", categoryarray=top_first, tickmode="array", tickvals=top_first,
                         ticktext=[row_label(lane, lanes) for lane in top_first], row=row, col=1)
        fig.update_xaxes(range=[0, 100], row=row, col=1)
        fig.update_yaxes(range=[0, 105], ticksuffix="%", row=row, col=2)
        fig.update_xaxes(range=[0, x_max or 1], row=row, col=2)
    fig.update_xaxes(title_text="% of its run busy", row=len(names), col=1)
    fig.update_xaxes(title_text="busy over time: ms since the run began", row=len(names), col=2)
    fig.update_layout(height=200 + 170 * len(names), margin=dict(l=10, r=10, t=60, b=90),
                      legend=dict(orientation="h", yref="container", y=0, yanchor="bottom", x=0, xanchor="left"))
    return fig  # the legend at the foot, clear of the toolbar (top right) and of the method titles


def nvml_note(trace: Trace) -> str:
    """What the chart says where a run on a GPU has fewer than two NVML readings, so no line: the sampler
    reads every ``NVML_PERIOD_S`` (mirror_sd/nvml.py) and the H200 recordings' runs last 30 to 130 ms. '' where the run
    used no GPU or two readings or more were taken."""
    if not any("cuda" in lane for lane in trace.lanes):
        return ""
    n, ms = len(trace.gpu_samples), 1000 * max((s.end for s in trace.spans), default=0.0)
    if n >= 2:
        return ""
    taken = "no NVML reading was taken" if n == 0 else "one NVML reading only (the dot)"
    return f"{taken}: this run lasted {ms_text(ms)}, and the GPU is read every {ms_text(1000 * NVML_PERIOD_S)}"


def nvml_over_time(trace: Trace) -> dict[str, tuple[list, list]]:
    """Per GPU, the NVML utilisation readings (ms since the run began, %); empty off NVIDIA GPUs."""
    series: dict[str, tuple[list, list]] = {}
    for g in trace.gpu_samples:
        times, shares = series.setdefault(g.device, ([], []))
        times.append(1000 * g.t)
        shares.append(g.percent)
    return series


def busy_over_time(trace: Trace, lane: str, horizon_s: float, bins: int = 60) -> tuple[list, list]:
    """Share of each time bin (in %) that ``lane`` spent inside its spans; bin starts in ms."""
    if horizon_s <= 0:
        return [], []
    width = horizon_s / bins
    busy = [0.0] * bins
    for s in trace.spans:
        if s.lane != lane:
            continue
        first, last = int(s.start / width), min(int(s.end / width), bins - 1)
        for b in range(first, last + 1):
            busy[b] += max(0.0, min(s.end, (b + 1) * width) - max(s.start, b * width))
    return [1000 * b * width for b in range(bins)], [100 * x / width for x in busy]


NODE_STYLES = {  # tree node kind -> (colour, size)
    "root": ("#111827", 14),
    "accepted": ("#16a34a", 14),
    "rejected": ("#9ca3af", 12),
    "candidate": ("#d1d5db", 7),
    "rolled out": ("#f59e0b", 11),
    "used": ("#7c3aed", 14),
    "target token, no branch": ("#ef4444", 14),
    "draft node": ("#60a5fa", 11),
    "copied from context": ("#2dd4bf", 11),
}


def tree(step, pieces: dict, title: str = "") -> go.Figure:
    """A step's hypothesis tree (see trees.py): depth left to right, one row per line of the tree, each
    depth's column as wide as its longest label (``trees.layout``), so no two labels overlap."""
    nodes = step_tree(step)
    fig = go.Figure()
    if not nodes:
        fig.add_annotation(text="This step recorded no draft tree.", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper")
        fig.update_layout(height=200, xaxis_visible=False, yaxis_visible=False)
        return fig
    labels = ["" if n.kind == "candidate" else "text so far" if n.token is None else visible(piece(pieces, n.token))
              for n in nodes]  # candidates: a small dot, no label (hover says the token)
    xs, ys, columns = tree_layout(nodes, labels)
    edge_x, edge_y = [], []
    for i, n in enumerate(nodes):
        if n.parent is not None:
            edge_x += [xs[n.parent], xs[i], None]
            edge_y += [ys[n.parent], ys[i], None]
    fig.add_trace(go.Scatter(x=edge_x, y=edge_y, mode="lines", line=dict(color="#cbd5e1", width=1),
                             hoverinfo="skip", showlegend=False))
    for kind, (colour, size) in NODE_STYLES.items():
        idx = [i for i, n in enumerate(nodes) if n.kind == kind]
        if not idx:
            continue
        said = [visible(piece(pieces, nodes[i].token)) if nodes[i].token is not None else labels[i] for i in idx]
        fig.add_trace(go.Scatter(
            x=[xs[i] for i in idx], y=[ys[i] for i in idx], mode="markers" if kind == "candidate" else "markers+text",
            marker=dict(color=colour, size=size, line=dict(width=1, color="white")), name=kind,
            text=[labels[i] for i in idx], textposition="middle right", textfont=dict(size=11),
            customdata=[[said[j], nodes[i].note] for j, i in enumerate(idx)],
            hovertemplate="%{customdata[0]}<br>%{customdata[1]}<extra>" + kind + "</extra>"))
    rows = 1 - min(ys)
    fig.update_layout(title=title, height=150 + 22 * rows,
                      xaxis=dict(title="depth (tokens after the committed text)", tickvals=columns[:-1],
                                 ticktext=[str(d) for d in range(len(columns) - 1)], range=[-1.5, columns[-1]],
                                 zeroline=False),
                      yaxis=dict(visible=False, range=[min(ys) - 0.7, 0.7]), margin=dict(l=10, r=10, t=40, b=90),
                      legend=dict(title="node", orientation="h", yref="container", y=0, yanchor="bottom"))
    return fig
