"""How often Mirror-SD could hit: the early exit's top-kappa against the target's token, per exit layer.

    python -m research.exit_ceiling [--per-category 8] [--max-new-tokens 64] [--layers 15,18,22,24,26,28]
                                   [--exit-head 1 [--head DIR]]

A Mirror-SD step hits when the token the target emits after the accepted prefix (the correction, or
the bonus after a fully accepted window) is among the early-exit candidates at that position and
its branch was rolled out. This runs `mirror` at its defaults on the bench prompts, then, for every
decoding step, asks whether that token is in the early exit's top-kappa at its position, for each
exit layer and kappa in 1..16: the hit rate an unlimited branch budget would get (the ceiling),
beside the hit rate the default budget got. The hidden state at that position sees committed
tokens only, so one causal pass of the target over the final sequence gives it for every layer.

With ``--exit-head 1`` mirror runs with its trained early-exit head and the ranks are the head's, at
its exit layer only (models/exit_head.py); compare with a run without it (``--exit-head 0``: the
logit lens, the pair left without a head at that layer, ``pair.exit_heads``).

Columns ``kappa_4_draft_j``: the ceiling when a rejection row's candidates also hold the draft's own
top-j there (its top-1 was the rejected token; the bonus row has no draft distribution yet): would
the draft's alternatives be better branch roots than more of the exit's?

Writes docs/sweeps/exit_ceiling.csv (exit_ceiling_head.csv with ``--exit-head 1``; ``--out`` names
another file; one row per category and exit layer, plus "all") and prints it as markdown.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from mirror_sd.engine import generate
from mirror_sd.methods.mirror import default_exit_layer, early_exit
from mirror_sd.models.exit_head import attach_exit_head, available_exit_head, load_exit_head
from mirror_sd.models.pair import load_pair
from mirror_sd.sampling import to_target_vocab

from .comparison import SWEEPS, bench_prompts, comparison_parser

KAPPAS = (1, 2, 4, 8, 16)
DRAFT_TOPS = (2, 3)  # the draft's top-j at a rejection row, beside the exit's top 4


def step_positions(prompt_len: int, steps) -> list[tuple[int, int, bool, bool]]:
    """(position p, the target's token after p, hit, rejected) for every decoding step whose last
    token is the verdict's: p is the last accepted position, where the early exit proposed
    candidates; rejected: the token is a correction (the draft's token there was rejected)."""
    rows, n = [], prompt_len + len(steps[0].committed)
    for step in steps[1:]:
        if step.origins and step.origins[-1] in ("correction", "bonus"):
            rows.append((n - 1 + step.accepted, step.committed[-1], step.rendezvous.hit,
                         step.origins[-1] == "correction"))
        n += len(step.committed)
    return rows


@torch.inference_mode()
def draft_ranks(pair, sequence: list[int], positions: list[int], tokens: list[int]) -> torch.Tensor:
    """The rank [len(positions)] of each token under the draft's logits at its position (on the
    target's vocabulary), over one causal pass of ``sequence``: the draft's distribution where it
    drafted the window's token there, given the committed tokens before it."""
    draft = pair.draft
    h = draft.forward_layers(draft.embed(torch.tensor([sequence], device=draft.device)), None,
                             draft.window(None, len(sequence)), 0, None)
    logits = to_target_vocab(draft.head(h[0, positions]), draft.vocab_map, pair.target.args.vocab_size)  # [P, V]
    return (logits > logits.gather(-1, torch.tensor(tokens, device=logits.device)[:, None])).sum(-1).cpu()


@torch.inference_mode()
def exit_ranks(pair, sequence: list[int], positions: list[int], tokens: list[int], layers: list[int],
               head=None) -> dict:
    """{layer: rank [len(positions)]} of each token among the early exit's log-probs at its position
    (0: the exit's top-1), after ``layer`` target layers, over one causal pass of ``sequence``;
    through the trained exit ``head`` first at its own layer when one is given."""
    target = pair.target
    ids = torch.tensor([sequence], device=target.device)
    win = target.window(None, len(sequence))
    h, done, ranks = target.embed(ids), 0, {}
    at, want = torch.tensor(positions), torch.tensor(tokens)
    for layer in sorted(layers):
        h = target.forward_layers(h, None, win, done, layer)
        done = layer
        exit_h = h[:, at] if head is None or layer != head.exit_layer else head(h[:, at])
        logp = early_exit(pair, exit_h)  # [P, V]
        ranks[layer] = (logp > logp.gather(-1, want[:, None])).sum(-1)
    return ranks


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--layers", default=None, help="exit layers to test (comma-separated; default "
                        "15,18,22,24,26,28, with --exit-head 1 the head's layer)")
    parser.add_argument("--exit-head", type=int, choices=(0, 1), default=0,
                        help="1: mirror and the ranks use the trained early-exit head (default 0: the logit lens)")
    parser.add_argument("--head", default=None, metavar="DIR", help="with --exit-head 1: a head trained by "
                        "python -m mirror_sd.train exit-head (default: the shipped one); mirror exits at its layer")
    parser.add_argument("--out", default=None, help="the CSV to write (default docs/sweeps/exit_ceiling.csv, "
                        "exit_ceiling_head.csv with --exit-head 1)")
    args = parser.parse_args()
    pair = load_pair()
    attached = load_exit_head(Path(args.head), pair.target) if args.head else None
    if attached is not None:
        attach_exit_head(pair, attached)
    head = (attached or available_exit_head(pair, default_exit_layer(pair.target.num_layers))) if args.exit_head else None
    if args.exit_head and head is None:
        parser.error("--exit-head 1: the pair has no head for its default exit layer (pass --head DIR)")
    default = head.exit_layer if head else default_exit_layer(pair.target.num_layers)
    layers = [int(x) for x in (args.layers or (str(head.exit_layer) if head else "15,18,22,24,26,28")).split(",")]
    if head is not None and layers != [head.exit_layer]:
        parser.error(f"--exit-head 1 ranks at the head's exit layer only ({head.exit_layer})")
    if head is None:  # mirror reads the exit through the logit lens: no head at its exit layer
        pair.exit_heads[default] = None
    rows = []
    for item in tqdm(bench_prompts(args.per_category), desc="exit ceiling", unit="prompt"):
        messages = []
        for turn in item["turns"]:
            messages.append({"role": "user", "content": turn})
            out = generate(pair, list(messages), method="mirror", max_new_tokens=args.max_new_tokens,
                           exit_layer=default)
            messages.append({"role": "assistant", "content": out.text})
            prompt_ids = pair.encode(messages[:-1])
            assert len(prompt_ids) == out.prompt_tokens
            sequence, prompt_len = prompt_ids + out.token_ids, len(prompt_ids)
            steps = step_positions(prompt_len, out.trace.steps)
            if not steps:
                continue
            positions, tokens, hits, rejected = zip(*steps)
            ranks = exit_ranks(pair, sequence, list(positions), list(tokens), layers, head)
            drafts = draft_ranks(pair, sequence, list(positions), list(tokens))
            for i, hit in enumerate(hits):
                rows.append(dict(category=item["category"], hit=hit, rejected=rejected[i], draft_rank=int(drafts[i]),
                                 **{f"rank_{layer}": int(ranks[layer][i]) for layer in layers}))
    steps = pd.DataFrame(rows)
    table = []
    for category, group in [("all", steps), *steps.groupby("category")]:
        for layer in layers:
            ranks = group[f"rank_{layer}"]
            table.append(dict(category=category, exit_layer=layer, exit_head=args.exit_head, steps=len(group),
                              hit_rate=group.hit.mean(),
                              **{f"kappa_{k}": (ranks < k).mean() for k in KAPPAS},
                              **{f"kappa_4_draft_{j}": ((ranks < 4) | (group.rejected & (group.draft_rank < j))).mean()
                                 for j in DRAFT_TOPS}))
    table = pd.DataFrame(table).round(3)
    table.to_csv(args.out or SWEEPS / ("exit_ceiling_head.csv" if head else "exit_ceiling.csv"), index=False)
    exit = "its trained early-exit head" if head else "the logit lens"
    print(f"mirror at its defaults (exit layer {default}) with {exit}; hit_rate: the default budget's, "
          f"kappa_k: the ceiling")
    print(table.to_markdown(index=False))


if __name__ == "__main__":
    main()
