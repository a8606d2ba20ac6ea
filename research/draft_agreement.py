"""How often drafts agree with the target on its own answers to the bench prompts, by category.

    python -m research.draft_agreement DRAFT [DRAFT ...] [--per-category 2] [--max-new-tokens 64]
                                      [--gamma 5] [--data FOLDER] [--csv FILE]

The target answers each bench prompt greedily (vanilla, turn after turn as the bench does); each
draft (a folder, or "default": the shipped draft) then reads prompt + answer in one fp32 forward,
and its argmax at every answer position is compared with the target's next token (teacher-forced
top-1, the figure training reports on held-out data). For greedy ``sd`` that agreement decides
everything: a window is accepted up to the draft's first disagreement, so the run of agreements
from each step's position gives the τ that ``sd`` would reach at ``--gamma`` with fp32 drafting
(``implied_tau``; the bench drafts in int8 on the CPU, which changes some proposals).
``--data FOLDER`` adds the same top-1 on a distilled data set's answers (``train data``), up to
300 examples, to compare the bench prompts with training-like ones.

``--by-confidence FILE`` writes where the drafts miss: the answer tokens grouped by the target's own
top-1 probability there (the target reads the same prompt + answer), with each group's share of
the tokens, the draft's agreement, the share of tokens its head holds at all (``in_head``) and, of
its misses, the share a context copy would have got right (``copy_right_of_misses``: the token after
the latest earlier occurrence of the last 3, 2 or 1 tokens, the rule of ``drafting/lookup.py``).
"""
from pathlib import Path

import pandas as pd
import torch

from mirror_sd import generate, load_pair
from mirror_sd.engine import to_target_vocab
from mirror_sd.drafting.lookup import copy_from_context
from mirror_sd.train.draft import answer_labels, evaluate, read_examples
from research.comparison import bench_prompts, comparison_parser

MAX_LEN = 512  # tokens of context per data example, the end kept: train draft's default (--max-len)
EVAL_BATCH_TOKENS = 8192  # tokens per evaluation batch (only the speed depends on it)
CONFIDENCE_BINS = [0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0]  # the target's top-1 probability


def answers_to_bench_prompts(pair, prompts, max_new_tokens: int) -> list[tuple[str, list[int], int]]:
    """(category, prompt + answer ids, answer start) per turn of each prompt, answered by vanilla."""
    rows = []
    for item in prompts:
        messages = []
        for turn in item["turns"]:
            messages.append({"role": "user", "content": turn})
            out = generate(pair, list(messages), method="vanilla", max_new_tokens=max_new_tokens)
            prompt_ids = pair.encode(list(messages))
            rows.append((item["category"], prompt_ids + out.token_ids, len(prompt_ids)))
            messages.append({"role": "assistant", "content": out.text})
    return rows


@torch.inference_mode()
def agreements(pair, ids: list[int], start: int) -> list[bool]:
    """Whether the draft's argmax before each answer token after the first equals that token (the
    first comes from the target's prefill, never from the draft)."""
    logits = pair.draft(torch.tensor([ids]), None)[0]  # [T, V_draft]
    guesses = to_target_vocab(logits, pair.draft.vocab_map, pair.target.args.vocab_size).argmax(-1)  # [T]
    return [int(guesses[i - 1]) == ids[i] for i in range(start + 1, len(ids))]


@torch.inference_mode()
def target_confidence(pair, ids: list[int]) -> list[float]:
    """The target's top-1 probability at each position of ``ids`` (one fp32 forward)."""
    return pair.target(torch.tensor([ids]), None)[0].softmax(-1).amax(-1).tolist()


def token_table(pair, answers, confidence: list[list[float]]):
    """One row per answer token after the first: category, turn, whether the draft agreed, the
    target's top-1 probability before it, whether the draft's head holds it, whether a context copy
    gives it."""
    head = set(pair.draft.vocab_map.tolist()) if pair.draft.vocab_map is not None else None
    rows = []
    for turn, ((category, ids, start), conf) in enumerate(zip(answers, confidence)):
        for i, agree in zip(range(start + 1, len(ids)), agreements(pair, ids, start)):
            rows.append(dict(category=category, turn=turn, agree=agree, target_p=conf[i - 1],
                             in_head=head is None or ids[i] in head, copy_right=copy_from_context(ids[:i], 1) == [ids[i]]))
    return pd.DataFrame(rows)


def by_confidence(tokens) -> pd.DataFrame:
    """Share, agreement, head coverage and copyable misses per band of the target's confidence."""
    band = pd.cut(tokens.target_p, CONFIDENCE_BINS)
    misses = tokens[~tokens.agree]
    table = tokens.groupby(band, observed=True).agg(share=("agree", "size"), agreement=("agree", "mean"), in_head=("in_head", "mean"))
    table["share"] /= len(tokens)
    table["copy_right_of_misses"] = misses.groupby(band[misses.index], observed=True).copy_right.mean()
    return table.reset_index().rename(columns={"target_p": "target_top1_p"})


def steps_at(agree: list[bool], gamma: int) -> int:
    """Greedy sd's steps over one answer: each accepts the run of agreements (at most gamma) and commits one more."""
    at, steps = 0, 0
    while at < len(agree):
        run = 0
        while run < gamma and at + run < len(agree) and agree[at + run]:
            run += 1
        at, steps = at + run + 1, steps + 1
    return steps


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("drafts", nargs="+", help='draft folders ("default": the shipped draft)')
    parser.add_argument("--gamma", type=int, default=5, help="window for implied_tau (default 5)")
    parser.add_argument("--data", type=Path, help="a distilled data folder to compare with (train data --out)")
    parser.add_argument("--csv", type=Path, help="also write the table here")
    parser.add_argument("--by-confidence", type=Path, help="also write the table by the target's confidence here")
    args = parser.parse_args()
    pair = load_pair()
    shipped = pair.draft_name
    answers = answers_to_bench_prompts(pair, bench_prompts(args.per_category), args.max_new_tokens)
    confidence = [target_confidence(pair, ids) for _, ids, _ in answers]
    examples = read_examples([args.data])[:300] if args.data else []
    rows, bands = [], []
    for draft in args.drafts:
        pair.use_draft(shipped if draft == "default" else draft)
        tokens = token_table(pair, answers, confidence)
        row = dict(draft=draft, **tokens.groupby("category", sort=False).agree.mean())
        row["bench_top1"] = tokens.agree.mean()
        steps = sum(steps_at(turn.agree.tolist(), args.gamma) for _, turn in tokens.groupby("turn"))
        row["implied_tau"] = len(tokens) / steps
        if examples:
            with torch.inference_mode():
                labelled = answer_labels(examples, pair.draft.vocab_map, MAX_LEN)
                row[f"top1_{args.data.name}"] = evaluate(pair.draft, labelled, EVAL_BATCH_TOKENS)["top1"]
        rows.append(row)
        bands.append(by_confidence(tokens).assign(draft=draft))
    table = pd.DataFrame(rows)
    print(table.round(3).to_string(index=False))
    bands = pd.concat(bands)[["draft", "target_top1_p", "share", "agreement", "in_head", "copy_right_of_misses"]]
    print(bands.round(3).to_string(index=False))
    if args.csv:
        table.to_csv(args.csv, index=False)
    if args.by_confidence:
        bands.to_csv(args.by_confidence, index=False)


if __name__ == "__main__":
    main()
