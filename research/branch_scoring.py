"""Which branches Mirror-SD should roll out when the budget cannot cover every early-exit candidate.

    python -m research.branch_scoring [--per-category 2] [--max-new-tokens 64] [--budgets 2,4,6,8,16]

A branch (r, v) is worth rolling out when the step is likely to end there: the target accepts the
window's first r draft tokens, then emits v. ``mirror_sd/branches.py``'s scoring ``step-end`` scores exactly
that under the early exit, log P(d1..dr accepted) + log P(v at r), and the best ``budget`` are kept.
This compares it, at several budgets, with two simpler rules:

  candidate   the candidate's own early-exit log-prob log P(v at r), whatever the chance of reaching r
  earliest    the branch points nearest the window's start first, then by the candidate's log-prob

Each rule is a branch scoring (``branches.SCORINGS``), chosen before each run with ``branches.use_scoring``:
the setting both the host's branch choice and the rollout stage (its spec) read. Each (rule, budget) is
one mirror run at its other defaults over the same prompts, interleaved with
vanilla (every run must commit vanilla's tokens). At T = 0 the windows do not depend on which
branches were rolled out, only on hits and misses, so the hit rate is what differs. Writes
docs/sweeps/branch_scoring.csv and prints the hit rate per rule and budget, overall and per category.
"""
from __future__ import annotations

import pandas as pd
import torch

from mirror_sd import branches
from mirror_sd.models.pair import load_pair
from mirror_sd.tools.bench import run_interleaved

from .comparison import SWEEPS, bench_prompts, comparison_parser

EARLIER_ROW = 1e6  # "earliest": a row earlier outranks any log-prob gap within the window


def by_candidate(prefix: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """Branches by the candidate's own early-exit log-prob, not weighted by reaching its position."""
    return top_logp


def by_earliest(prefix: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """Branch points nearest the window's start first, then by the candidate's early-exit log-prob."""
    rows = torch.arange(top_logp.shape[0], device=top_logp.device)
    return top_logp - EARLIER_ROW * rows[:, None]


RULES = {"step-end": branches.step_end, "candidate": by_candidate, "earliest": by_earliest}


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--budgets", default="2,4,6,8,16", help="branch budgets (comma-separated)")
    parser.add_argument("--out", default=str(SWEEPS / "branch_scoring.csv"), help="the CSV to write")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    configs = [(rule, budget) for budget in budgets for rule in RULES]
    runs = [("vanilla", {})] + [("mirror", dict(branch_budget=budget)) for _, budget in configs]

    branches.SCORINGS.update(RULES)  # the setting both paths read: the host's choice and the rollout stage's spec

    def setup(index):
        branches.use_scoring("step-end" if index == 0 else configs[index - 1][0])

    pair = load_pair()
    try:
        rows = run_interleaved(pair, bench_prompts(args.per_category), runs, args.max_new_tokens, setup=setup,
                               desc="branch scoring")
    finally:
        branches.use_scoring("step-end")
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
