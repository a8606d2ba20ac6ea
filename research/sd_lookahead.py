"""sd with each of the draft's drafters, in one interleaved run: token by token (streams=0), its
streams in one unchecked forward (streams=1), and checking its streams' lookahead (streams=2,
drafting/streamed.py: checked_window, with its lookahead tree and copied branch).

    python -m research.sd_lookahead [--per-category 2] [--max-new-tokens 64] [--runs 0,2]

On the bench prompts, prompt by prompt (``bench.run_interleaved``, warmed up first): vanilla, then
``sd`` at gamma 5 with the shipped draft. ``--runs`` keeps some of them (numbers in the order of
``RUNS``, from 0), for a run on more prompts. The lookahead's other forms (a chain, wider trees,
no lookup, windows past gamma) were options of sd until commit 925836f, where this script ran them
too (docs/experiments/draft.md#a-lookahead-tree-context-lookup-and-overshoot---streams-2).

Prints, and writes to docs/sweeps/sd_lookahead_N_prompts.csv (N: 12 with the default
``--per-category 2``), each run's tau, speed against vanilla (``bench.summarise``), draft tokens
per draft forward, mean window length, milliseconds per step of drafting and of verification
(``bench.step_ms``), and checks every run against vanilla token for token.
"""
from mirror_sd import load_pair
from mirror_sd.tools.bench import run_interleaved
from research.comparison import (SWEEPS, add_ms_per_step, bench_prompts, comparison_parser, save_checked,
                                 summarise_runs)

RUNS = {  # label -> sd options (gamma 5 for all)
    "streams 0 (token by token)": dict(streams=0),
    "streams 1 (one forward, unchecked)": dict(streams=1),
    "streams 2 (lookahead tree 4 nodes + lookup 8)": dict(streams=2),
}
COLUMNS = ["method", "new_tokens", "mean_accepted", "tokens_per_s", "speedup", "equal_to_vanilla",
           "draft_tokens_per_forward", "window", "draft_ms_per_step", "verify_ms_per_step", "wall_s"]


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--runs", help=f"comma-separated numbers of the sd runs to make, from 0 to {len(RUNS) - 1} in "
                                       "this order: " + "; ".join(RUNS) + " (default: all)")
    args = parser.parse_args()
    numbers = args.runs.split(",") if args.runs else [str(i) for i in range(len(RUNS))]
    if not all(n.strip().isdigit() and int(n) < len(RUNS) for n in numbers):
        parser.error(f"--runs takes numbers from 0 to {len(RUNS) - 1}, got {args.runs!r}")
    chosen = [list(RUNS)[int(n)] for n in numbers]
    pair = load_pair()
    runs = [("vanilla", {})] + [("sd", dict(gamma=5, **RUNS[label])) for label in chosen]
    labels = ["vanilla", *chosen]
    prompts = bench_prompts(args.per_category)
    table = run_interleaved(pair, prompts, runs, args.max_new_tokens, desc="sd lookahead")
    summary, per_step = summarise_runs(table, labels)
    steps = table.groupby("method")["steps"].sum()
    summary["window"] = summary.method.map(table.groupby("method")["draft_tokens"].sum() / steps)
    add_ms_per_step(summary, per_step, ["draft", "verify"])
    save_checked(summary[COLUMNS], SWEEPS / f"sd_lookahead_{len(prompts)}_prompts.csv",
                 "sd must stay lossless with every form of drafting")


if __name__ == "__main__":
    main()
