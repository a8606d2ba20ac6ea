"""Downloads of a race: per method, spans and steps as CSV, the trace as JSON, and Chrome-trace JSON."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mirror_sd.trace import Trace


def export_files(traces: dict[str, Trace], folder: str | Path | None = None) -> list[str]:
    """Write the files into ``folder`` (a new temporary folder when None) and return their paths.

    ``<method>.json`` loads back with ``Trace.from_json``; ``<method>.chrome.json`` opens in Perfetto
    (ui.perfetto.dev) or chrome://tracing.
    """
    out = Path(folder or tempfile.mkdtemp(prefix="mirror-sd-"))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, trace in traces.items():
        files = {
            f"{name}-spans.csv": trace.spans_frame().to_csv(index=False),
            f"{name}-steps.csv": trace.steps_frame().to_csv(index=False),
            f"{name}.json": trace.to_json(indent=1),
            f"{name}.chrome.json": json.dumps(trace.to_chrome_trace()),
        }
        for filename, text in files.items():
            (out / filename).write_text(text)
            paths.append(str(out / filename))
    return paths
