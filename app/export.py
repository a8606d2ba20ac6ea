"""Downloads of a race: per method, spans and steps as CSV, the trace as JSON, and Chrome-trace JSON."""
from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from mirror_sd.trace import Trace

from .tokens import piece


def export_files(traces: dict[str, Trace], folder: str | Path | None = None, pieces: dict[str, dict] | None = None,
                 stamp: str | None = None) -> list[str]:
    """Write the files into ``folder`` (a new temporary folder when None) and return their paths.

    Each name starts with the race's ``stamp`` (default: for a recorded race, when and where it was
    recorded, e.g. ``recorded-20261127-qa-nvidia-h200``; for a live race, when it is written, e.g.
    ``race-20261126-163005``), so the downloads of two races do not overwrite each other.
    ``<stamp>-<method>.json`` loads back with ``Trace.from_json``; ``<stamp>-<method>.chrome.json``
    opens in Perfetto (ui.perfetto.dev) or chrome://tracing. With ``pieces`` ({method: {token id:
    text}}) the steps' CSV has each step's committed text beside its token ids. Times are in seconds,
    to the microsecond.
    """
    out = Path(folder or tempfile.mkdtemp(prefix="mirror-sd-"))
    out.mkdir(parents=True, exist_ok=True)
    stamp = stamp or recorded_stamp(traces) or time.strftime("race-%Y%m%d-%H%M%S")
    paths = []
    for name, trace in traces.items():
        steps = trace.steps_frame()
        if pieces and name in pieces:
            steps["text"] = ["".join(piece(pieces[name], t) for t in s.committed) for s in trace.steps]
        files = {
            f"{stamp}-{name}-spans.csv": trace.spans_frame().to_csv(index=False, float_format="%.6f"),
            f"{stamp}-{name}-steps.csv": steps.to_csv(index=False, float_format="%.6f"),
            f"{stamp}-{name}.json": trace.to_json(indent=1),
            f"{stamp}-{name}.chrome.json": json.dumps(trace.to_chrome_trace()),
        }
        for filename, text in files.items():
            (out / filename).write_text(text)
            paths.append(str(out / filename))
    return paths


def recorded_stamp(traces: dict[str, Trace]) -> str | None:
    """The files' stamp for a recorded race (``app.replay.load_race`` puts its recording in each trace's
    meta): its date, category and machine, not today's time; None for a live race."""
    found = next((t.meta["recording"] for t in traces.values() if t.meta.get("recording")), None)
    if not found:
        return None
    words = [(found.get(key) or "").replace("-", "" if key == "date" else "-") for key in ("date", "category", "hardware")]
    slugs = [re.sub(r"[^a-z0-9]+", "-", word.lower()).strip("-") for word in words]
    return "recorded-" + "-".join(slug for slug in slugs if slug)
