"""Downloads of a race: a summary table, per method its spans and steps as CSV, its trace as JSON and as
Chrome-trace JSON, and one zip of them all, every name starting with the race's stamp."""
from __future__ import annotations

import json
import re
import tempfile
import time
import zipfile
from pathlib import Path

from mirror_sd.trace import Trace

from .race import Result
from .summary import summary
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


def export_race(results: dict[str, Result], folder: str | Path | None = None, prompt: str | None = None,
                stamp: str | None = None) -> list[str]:
    """Every download of a race (``{method: Result}``; the methods that did any work): the zip of
    everything (``<stamp>.zip``), the summary (``<stamp>-summary.csv``, one row per method:
    ``app.summary``), then each method's files (``export_files``). Returns their paths, in that order."""
    out = Path(folder or tempfile.mkdtemp(prefix="mirror-sd-"))
    ran = {name: r for name, r in results.items() if r.trace.spans}
    stamp = stamp or recorded_stamp({n: r.trace for n, r in ran.items()}) or time.strftime("race-%Y%m%d-%H%M%S")
    files = export_files({n: r.trace for n, r in ran.items()}, out, pieces={n: r.pieces for n, r in ran.items()},
                         stamp=stamp)
    table = out / f"{stamp}-summary.csv"
    summary(ran, prompt).to_csv(table, index=False, float_format="%.6g")
    bundle = out / f"{stamp}.zip"
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as z:
        for path in [table, *map(Path, files)]:
            z.write(path, path.name)
    return [str(bundle), str(table), *files]
