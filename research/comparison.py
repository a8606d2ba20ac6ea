"""What the comparison scripts share: the command-line options that choose the bench prompts and
the answer length, those prompts, and the summary of an interleaved run.

    parser = comparison_parser(__doc__)   # --per-category (default 2), --max-new-tokens (default 64)
    ...                                   # the script's own options
    args = parser.parse_args()
    prompts = bench_prompts(args.per_category)
    table = run_interleaved(...)          # mirror_sd.tools.bench; its setup(index) changes more than a
                                          # method's options between runs
    summary, per_step = summarise_runs(table, labels)
    summary["drafting_ms"] = drafting_ms_per_step(summary, per_step)   # if the script wants it
    add_ms_per_step(summary, per_step, ["draft", "verify"])            # or these
    ...                                   # the script's own columns
    save_checked(summary, SWEEPS / "name.csv", "what must stay lossless")
"""
import argparse
import sys
from pathlib import Path

from mirror_sd.tools.bench import DEFAULT_PROMPTS, first_per_category, read_prompts, step_ms, summarise

SWEEPS = Path(__file__).resolve().parents[1] / "docs" / "sweeps"  # where the scripts' CSV records go


def comparison_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with the options every comparison takes."""
    parser = argparse.ArgumentParser(prog=f"python -m scripts.{Path(sys.argv[0]).stem}",
                                     description=doc.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=2, help="bench prompts per category (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per answer (default 64)")
    return parser


def bench_prompts(per_category: int) -> list[dict]:
    """The first ``per_category`` bench prompts of each category."""
    return first_per_category(read_prompts(DEFAULT_PROMPTS), per_category)


def summarise_runs(table, labels: list[str]):
    """Per run of ``bench.run_interleaved``'s table, named by ``labels`` (one per run, in order):
    ``bench.summarise``'s row and ``bench.step_ms``'s milliseconds per step by span kind (indexed
    by label)."""
    table["method"] = [labels[r] for r in table["run"]]  # one row per run in the summaries
    return summarise(table), step_ms(table).set_index("method")


def save_checked(summary, csv: Path, lossless: str):
    """Write the summary to ``csv`` and print it; stop with an error if a run differs from vanilla."""
    csv.parent.mkdir(exist_ok=True)
    summary.to_csv(csv, index=False)
    print(summary.round(3).to_string(index=False))
    if summary.equal_to_vanilla.min() < 1:
        raise SystemExit(f"a run differs from vanilla: {lossless}")


def add_ms_per_step(summary, per_step, kinds: list[str]):
    """Columns ``KIND_ms_per_step`` of ``summary``: each run's milliseconds per step in spans of that kind."""
    for kind in kinds:
        summary[f"{kind}_ms_per_step"] = summary.method.map(per_step[kind])


DRAFTING_SPANS = ["draft", "fallback-draft", "draft-rollout"]  # what proposes tokens: sd, eagle, ss; mirror


def drafting_ms_per_step(summary, per_step):
    """Milliseconds per step of drafting work (spans DRAFTING_SPANS) of each run in ``summary``."""
    spans = [kind for kind in DRAFTING_SPANS if kind in per_step]
    return summary.method.map(per_step[spans].fillna(0).sum(axis=1))
