"""Compare the target's speculative streams on the bench prompts, interleaved: per prompt, vanilla, then
``ss`` with each streams folder.

    python -m research.compare_streams STREAMS_DIR [STREAMS_DIR ...] [--per-category 2] [--max-new-tokens 64]
                                      [--lookup 8]

A streams folder is what ``python -m mirror_sd.train ss`` writes (the shipped one:
mirror_sd/assets/ss-smollm2-135m). Prints tau, tokens/s and the speedup over vanilla on the same
prompts in the same run (``bench.summarise``), every run checked against vanilla, then tau per bench
category. ``ss`` runs with ``--lookup`` tokens copied from the context (default 8, the method's
default; 0: the streams alone).
"""
from __future__ import annotations

from mirror_sd import load_pair
from mirror_sd.models.streams import use_streams
from mirror_sd.tools.bench import run_interleaved, summarise
from research.comparison import bench_prompts, comparison_parser


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("streams", nargs="+", help="folders with streams.safetensors + streams.json")
    parser.add_argument("--lookup", type=int, default=8)
    args = parser.parse_args()
    pair = load_pair()
    prompts = bench_prompts(args.per_category)
    folders = [None] + args.streams  # run 0: vanilla

    def attach(index: int):
        if folders[index] is not None:
            use_streams(pair, folders[index])

    runs = [("vanilla", {})] + [("ss", dict(lookup=args.lookup))] * len(args.streams)
    table = run_interleaved(pair, prompts, runs, args.max_new_tokens, setup=attach, desc="compare streams")
    table["method"] = ["vanilla" if r == 0 else f"ss {folders[r]}" for r in table["run"]]
    summary = summarise(table).set_index("method")
    print(summary[["mean_accepted", "tokens_per_s", "speedup", "equal_to_vanilla"]].round(3).to_markdown())
    print()
    print(table.groupby(["method", "category"], sort=False).mean_accepted.mean().unstack().round(2).to_markdown())


if __name__ == "__main__":
    main()
