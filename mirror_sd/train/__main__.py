"""``python -m mirror_sd.train <subcommand>``: training tools.

Subcommands:
  data   build prompts (offline corpora, or written by the target: --source self-instruct) and
         record the target's greedy answers (distillation data); see mirror_sd/train/distill.py.
         --source reference takes the answers from the corpora too (mirror_sd/train/reference.py).
  draft  train a draft for the target on that data; see mirror_sd/train/draft.py.
  ss     train speculative streams for the frozen target (or a draft); see mirror_sd/train/ss.py.
  eagle  train an EAGLE head for the target on its features; see mirror_sd/train/eagle.py.
  exit-head  train Mirror-SD's early-exit head (a tuned lens) on the same features; see
         mirror_sd/train/exit_head.py.

Each subcommand is a function that registers a subparser and sets ``func``.
"""
from __future__ import annotations

import argparse
import sys

from .generate import SAMPLERS
from .options import positive_int


def _add_data(sub) -> None:
    p = sub.add_parser("data", help="distillation data: prompts from offline corpora + target answers",
                       description="Build --num-prompts prompts (from offline corpora, evenly over the six "
                                   "Spec-Bench categories, or written by the target: --source) and write the target's greedy answers to "
                                   "OUT/data.jsonl. Resumable: rerun the same command to continue.")
    p.add_argument("--out", required=True, help="output folder (data.jsonl, sources.json, README.md, ...)")
    p.add_argument("--source", choices=("corpora", "self-instruct", "reference"), default="corpora",
                   help="where prompts come from: offline corpora, evenly over the six Spec-Bench categories "
                        "(default), or user requests the target writes itself (mirror_sd/train/instruct.py); "
                        "reference: corpus prompts with answers from the corpora too, nothing generated "
                        "(off-policy data for the EAGLE head: mirror_sd/train/reference.py)")
    p.add_argument("--target", default=None,
                   help="the model whose answers the data holds, and who writes self-instruct prompts: a Hugging "
                        "Face id or a local model folder (default: the embedded SmolLM2-135M-Instruct); "
                        "through its chat template, or as plain text where it has none")
    p.add_argument("--seed", type=int, default=0, help="prompt selection / sampling seed (default 0)")
    p.add_argument("--num-prompts", type=positive_int, required=True, help="number of prompts (multi-turn ones give 2 examples)")
    p.add_argument("--max-new-tokens", type=positive_int, default=192, help="answer length cap per turn (default 192)")
    p.add_argument("--batch-size", type=positive_int, default=32,
                   help="rows decoded together, refilled as answers finish (default 32)")
    p.add_argument("--threads", type=positive_int, default=2,
                   help="torch CPU threads (default 2; use 1 for a niced background run on a shared box)")
    p.add_argument("--device", default="cpu",
                   help="where the target runs: cpu (default) or cuda[:N], in fp32 either way; a GPU answers "
                        "far faster with a large --batch-size")
    p.add_argument("--round-size", type=positive_int, default=None,
                   help="self-instruct: requests sampled together, one seeded round each (default 64; part of "
                        "what a seed gives, so a folder keeps its round size; a GPU samples far faster with 512)")
    p.add_argument("--sampler", choices=SAMPLERS, default=None,
                   help="self-instruct: how tokens are drawn: multinomial (default: the draws of the project's "
                        "earlier data) or inverse-cdf (the same law, other draws, far faster on a GPU)")
    p.add_argument("--prompts-only", action="store_true",
                   help="write OUT/prompts.jsonl and stop; rerunning without this flag answers them, also on a "
                        "machine without the corpora packages (copy OUT there)")

    def run(args):
        from .distill import run_data
        return run_data(args)

    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mirror_sd.train", description="mirror-sd training tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_data(sub)
    from .draft import add_parser as add_draft

    add_draft(sub)
    from .ss import add_parser as add_ss

    add_ss(sub)
    from .eagle import add_parser as add_eagle

    add_eagle(sub)
    from .exit_head import add_parser as add_exit_head

    add_exit_head(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..errors import MirrorSDError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except MirrorSDError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
