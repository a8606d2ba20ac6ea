"""What the comparison scripts beside this file share: the command-line options that choose the
bench prompts and the answer length, and those prompts.

    parser = comparison_parser(__doc__)   # --per-category (default 2), --max-new-tokens (default 64)
    ...                                   # the script's own options
    args = parser.parse_args()
    prompts = bench_prompts(args.per_category)
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mirror_sd.bench import DEFAULT_PROMPTS, first_per_category, read_prompts  # noqa: E402


def comparison_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with the options every comparison takes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=2, help="bench prompts per category (default 2)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per answer (default 64)")
    return parser


def bench_prompts(per_category: int) -> list[dict]:
    """The first ``per_category`` bench prompts of each category."""
    return first_per_category(read_prompts(DEFAULT_PROMPTS), per_category)
