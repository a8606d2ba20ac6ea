"""Context lookup matching the last 3, else 2, else 1 tokens (as shipped) against 3, else 2.

    python -m research.lookup_ngrams [--per-category 2] [--max-new-tokens 64]

Interleaved on the bench prompts: per prompt, vanilla, then eagle, ss, mirror and sd, each of the
first three with both n-gram lists (``drafting/lookup.py: NGRAM_SIZES``). Prints tau, tokens/s, the
speedup over vanilla and mirror's hit rate (``bench.summarise``); every run is checked against
vanilla token for token.
"""
from mirror_sd import load_pair
from mirror_sd.drafting import lookup
from mirror_sd.tools.bench import run_interleaved, summarise
from research.comparison import bench_prompts, comparison_parser

SHIPPED = lookup.NGRAM_SIZES
WITHOUT_ONE = (3, 2)
RUNS = [("vanilla", SHIPPED), ("eagle", WITHOUT_ONE), ("eagle", SHIPPED), ("ss", WITHOUT_ONE), ("ss", SHIPPED),
        ("mirror", WITHOUT_ONE), ("mirror", SHIPPED), ("sd", SHIPPED)]


def main():
    parser = comparison_parser(__doc__)
    args = parser.parse_args()
    pair = load_pair()
    prompts = bench_prompts(args.per_category)

    def use_ngrams(index: int):
        lookup.NGRAM_SIZES = RUNS[index][1]

    try:
        table = run_interleaved(pair, prompts, [(method, {}) for method, _ in RUNS], args.max_new_tokens,
                                setup=use_ngrams, desc="lookup n-grams")
    finally:
        lookup.NGRAM_SIZES = SHIPPED
    table["method"] = ["vanilla" if r == 0 else f"{RUNS[r][0]} {RUNS[r][1]}" for r in table["run"]]
    summary = summarise(table).set_index("method")
    print(summary[["mean_accepted", "tokens_per_s", "speedup", "equal_to_vanilla", "hit_rate"]].round(3).to_markdown())


if __name__ == "__main__":
    main()
