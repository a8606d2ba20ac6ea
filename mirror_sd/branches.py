"""Mirror-SD's branch rule, written once as tensor code: which hypotheses the draft rolls out.

A branch (r, v) reads: the target accepts the window's path to row r and emits v there. Its score
is the early exit's log-prob of that outcome,

    score(r, v) = sum of log p_exit(node at its parent's row) along the path to row r + log p_exit(v at r),

summed in float64. A candidate v that is a child of row r (in a chain: d_{r+1}) is an acceptance,
not a branch point: it is skipped. The ``budget`` best hypotheses are rolled out, best first.

Every caller rolls out the same B = min(budget, T * kappa) rows: the step on either executor
(methods/mirror_rollouts.py) and the rollout stage's captured body (models/rollout.py). Where fewer
than B candidates are valid, the skipped ones fill the last rows, marked invalid (their rollouts are
never used). So each path
hands the draft forwards of one shape, and no processor's rounding can make two paths grow
different rollouts from the same channel.

Ties: scores that are exactly equal keep (row, candidate rank) order, the order of a stable sort;
this is the only tie-break of the branch choice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .devices import to_device
from .tree_rules import ancestors


def step_end(prefix: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """The shipped scoring: log P(the step ends at (r, v)) under the early exit, the path's log-prob
    prefix [R] plus the candidate's own top_logp [R, kappa] (module docstring)."""
    return prefix[:, None] + top_logp


# Branch scorings by name: (prefix [R], top_logp [R, kappa], float64) -> the scores [R, kappa] the
# budget keeps the best of. ``scoring`` (below) says which one both paths run: the host's choice
# (``choose_branches``) and the rollout stage's (models/rollout.py: its spec is made with it).
# research/branch_scoring.py adds its rules here and chooses each in turn.
SCORINGS = {"step-end": step_end}
_SCORING = ["step-end"]  # the setting: one name


def use_scoring(name: str):
    """Score the branches of the runs made from now on by ``SCORINGS[name]``."""
    if name not in SCORINGS:
        raise KeyError(f"no branch scoring {name!r}: one of {sorted(SCORINGS)}")
    _SCORING[0] = name


def scoring() -> str:
    """The branch scoring in use (``use_scoring``); "step-end" unless chosen otherwise."""
    return _SCORING[0]


def branch_scores(top_ids: torch.Tensor, top_logp: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                  node_logp: torch.Tensor, T: int | torch.Tensor, score=step_end) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [R, kappa] (float64) and skip [R, kappa] of a window's hypotheses, rows [root, nodes]
    (a chain: a one-path tree, row r + 1 the child of row r).

    top_ids, top_logp [R, kappa]: the early exit's candidates at each row; tokens, parents [R]: each
    row's token and parent row (tree_rules.py: the root and padding rows their own); node_logp [R]:
    each row's token's log-prob at its parent's row (the root's unused). T: the rows in use (an int,
    or a [1] tensor inside a captured stage); rows past it are padding: skipped, scored -inf. The
    path sums run root to leaf, in row order: a parent's row comes before its children's."""
    R = top_ids.shape[0]
    row = torch.arange(R, device=top_ids.device)
    real, node = row < T, (row > 0) & (row < T)  # [R]: rows in use; the nodes among them
    seen = ancestors(parents)  # [R, R]: each row's ancestors and itself
    prefix = torch.where(seen & node[None, :], node_logp.double()[None, :], 0).cumsum(-1)[:, -1]  # [R]: path to row r
    children = (parents[None, :] == row[:, None]) & node[None, :]  # [R, R]: [row, node] the node is a child of the row
    same = top_ids[:, :, None] == tokens[None, None, :]  # [R, kappa, R]: a candidate is that node's token
    skip = (same & children[:, None, :]).any(-1) | ~real[:, None]  # an acceptance, not a branch point; or padding
    return torch.where(real[:, None], score(prefix, top_logp.double()), float("-inf")), skip


def rank_branches(scores: torch.Tensor, skip: torch.Tensor, top_ids: torch.Tensor, budget: int):
    """The ``budget`` best hypotheses of scores [T, kappa], best first (ties in (r, rank) order), the
    skipped ones after every other: (r, roots, scores, valid) [min(budget, T * kappa)]."""
    kappa = scores.shape[1]
    scores, skip = scores.flatten(), skip.flatten()
    order = torch.sort(scores, descending=True, stable=True).indices  # best first
    order = order[torch.sort(skip[order].byte(), stable=True).indices][:budget]  # the skipped ones last
    return order // kappa, top_ids.flatten()[order], scores[order], ~skip[order]


def choose_branches(draft: list[int], top_ids: torch.Tensor, top_logp: torch.Tensor, window_logp: torch.Tensor,
                    budget: int, parents: list[int] | None = None, scoring_name: str | None = None):
    """The rows the draft rolls out for a window of draft tokens ``draft`` (a chain, or with
    ``parents`` a tree), from the token channel where it lies (window_logp [N]: each draft token's
    log-prob at its parent's row), nothing read to the host: (r, roots, scores, valid)
    [min(budget, T * kappa)], best first (module docstring), scored by ``scoring_name`` (None: the
    scoring in use)."""
    parents = list(range(-1, len(draft) - 1)) if parents is None else parents  # a chain: a one-path tree
    rows = to_device([[0, *draft], [0, *(p + 1 for p in parents)]], top_ids.device)  # [2, T]: token, parent row
    node_logp = torch.cat([window_logp.new_zeros(1), window_logp[:len(draft)]])  # [T]
    scores, skip = branch_scores(top_ids, top_logp, rows[0], rows[1], node_logp, len(draft) + 1,
                                 SCORINGS[scoring_name or scoring()])
    return rank_branches(scores, skip, top_ids, budget)


@dataclass
class Branch:
    """One hypothesis of the step's outcome, and the draft's continuation after it."""

    accepted: int  # r: window tokens (a tree window: rows) accepted before the branch point
    root: int  # v: the token the target emits at row r in this hypothesis
    score: float  # its early-exit log-probability
    tokens: list[int] = field(default_factory=list)  # the draft's continuation after root (a tree's nodes)
    q: list[torch.Tensor] = field(default_factory=list)  # their laws [V] (temperature > 0)
    tree: object = None  # the continuation as a drafting.tree.Tree hanging from root (None: a chain)


@dataclass
class BranchTable:
    """The draft lane's answer in a Mirror-SD step: the B chosen branches, best first, and their
    rollouts, on the draft's device until read (``read``).

    table [B, 4 + L] (float64, ids exact): per branch r, root, valid (0: a skipped candidate, rolled
    out only to keep B rows), score, then the L rolled-out tokens of a chain (L = 0 where they are
    drawn on the host: ``drawn``, or grown as ``trees``). One tensor, so that the host reads it in one copy."""

    table: torch.Tensor
    drawn: list[tuple[list[int], list[torch.Tensor]]] | None = None  # per branch: tokens, their laws (T > 0)
    trees: list | None = None  # per branch: its rolled-out tree

    @staticmethod
    def columns(r: torch.Tensor, roots: torch.Tensor, valid: torch.Tensor, scores: torch.Tensor,
                tokens: torch.Tensor | None = None) -> torch.Tensor:
        """The table of branches (r, roots, valid, scores [B]) and their tokens [B, L] (None: L = 0)."""
        parts = [torch.stack([r, roots, valid.long()], dim=1).double(), scores[:, None].double()]
        return torch.cat(parts + ([tokens.double()] if tokens is not None else []), dim=1)

    def read(self) -> list[Branch]:
        """The valid branches, read to the host in one copy: the ones a step records and may hit."""
        branches = []
        for b, row in enumerate(self.table.tolist()):
            if not row[2]:
                continue
            branch = Branch(int(row[0]), int(row[1]), row[3], tokens=[int(t) for t in row[4:]])
            if self.drawn is not None:
                branch.tokens, branch.q = self.drawn[b]
            if self.trees is not None:
                branch.tree, branch.tokens = self.trees[b], self.trees[b].tokens
            branches.append(branch)
        return branches


def branch_hit(branches: list[Branch], accepted: int, token: int) -> int | None:
    """The branch rolled out after ``accepted`` window tokens and ``token``, the step's outcome (None: a miss)."""
    return next((i for i, b in enumerate(branches) if (b.accepted, b.root) == (accepted, token)), None)
