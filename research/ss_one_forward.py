"""Speculative Streaming in one target forward per step against a streams pass of its own, in one
interleaved run.

    python -m research.ss_one_forward [--per-category 2] [--max-new-tokens 64]

On the bench prompts, prompt by prompt (``bench.run_interleaved``, warmed up first): vanilla, then
``ss`` in both forms (methods/ss.py), each at its default tree and at a wider, one-level tree:

* ``one_forward=0``: the shipped streams that see the step's correction (ss-smollm2-135m), in a
  pass of their own after the verify forward;
* ``one_forward=1``: the streams trained without that input (ss-paper-smollm2-135m), riding in
  the verify forward: (tree nodes + 1) x gamma stream rows through the top 8 layers.

Prints, and writes to docs/sweeps/ss_one_forward_N_prompts.csv (N: 12 with the default
``--per-category 2``, 24 with 4), each run's tau, speed against vanilla
(``bench.summarise``) and milliseconds per step of drafting and of verification (``bench.step_ms``),
and checks every run against vanilla token for token.
"""
from mirror_sd import load_pair
from mirror_sd.tools.bench import run_interleaved
from research.comparison import (SWEEPS, add_ms_per_step, bench_prompts, comparison_parser, save_checked,
                                 summarise_runs)

WIDE = dict(gamma=1, top_k=8, total_tokens=8)  # the 8 best tokens of stream 1 under the root
RUNS = {  # label -> ss options
    "ss, streams pass (default tree)": dict(one_forward=0),
    "ss, streams pass, gamma 1 top-k 8": dict(one_forward=0, **WIDE),
    "ss, one forward (default tree)": dict(one_forward=1),
    "ss, one forward, gamma 2": dict(one_forward=1, gamma=2),
    "ss, one forward, gamma 2 top-k 4 nodes 6": dict(one_forward=1, gamma=2, top_k=4, total_tokens=6),
    "ss, one forward, gamma 1 top-k 3": dict(one_forward=1, gamma=1, top_k=3, total_tokens=3),
    "ss, one forward, gamma 1 top-k 4": dict(one_forward=1, gamma=1, top_k=4, total_tokens=4),
    "ss, one forward, gamma 1 top-k 6": dict(one_forward=1, gamma=1, top_k=6, total_tokens=6),
    "ss, one forward, gamma 1 top-k 8": dict(one_forward=1, **WIDE),
}
COLUMNS = ["method", "new_tokens", "mean_accepted", "tokens_per_s", "speedup", "equal_to_vanilla", "wall_s",
           "draft_ms_per_step", "verify_ms_per_step"]


def main():
    args = comparison_parser(__doc__).parse_args()
    pair = load_pair()
    runs = [("vanilla", {})] + [("ss", options) for options in RUNS.values()]
    labels = ["vanilla", *RUNS]
    prompts = bench_prompts(args.per_category)
    table = run_interleaved(pair, prompts, runs, args.max_new_tokens, desc="ss forms")
    summary, per_step = summarise_runs(table, labels)
    add_ms_per_step(summary, per_step, ["draft", "verify"])
    save_checked(summary[COLUMNS], SWEEPS / f"ss_one_forward_{len(prompts)}_prompts.csv",
                 "ss must stay lossless in both forms")


if __name__ == "__main__":
    main()
