"""Where a race's numbers come from, said on every card and results row: a badge, LIVE (run now on this
server, its processor named) or RECORDED (the machine and the day it ran on), and the models raced.

A recorded race's speeds are not this server's, and a 135M-parameter target gains little from drafting
on a GPU: without the badge and the models' names a number can teach the wrong lesson. Both are read
from the trace's meta: the engine records the models and their layers (``ModelPair.describe``), the
app's race adds this server's processor (``app.race``), a recorded race its recording (``app.replay``).
"""
from __future__ import annotations

import datetime
import html
from functools import cache

from mirror_sd import METHODS
from mirror_sd.devices import cpu_cores, hardware_name

BADGE_COLOURS = {"LIVE": ("#dcfce7", "#166534"), "RECORDED": ("#e0e7ff", "#3730a3")}


@cache
def cpu_name() -> str:
    """This server's CPU model and cores, read once: "AMD EPYC 7B13, 2 CPU cores"."""
    from mirror_sd.tools.bench import cpu_model

    return f"{cpu_model()}, {cpu_cores()} CPU cores"


def live_hardware(pair) -> str:
    """The processor a live race runs on: the GPUs its lanes use, else this server's CPU."""
    devices = [d for lane in (pair.target_lane, pair.draft_lane) for d in lane.devices]
    gpus = sorted({hardware_name(d) for d in devices if d.type != "cpu"})
    return ", ".join(gpus) if gpus else cpu_name()


def mark_live(meta: dict, pair) -> dict:
    """A live trace's meta with where and when it ran (``live``: hardware, date), once."""
    meta.setdefault("live", {"hardware": live_hardware(pair), "date": datetime.date.today().isoformat()})
    return meta


def badge(meta: dict) -> tuple[str, str]:
    """(kind, where) of a trace's numbers: ("RECORDED", "NVIDIA H200, 2026-11-27") or ("LIVE", "this
    server, AMD EPYC 7B13, 2 CPU cores")."""
    recording = meta.get("recording")
    if recording:
        hardware, day = recording.get("hardware") or "unknown hardware", recording.get("date") or "unknown day"
        return "RECORDED", f"{hardware}, {day}"
    return "LIVE", f"this server, {live_where(meta)}"


def live_where(meta: dict) -> str:
    """The hardware a live trace ran on (``mark_live``), or this server's CPU for one made before it."""
    return (meta.get("live") or {}).get("hardware") or cpu_name()


def badge_html(meta: dict) -> str:
    """The badge as a small coloured label, its kind in capitals and where beside it."""
    kind, where = badge(meta)
    back, ink = BADGE_COLOURS[kind]
    title = ("Measured just now, in a race run on this server." if kind == "LIVE" else
             "Measured when the race was recorded, on that machine, not on this server.")
    return (f'<span class="badge" data-badge="{kind}" title="{title}" style="background:{back};color:{ink};'
            f'border-radius:4px;padding:0 6px;font-size:12px;white-space:nowrap">'
            f'<strong>{kind}</strong> · {html.escape(where)}</span>')


def _model(name: str | None, layers: int | None) -> str:
    return f"{name or 'unknown'}" + (f" ({layers} layers)" if layers else "")


def models(meta: dict, method: str) -> str:
    """The models a method's run used, with their sizes: "target smollm2-135m-instruct (30 layers) + draft
    draft-smollm2-135m (4 layers)"; the draft only for methods that use it."""
    if not meta.get("target"):  # a live run not started yet: nothing to name
        return ""
    target = f"target {_model(meta.get('target'), meta.get('target_layers'))}"
    needs_draft = method in METHODS and METHODS[method].needs_draft
    if not needs_draft or not meta.get("draft"):
        return target
    return f"{target} + draft {_model(meta.get('draft'), meta.get('draft_layers'))}"


def race_models(metas: list[dict]) -> str:
    """The models of a whole race, once: target and draft with their sizes (the first trace that names them)."""
    target = next((m for m in metas if m.get("target")), {})
    draft = next((m for m in metas if m.get("draft")), {})
    parts = [f"target {_model(target.get('target'), target.get('target_layers'))}"] if target else []
    if draft:
        parts.append(f"draft {_model(draft.get('draft'), draft.get('draft_layers'))}")
    return " + ".join(parts)
