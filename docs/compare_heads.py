"""Compare EAGLE heads on the bench prompts, interleaved: per prompt, vanilla, then eagle with each head.

    python docs/compare_heads.py HEAD_DIR [HEAD_DIR ...] [--per-category 2] [--max-new-tokens 64]

A head folder is what ``python -m mirror_sd.train eagle`` writes (the shipped one:
mirror_sd/assets/eagle-smollm2-135m). Prints, per head, tau, tokens/s and the speedup over vanilla
on the same prompts in the same run (``bench.summarise``), and checks every run against vanilla.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from mirror_sd import load_pair
from mirror_sd.bench import DEFAULT_PROMPTS, first_per_category, read_prompts, run_prompt, summarise
from mirror_sd.methods.eagle import attach_head
from mirror_sd.models.eagle import load_head


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+", help="EAGLE head folders")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="compare-heads.csv", help="per-prompt results (CSV)")
    args = parser.parse_args()
    pair = load_pair()
    heads = {str(folder): load_head(Path(folder), pair.target) for folder in args.heads}
    prompts = first_per_category(read_prompts(DEFAULT_PROMPTS), args.per_category)
    rows = []
    for item in tqdm(prompts, desc="compare heads", unit="prompt"):
        vanilla = run_prompt(pair, item, "vanilla", args.max_new_tokens)
        rows.append(dict(vanilla, equal_to_vanilla=True))
        for name, head in heads.items():
            attach_head(pair, head)
            row = run_prompt(pair, item, "eagle", args.max_new_tokens)
            rows.append(dict(row, method=f"eagle {name}", equal_to_vanilla=row["token_ids"] == vanilla["token_ids"]))
    results = pd.DataFrame(rows).drop(columns="token_ids")
    results.to_csv(args.out, index=False)
    print(summarise(results).to_markdown(index=False, floatfmt=".3f"))


if __name__ == "__main__":
    main()
