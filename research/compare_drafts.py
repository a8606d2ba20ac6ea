"""Compare drafts on the bench prompts, interleaved: per prompt, vanilla, then each method with each
draft at each γ, all on one loaded target.

    python -m research.compare_drafts DRAFT [DRAFT ...] [--methods sd] [--gammas 2,5] [--per-category 2]
                                     [--max-new-tokens 64] [--csv docs/sweeps/compare_drafts.csv]

A draft is a folder that ``python -m mirror_sd.train draft`` writes ("default": the shipped one,
mirror_sd/assets/draft-smollm2-135m); the methods are those that use a draft (sd, mirror), with
their other options at their defaults. Prints, and writes to --csv, each run's tau, speed against
vanilla in the same run (``bench.summarise``) and milliseconds per step of drafting (span ``draft``
for sd; mirror's are ``fallback-draft`` and ``draft-rollout``; int8 on the CPU as by default), and
checks every run against vanilla token for token. The draft is swapped between runs
(``pair.use_draft``).
"""
from pathlib import Path

from mirror_sd import load_pair
from mirror_sd.tools.bench import run_interleaved
from research.comparison import (SWEEPS, bench_prompts, comparison_parser, drafting_ms_per_step, save_checked,
                                 summarise_runs)

CSV = SWEEPS / "compare_drafts.csv"
COLUMNS = ["method", "new_tokens", "mean_accepted", "tokens_per_s", "speedup", "equal_to_vanilla", "hit_rate",
           "wall_s", "draft_ms_per_step"]


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("drafts", nargs="+", help='draft folders ("default": the shipped draft)')
    parser.add_argument("--methods", default="sd", help="methods that use the draft: sd, mirror (default sd)")
    parser.add_argument("--gammas", default="2,5", help="window lengths (default 2,5)")
    parser.add_argument("--csv", type=Path, default=CSV, help=f"where the summary goes (default {CSV})")
    args = parser.parse_args()
    pair = load_pair()
    shipped = pair.draft_name
    drafts = [shipped if d == "default" else d for d in args.drafts]
    runs, run_drafts, labels = [("vanilla", {})], [shipped], ["vanilla"]
    for method in args.methods.split(","):
        for draft in drafts:
            for gamma in map(int, args.gammas.split(",")):
                runs.append((method, dict(gamma=gamma)))
                run_drafts.append(draft)
                labels.append(f"{method}, {Path(draft).name}, gamma {gamma}")

    table = run_interleaved(pair, bench_prompts(args.per_category), runs, args.max_new_tokens,
                            setup=lambda index: pair.use_draft(run_drafts[index]), desc="compare drafts")
    summary, per_step = summarise_runs(table, labels)
    summary["draft_ms_per_step"] = drafting_ms_per_step(summary, per_step)
    save_checked(summary[COLUMNS], args.csv, "every draft must keep its method lossless")


if __name__ == "__main__":
    main()
