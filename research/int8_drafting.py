"""Int8 drafting against fp32 drafting, for every speculative method, in one interleaved run.

    python -m research.int8_drafting [--per-category 2] [--max-new-tokens 64] [--methods sd,eagle,ss,mirror]

On the bench prompts, prompt by prompt: vanilla, then each method with int8 drafting (the
default: ``load_pair(int8_drafting=True)``, models/linear.py), then with fp32 drafting
(``bench.run_interleaved``, warmed up first). Prints, and writes to
docs/sweeps/int8_drafting.csv, each run's tau, speed against vanilla (``bench.summarise``) and
milliseconds per step of drafting work (spans draft, fallback-draft and draft-rollout:
``bench.step_ms``), and checks every run against vanilla token for token.
"""
from mirror_sd import load_pair
from mirror_sd.tools.bench import run_interleaved
from research.comparison import (SWEEPS, bench_prompts, comparison_parser, drafting_ms_per_step, save_checked,
                                 summarise_runs)

CSV = SWEEPS / "int8_drafting.csv"
COLUMNS = ["method", "new_tokens", "mean_accepted", "tokens_per_s", "speedup", "equal_to_vanilla", "wall_s",
           "drafting_ms_per_step"]


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--methods", default="sd,eagle,ss,mirror")
    args = parser.parse_args()
    pair = load_pair()
    runs, int8, labels = [("vanilla", {})], [True], ["vanilla"]
    for method in args.methods.split(","):
        runs += [(method, {}), (method, {})]
        int8 += [True, False]
        labels += [method, f"{method}, fp32 drafting"]

    def setup(index):
        pair.int8_drafting = int8[index]

    table = run_interleaved(pair, bench_prompts(args.per_category), runs, args.max_new_tokens, setup=setup,
                            desc="int8 drafting")
    summary, per_step = summarise_runs(table, labels)
    summary["drafting_ms_per_step"] = drafting_ms_per_step(summary, per_step)
    save_checked(summary[COLUMNS], CSV, "int8 drafting must stay lossless")


if __name__ == "__main__":
    main()
