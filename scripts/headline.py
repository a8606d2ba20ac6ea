"""The headline table: each method's τ, speedup and tokens/s in the runs the docs quote, with the machine,
dtype, date and command of each run, read from the runs' own files, so that a number is written once.

A run is a bench's output folder (``bench --out``: summary.csv, one row per method) and its report
(``bench --report``: the Command, Date, Machine and Dtype lines at its top). A bench that gpu-check ran
also names the gpu-check report it is part of, whose command the table gives too, and which gives the
dtype where the bench's report predates its Dtype line (the stage table's note names the target's
torch dtype).

``python -m scripts.headline`` writes the table between the ``<!-- benchmarks:start -->`` and
``<!-- benchmarks:end -->`` markers of README.md and docs/results.md; ``--check`` writes nothing and
exits 1 where either differs from what the runs' files say (after a new bench run, say).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mirror_sd.models.auto_dtype import short_name

ROOT = Path(__file__).resolve().parents[1]  # the clone: the runs and the docs are its files
START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"
PAGES = ("README.md", "docs/results.md")  # where the table is written, between the markers


@dataclass(frozen=True)
class Run:
    """A bench run the docs quote: its output folder and report, relative to the clone, and the gpu-check
    report it is part of, if any."""

    folder: str
    report: str
    gpu_check: str | None = None


RUNS = (
    Run("docs/bench", "docs/benchmarks.md"),
    Run("docs/gpu/h200-2026-11-27-launch/bench-graphs-on", "docs/gpu/h200-2026-11-27-launch/bench-graphs-on.md",
        gpu_check="docs/gpu/h200-2026-11-27-launch/report.md"),
)


def header(report: str) -> dict[str, str]:
    """The 'Key: value' lines of a bench report's top (before its table): {"Command": ..., "Date": ...}."""
    lines = report.split("\n|", 1)[0].splitlines()
    return {m[1]: m[2].strip() for line in lines if (m := re.match(r"(Command|Date|Machine|Dtype): (.*)", line))}


def dtype_name(text: str) -> str:
    """A dtype as the reports name it, short: "fp32: no native bf16." -> "fp32"; "torch.bfloat16" -> "bf16"."""
    return short_name(text.split(":")[0].strip().rstrip("."))


def gpu_check_facts(text: str) -> tuple[str, str | None]:
    """(the gpu-check command, the target's dtype or None) from its report.md: the command is the first
    code span of its first line after the title; the dtype, the first torch dtype it names."""
    first = next(line for line in text.splitlines()[1:] if line.strip())
    dtype = re.search(r"torch\.(float32|float16|bfloat16)", text)
    return re.search(r"`([^`]+)`", first)[1], dtype_name(dtype[0]) if dtype else None


@dataclass
class Measured:
    """One run, read: its summary rows and the facts the table gives beside them."""

    run: Run
    summary: pd.DataFrame
    machine: str
    dtype: str
    date: str
    command: str
    part_of: str | None  # the gpu-check command it ran in


def machine(line: str) -> str:
    """A report's Machine line, short: its accelerators where it names any ("NVIDIA H200"), else its CPU
    ("AMD EPYC, 2 CPU cores"); torch's version and the lanes after the first ';' are left out."""
    parts = line.split(";")[0].split(", ")
    cores = next((i for i, part in enumerate(parts) if part.endswith("CPU cores")), len(parts) - 1)
    return ", ".join(parts[cores + 1:] or parts)


def read_run(run: Run, root: Path = ROOT) -> Measured:
    facts = header((root / run.report).read_text(encoding="utf-8"))
    missing = {"Command", "Date", "Machine"} - set(facts)
    if missing:
        raise SystemExit(f"{run.report}: no {', '.join(sorted(missing))} line: is it a bench --report?")
    part_of, dtype = None, facts.get("Dtype")
    if run.gpu_check:
        part_of, gpu_dtype = gpu_check_facts((root / run.gpu_check).read_text(encoding="utf-8"))
        dtype = dtype or gpu_dtype
    return Measured(run, pd.read_csv(root / run.folder / "summary.csv"),
                    machine=machine(facts["Machine"]),
                    dtype=dtype_name(dtype) if dtype else "not recorded",
                    date=facts["Date"].split()[0], command=facts["Command"].strip("`"), part_of=part_of)


def table(measured: list[Measured], page: str) -> str:
    """The markdown block between the markers, its links relative to ``page`` (a path in the clone)."""
    here = Path(page).parent

    def link(path: str) -> str:
        return Path(os.path.relpath(path, here)).as_posix()

    rows = ["| method | τ | speedup | tokens/s | machine | dtype | date | command |",
            "|:--|--:|--:|--:|:--|:--|:--|:--|"]
    notes = []
    for i, m in enumerate(measured, 1):
        for r in m.summary.itertuples():
            rows.append(f"| {r.method} | {r.mean_accepted:.3f} | {r.speedup:.2f}× | {r.tokens_per_s:.1f} | "
                        f"{m.machine} | {m.dtype} | {m.date} | ({i}) |")
        part = f", one part of `{m.part_of}`" if m.part_of else ""
        source = m.run.gpu_check or m.run.report
        notes.append(f"- ({i}) `{m.command}`{part}: [report]({link(source)}), [files]({link(m.run.folder)}/).")
    return "\n".join([
        f"<!-- generated by `python -m scripts.headline` from the runs' files: run it again, do not "
        "edit -->", *rows, "", *notes])


def fill(text: str, block: str, name: str) -> str:
    """``text`` with ``block`` between its markers."""
    if START not in text or END not in text:
        raise SystemExit(f"{name}: no {START} ... {END} markers to write the table between")
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{block}\n{END}{rest.split(END, 1)[1]}"


def write(root: Path = ROOT, runs=RUNS, pages=PAGES, check: bool = False) -> list[str]:
    """Write the table into ``pages`` (``check``: write nothing); the pages that were not up to date."""
    measured = [read_run(run, root) for run in runs]
    stale = []
    for page in pages:
        path = root / page
        text = path.read_text(encoding="utf-8")
        new = fill(text, table(measured, page), page)
        if new != text:
            stale.append(page)
            if not check:
                path.write_text(new, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.headline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a page is not up to date")
    args = parser.parse_args(argv)
    stale = write(check=args.check)
    for page in stale:
        print(f"{page}: {'not up to date: run python -m scripts.headline' if args.check else 'written'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
