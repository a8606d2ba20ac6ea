"""How often drafts agree with the target on its own answers to the bench prompts, by category.

    python docs/draft_agreement.py DRAFT [DRAFT ...] [--per-category 2] [--max-new-tokens 64]
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
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402
import torch  # noqa: E402

from comparison import bench_prompts, comparison_parser  # noqa: E402
from mirror_sd import generate, load_pair  # noqa: E402
from mirror_sd.engine import to_target_vocab  # noqa: E402
from mirror_sd.train.draft import answer_labels, evaluate, read_examples  # noqa: E402


MAX_LEN = 512  # tokens of context per data example, the end kept: train draft's default (--max-len)
EVAL_BATCH_TOKENS = 8192  # tokens per evaluation batch (only the speed depends on it)


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
    args = parser.parse_args()
    pair = load_pair()
    shipped = pair.draft_name
    answers = answers_to_bench_prompts(pair, bench_prompts(args.per_category), args.max_new_tokens)
    examples = read_examples([args.data])[:300] if args.data else []
    rows = []
    for draft in args.drafts:
        pair.use_draft(shipped if draft == "default" else draft)
        per_turn = [(category, agreements(pair, ids, start)) for category, ids, start in answers]
        row = dict(draft=draft)
        for category in dict.fromkeys(c for c, _ in per_turn):
            flags = [a for c, agree in per_turn if c == category for a in agree]
            row[category] = sum(flags) / len(flags)
        flags = [a for _, agree in per_turn for a in agree]
        row["bench_top1"] = sum(flags) / len(flags)
        row["implied_tau"] = len(flags) / sum(steps_at(agree, args.gamma) for _, agree in per_turn)
        if examples:
            with torch.inference_mode():
                labelled = answer_labels(examples, pair.draft.vocab_map, MAX_LEN)
                row[f"top1_{args.data.name}"] = evaluate(pair.draft, labelled, EVAL_BATCH_TOKENS)["top1"]
        rows.append(row)
    table = pd.DataFrame(rows)
    print(table.round(3).to_string(index=False))
    if args.csv:
        table.to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
