"""Mirror-SD's early exit over the draft's vocabulary rows against the target's full LM head.

    python -m research.early_exit_rows [--per-category 2] [--max-new-tokens 64]

Interleaved on the bench prompts: per prompt, vanilla, then mirror with the early exit as shipped
(``methods/mirror.py: exit_reader``, only the LM-head rows of the draft's tokens), then with the
target's full LM head (the order of the two alternates by prompt). Prints each one's speed against
vanilla and mirror's hit rate, and checks every run against vanilla token for token.
"""
from mirror_sd import load_pair
from mirror_sd.methods import mirror
from mirror_sd.tools.bench import run_prompt
from research.comparison import bench_prompts, comparison_parser

SHIPPED = mirror.exit_reader


def full_head(pair, head=None, draft_rows=True):
    """The token channel's reader over the target's whole LM head."""
    return SHIPPED(pair, head, draft_rows=False)


def main():
    parser = comparison_parser(__doc__)
    args = parser.parse_args()
    pair = load_pair()
    prompts = bench_prompts(args.per_category)
    runs = {"vanilla": None, "draft rows": SHIPPED, "full head": full_head}
    totals = {name: dict(tokens=0, wall=0.0, hits=[]) for name in runs}
    run_prompt(pair, prompts[0], "mirror", 8)  # warm up
    for i, item in enumerate(prompts):
        names = ["vanilla", "draft rows", "full head"] if i % 2 == 0 else ["vanilla", "full head", "draft rows"]
        reference = None
        for name in names:
            if runs[name] is not None:
                mirror.exit_reader = runs[name]
            row = run_prompt(pair, item, "vanilla" if name == "vanilla" else "mirror", args.max_new_tokens)
            reference = reference or row["token_ids"]
            assert row["token_ids"] == reference, f"{name} differs from vanilla on {item['id']}"
            totals[name]["tokens"] += row["new_tokens"]
            totals[name]["wall"] += row["wall_s"]
            if row["hit_rate"] is not None:
                totals[name]["hits"].append(row["hit_rate"])
    mirror.exit_reader = SHIPPED
    base = totals["vanilla"]["tokens"] / totals["vanilla"]["wall"]
    for name, t in totals.items():
        rate = t["tokens"] / t["wall"]
        hits = f", hit rate {sum(t['hits']) / len(t['hits']):.3f}" if t["hits"] else ""
        print(f"{name:11s} {rate:6.2f} tokens/s, {rate / base:.3f}x vanilla{hits}")


if __name__ == "__main__":
    main()
