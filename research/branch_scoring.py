"""Which branches Mirror-SD should roll out when the budget cannot cover every early-exit candidate.

    python -m research.branch_scoring [--per-category 2] [--max-new-tokens 64] [--budgets 2,4,6,8,16]

A branch (r, v) is worth rolling out when the step is likely to end there: the target accepts the
window's first r draft tokens, then emits v. ``mirror_sd/branches.py: choose_branches`` scores exactly
that under the early exit, log P(d1..dr accepted) + log P(v at r), and keeps the best ``budget``.
This compares it, at several budgets, with two simpler rules:

  candidate   the candidate's own early-exit log-prob log P(v at r), whatever the chance of reaching r
  earliest    the branch points nearest the window's start first, then by the candidate's log-prob

Each (rule, budget) is one mirror run at its other defaults over the same prompts, interleaved with
vanilla (every run must commit vanilla's tokens). At T = 0 the windows do not depend on which
branches were rolled out, only on hits and misses, so the hit rate is what differs. Writes
docs/sweeps/branch_scoring.csv and prints the hit rate per rule and budget, overall and per category.
"""
from __future__ import annotations

import pandas as pd
import torch

from mirror_sd.branches import choose_branches
from mirror_sd.methods import mirror_rollouts
from mirror_sd.models.pair import load_pair

from .comparison import SWEEPS, bench_prompts, comparison_parser, interleave

STEP_END = choose_branches


def by_candidate(draft, top_ids, top_logp, window_logp, budget, parents=None):
    """Branches by the candidate's own early-exit log-prob, not weighted by reaching its position:
    the rule with every window token's log-prob taken as 0 (the rule's rows: valid ones first)."""
    r, roots, scores, valid = STEP_END(draft, top_ids, top_logp, window_logp * 0, 10 ** 6, parents)
    return r[:budget], roots[:budget], scores[:budget], valid[:budget]


def by_earliest(draft, top_ids, top_logp, window_logp, budget, parents=None):
    """Branch points nearest the window's start first, then by the candidate's early-exit log-prob."""
    r, roots, scores, valid = by_candidate(draft, top_ids, top_logp, window_logp, 10 ** 6, parents)
    order = torch.sort(r, stable=True).indices  # by row; within a row, by log-prob (already)
    order = order[torch.sort((~valid[order]).byte(), stable=True).indices][:budget]  # skipped ones last
    return r[order], roots[order], scores[order], valid[order]


RULES = {"step-end": STEP_END, "candidate": by_candidate, "earliest": by_earliest}


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--budgets", default="2,4,6,8,16", help="branch budgets (comma-separated)")
    parser.add_argument("--out", default=str(SWEEPS / "branch_scoring.csv"), help="the CSV to write")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    configs = [(rule, budget) for budget in budgets for rule in RULES]
    runs = [("vanilla", {})] + [("mirror", dict(branch_budget=budget)) for _, budget in configs]

    def setup(index):
        mirror_rollouts.choose_branches = STEP_END if index == 0 else RULES[configs[index - 1][0]]

    pair = load_pair()
    try:
        rows = interleave(pair, bench_prompts(args.per_category), runs, args.max_new_tokens, setup, desc="branch scoring")
    finally:
        mirror_rollouts.choose_branches = STEP_END
    rows = rows[rows.run > 0].copy()
    rows["rule"] = [configs[i - 1][0] for i in rows.run]
    rows["budget"] = [configs[i - 1][1] for i in rows.run]
    table = []
    for category, group in [("all", rows), *rows.groupby("category")]:
        for (rule, budget), g in group.groupby(["rule", "budget"], sort=False):
            table.append(dict(category=category, rule=rule, budget=budget, hit_rate=(g.hit_rate * g.steps).sum() / g.steps.sum(),
                              tau=(g.mean_accepted * g.steps).sum() / g.steps.sum(), equal=g.equal_to_vanilla.all()))
    table = pd.DataFrame(table).round(3)
    table.to_csv(args.out, index=False)
    print(table[table.category == "all"].pivot(index="budget", columns="rule", values="hit_rate").to_markdown())
    print(table.to_markdown(index=False))


if __name__ == "__main__":
    main()
