"""Int8 drafting against fp32 drafting, for every speculative method, in one interleaved run.

    python docs/int8_drafting.py [--per-category 2] [--max-new-tokens 64] [--methods sd,eagle,ss,mirror]

On the bench prompts, prompt by prompt: vanilla, then each method with int8 drafting (the
default: ``load_pair(int8_drafting=True)``, models/linear.py), then with fp32 drafting
(``bench.run_interleaved``, warmed up first). Prints, and writes to
docs/sweeps/int8_drafting.csv, each run's tau, speed against vanilla and milliseconds per step of
drafting work (spans draft, fallback-draft and draft-rollout), and checks every run against
vanilla token for token.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from comparison import bench_prompts, comparison_parser  # noqa: E402
from mirror_sd import load_pair  # noqa: E402
from mirror_sd.bench import SPAN_PREFIX, run_interleaved  # noqa: E402

DRAFTING_SPANS = ("draft", "fallback-draft", "draft-rollout")
CSV = Path(__file__).resolve().parent / "sweeps" / "int8_drafting.csv"


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--methods", default="sd,eagle,ss,mirror")
    args = parser.parse_args()
    pair = load_pair()
    prompts = bench_prompts(args.per_category)
    runs, int8 = [("vanilla", {})], [True]
    for method in args.methods.split(","):
        runs += [(method, {}), (method, {})]
        int8 += [True, False]

    def before_run(index):
        pair.int8_drafting = int8[index]

    table = run_interleaved(pair, prompts, runs, args.max_new_tokens, desc="int8 drafting", before_run=before_run)
    table["int8_drafting"] = [int8[r] for r in table["run"]]
    spans = [SPAN_PREFIX + kind for kind in DRAFTING_SPANS if SPAN_PREFIX + kind in table]
    table["drafting_s"] = table[spans].fillna(0).sum(axis=1)
    table["committed"] = table.mean_accepted * table.steps  # tokens committed by decoding steps (not prefills)
    summary = table.groupby(["run", "method", "int8_drafting"], as_index=False).agg(
        new_tokens=("new_tokens", "sum"), steps=("steps", "sum"), wall_s=("wall_s", "sum"),
        committed=("committed", "sum"), drafting_s=("drafting_s", "sum"), equal_to_vanilla=("equal_to_vanilla", "mean"))
    summary["mean_accepted"] = summary.committed / summary.steps
    summary["tokens_per_s"] = summary.new_tokens / summary.wall_s
    summary["speedup"] = summary.tokens_per_s / summary.tokens_per_s[0]
    summary["drafting_ms_per_step"] = 1000 * summary.drafting_s / summary.steps
    summary = summary.drop(columns=["run", "committed", "drafting_s"])
    CSV.parent.mkdir(exist_ok=True)
    summary.to_csv(CSV, index=False)
    print(summary.round(3).to_string(index=False))
    if summary.equal_to_vanilla.min() < 1:
        raise SystemExit("a run differs from vanilla: int8 drafting must stay lossless")


if __name__ == "__main__":
    main()
