"""Mirror-SD's target suffix taking the draft lane's core once the rollouts are done, against not.

    python -m research.suffix_cores [--per-category 4] [--max-new-tokens 64]

On a CPU the two lanes split the cores, so the suffix runs on one core beside the rollouts; the
rollouts usually end first, and the suffix then takes both cores for its remaining layers and its LM
head (``Lane.widen_when_done``, called by ``methods/mirror.py: target_suffix``). Interleaved on the
bench prompts (``bench.run_interleaved``, warmed up first): vanilla, then mirror as shipped, then
mirror with the suffix kept on its one core. Prints each one's tau, speed against vanilla and the
suffix's milliseconds per step (``bench.summarise``, ``bench.step_ms``), and checks every run
against vanilla token for token.
"""
from mirror_sd import load_pair
from mirror_sd.devices import Lane
from mirror_sd.tools.bench import run_interleaved, step_ms, summarise
from research.comparison import bench_prompts, comparison_parser

SHIPPED = Lane.widen_when_done
LABELS = ["vanilla", "mirror", "mirror, suffix on one core"]


def main():
    parser = comparison_parser(__doc__)
    parser.set_defaults(per_category=4)
    args = parser.parse_args()
    pair = load_pair()
    runs = [("vanilla", {}), ("mirror", {}), ("mirror", {})]

    def setup(index):
        Lane.widen_when_done = SHIPPED if index < 2 else (lambda lane, beside: None)

    try:
        table = run_interleaved(pair, bench_prompts(args.per_category), runs, args.max_new_tokens, setup=setup,
                                desc="suffix cores")
    finally:
        Lane.widen_when_done = SHIPPED
    table["method"] = [LABELS[r] for r in table["run"]]  # one row per run in the summaries
    summary = summarise(table).set_index("method")
    summary["suffix_ms_per_step"] = step_ms(table).set_index("method")["target-suffix"]
    print(summary[["mean_accepted", "speedup", "suffix_ms_per_step", "equal_to_vanilla"]].round(3).to_string())
    if summary.equal_to_vanilla.min() < 1:
        raise SystemExit("a run differs from vanilla")


if __name__ == "__main__":
    main()
