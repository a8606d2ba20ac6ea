"""Compare EAGLE heads on the bench prompts, interleaved: per prompt, vanilla, then eagle with each head.

    python -m research.compare_heads HEAD_DIR [HEAD_DIR ...] [--per-category 2] [--max-new-tokens 64]
                                    [--data ~/.cache/mirror-sd/distill [~/.cache/mirror-sd/instruct]]
                                    [--rows 16384 49152] [--lookup 8]

A head folder is what ``python -m mirror_sd.train eagle`` writes (the shipped one:
mirror_sd/assets/eagle-smollm2-135m). Prints, per head:
- tau, tokens/s and the speedup over vanilla on the same prompts in the same run
  (``bench.summarise``), every run checked against vanilla; eagle runs with ``--lookup`` tokens
  copied from the context (default 0: the head alone, which is what the comparison is about);
- its top-1 agreement with the target by draft depth on the vanilla answers to those prompts (first
  turn; answer positions only), and how many of those answer tokens lie outside its rows; the same
  per bench category; and the target's own mean top-1 probability on those answers (how predictable
  they are);
- with --data, the same on the held-out split the trainer uses (every position / answers only);
- with --rows N, the same again for each head with N LM-head rows (the head's own rows first).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from mirror_sd import generate, load_pair
from mirror_sd.devices import single_threaded
from mirror_sd.models.eagle import EagleHead, attach_head, load_head
from mirror_sd.models.loading import embedded_model_dir
from mirror_sd.tools.bench import run_prompt, summarise
from mirror_sd.train.draft import IGNORE, read_examples
from mirror_sd.train.eagle import evaluate, example_sequences, rows_of, split_order
from mirror_sd.train.features import causal_features, features_dir
from research.comparison import bench_prompts, comparison_parser

DEPTHS = 3


def answer_sequences(pair, prompts: list[dict], max_new_tokens: int) -> list[dict]:
    """The target's features over each prompt's first turn + its vanilla answer (``answer_start`` set)."""
    seqs = []
    for item in prompts:
        messages = [{"role": "user", "content": item["turns"][0]}]
        prompt_ids = pair.encode(messages)
        answer = generate(pair, messages, method="vanilla", max_new_tokens=max_new_tokens).token_ids
        feats, argmax, _ = causal_features(pair.target, torch.tensor([prompt_ids + answer]))
        seqs.append(dict(ids=torch.tensor(prompt_ids + answer), argmax=argmax[0], feats=feats[0].half(),
                         answer_start=len(prompt_ids), category=item["category"]))
    return seqs


def with_rows(head, target, count: int):
    """The same head with ``count`` LM-head rows: its own, then the lowest other target ids."""
    own = torch.zeros(target.args.vocab_size, dtype=torch.bool)
    own[head.vocab_map] = True
    vocab_map = torch.cat([head.vocab_map, (~own).nonzero()[:, 0]])[:count].sort().values
    wider = EagleHead.from_target(target, vocab_map, head.early_layers)  # borrows the target's rows, as load_head does
    wider.load_state_dict({**head.state_dict(), "vocab_map": vocab_map})
    return wider.eval().requires_grad_(False)


def with_early(target, head, seqs: list[dict]) -> list[dict]:
    """The sequences with the early features this head reads (``models/eagle.py``), if it reads any."""
    if not head.early_layers:
        return seqs
    return [dict(s, early=causal_features(target, s["ids"][None], head.early_layers)[2][0].half()) for s in seqs]


def agreement(head, seqs: list[dict]) -> dict:
    """``train.eagle.evaluate`` for this head, plus the answer tokens its rows cannot propose
    (``seqs`` hold the early features the head reads: :func:`with_early`)."""
    row_of = rows_of(head.vocab_map, head.args.vocab_size)
    with torch.no_grad():
        result = evaluate(head, seqs, row_of, 2048, ce_weight=0.5, depths=DEPTHS)
    answers = torch.cat([s["argmax"][s["answer_start"]:] for s in seqs])  # the labels of answer positions
    return dict(result, outside_rows=int((row_of[answers] == IGNORE).sum()), answers=len(answers))


def target_confidence(pair, seqs: list[dict]) -> float:
    """The target's mean top-1 probability where it predicts an answer token: how predictable the answers are."""
    with torch.no_grad():
        tops = [torch.softmax(pair.target.lm_head(s["feats"][max(s["answer_start"] - 1, 0):-1].to(pair.target.dtype)).float(), -1)
                .amax(-1) for s in seqs]
    return torch.cat(tops).mean().item()


def by_depth(result: dict, prefix: str) -> str:
    return " / ".join(f"{t:.3f}" for t in result[f"{prefix}top1_by_depth"])


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("heads", nargs="+", help="EAGLE head folders")
    parser.add_argument("--data", default=None, nargs="+",
                        help="distilled data folder(s), as given to the trainer: also score its held-out split")
    parser.add_argument("--rows", type=int, nargs="*", default=[],
                        help="also run each head with this many LM-head rows (its own rows, then the lowest "
                             "other target ids; the target's vocabulary size: all rows)")
    parser.add_argument("--out", default="compare-heads.csv", help="per-prompt results (CSV)")
    parser.add_argument("--lookup", type=int, default=0, help="tokens copied from the context into each tree (0: the head alone)")
    args = parser.parse_args()
    torch.manual_seed(0)
    pair = load_pair()
    with single_threaded():  # no OpenMP pool in this thread before the timed runs (mirror_sd/devices.py)
        heads = {str(folder): load_head(Path(folder), pair.target) for folder in args.heads}
        heads.update({f"{name} ({count} rows)": with_rows(head, pair.target, count)
                      for name, head in list(heads.items()) for count in args.rows})
    prompts = bench_prompts(args.per_category)
    rows = []
    for item in tqdm(prompts, desc="compare heads", unit="prompt"):
        vanilla = run_prompt(pair, item, "vanilla", args.max_new_tokens)
        rows.append(dict(vanilla, equal_to_vanilla=True))
        for name, head in heads.items():
            attach_head(pair, head)
            row = run_prompt(pair, item, "eagle", args.max_new_tokens, lookup=args.lookup)
            rows.append(dict(row, method=f"eagle {name}", equal_to_vanilla=row["token_ids"] == vanilla["token_ids"]))
    results = pd.DataFrame(rows).drop(columns="token_ids")
    results.to_csv(args.out, index=False)
    print(summarise(results).to_markdown(index=False, floatfmt=".3f"))

    bench_answers = answer_sequences(pair, prompts, args.max_new_tokens)
    held_out = None
    if args.data:  # the trainer's held-out split (train/eagle.py: seed 0, 3%)
        examples = read_examples([Path(d).expanduser() for d in args.data])
        seqs = example_sequences(pair.target, examples, features_dir(None, embedded_model_dir()), 512, 2048)
        order, n_eval = split_order(len(seqs), 0.03, 0)
        held_out = [seqs[i] for i in order[:n_eval]]
    print(f"\nthe target's mean top-1 probability on the answers: bench {target_confidence(pair, bench_answers):.3f}"
          + (f", held-out {target_confidence(pair, held_out):.3f}" if held_out is not None else ""))
    print("top-1 agreement with the target by draft depth (1 / 2 / 3):")
    categories = sorted({s["category"] for s in bench_answers})
    for name, head in heads.items():
        answers = with_early(pair.target, head, bench_answers)  # once per head, for every score below
        bench = agreement(head, answers)
        line = (f"{name}: bench answers {by_depth(bench, 'answer_')} ({bench['answer_tokens']} tokens, "
                f"{bench['outside_rows']} of {bench['answers']} outside the head's rows)")
        if held_out is not None:
            held = agreement(head, with_early(pair.target, head, held_out))
            line += f"; held-out all {by_depth(held, '')}, answers {by_depth(held, 'answer_')}"
        print(line)
        per_category = {c: agreement(head, [s for s in answers if s["category"] == c]) for c in categories}
        print("  bench answers by category: " + "; ".join(
            f"{c} {by_depth(r, 'answer_')} ({r['answer_tokens']} tokens)" for c, r in per_category.items()))


if __name__ == "__main__":
    main()
