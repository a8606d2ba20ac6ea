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


def chain_scores(top_ids: torch.Tensor, top_logp: torch.Tensor, window_logp: torch.Tensor,
                 drafted: torch.Tensor, T: int | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [R, kappa] (float64) and skip [R, kappa] of a chain window's hypotheses.

    top_ids, top_logp [R, kappa]: the early exit's candidates at each row; window_logp [R'] with
    R' >= T - 1: log p_exit(d_{r+1} at r); drafted [R'']: d_{r+1} at row r (R'' >= T - 1). T: the
    rows in use (an int, or a [1] tensor inside a captured stage; None: all R). Rows past T are
    padding: skipped, scored -inf.
    """
    R = top_ids.shape[0]
    T = R if T is None else T
    device = top_ids.device
    row = torch.arange(R, device=device)
    L = T - 1  # window tokens: row r < L holds d_{r+1}, an acceptance
    window_logp, drafted = _rows(window_logp, R), _rows(drafted, R)
    prefix = torch.cat([torch.zeros(1, dtype=torch.float64, device=device),
                        torch.where(row < L, window_logp.double(), 0).cumsum(0)])[:R]  # [R]: path to row r
    skip = ((row < L)[:, None] & (top_ids == drafted[:, None])) | (row >= T)[:, None]
    scores = torch.where((row < T)[:, None], prefix[:, None] + top_logp.double(), float("-inf"))
    return scores, skip


def tree_scores(draft: list[int], parents: list[int], top_ids: torch.Tensor, top_logp: torch.Tensor,
                window_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores [T, kappa] (float64) and skip [T, kappa] over a tree window: row 0 the last committed
    token, node i (token draft[i], parent parents[i], -1 the root) at row i + 1; window_logp [N]:
    each node's log-prob at its parent's row. The path sums run root to leaf, one level at a time."""
    device, T = top_ids.device, len(draft) + 1
    prefix, node_logp = torch.zeros(T, dtype=torch.float64, device=device), window_logp.double()
    depth = [0] * T
    for i, p in enumerate(parents):
        depth[i + 1] = depth[p + 1] + 1
    for d in range(1, max(depth) + 1):  # every parent's sum is ready before its children's
        nodes = [i for i in range(len(draft)) if depth[i + 1] == d]
        at = torch.tensor([nodes, [parents[i] + 1 for i in nodes]], dtype=torch.long).to(device)
        prefix[at[0] + 1] = prefix[at[1]] + node_logp[at[0]]
    children = torch.zeros(T, len(draft), dtype=torch.bool)  # [row, node]: node is a child of the row
    children[[p + 1 for p in parents], list(range(len(draft)))] = True
    same = top_ids[:, :, None] == torch.tensor(draft, dtype=torch.long).to(device)[None, None, :]  # [T, kappa, N]
    skip = (same & children.to(device)[:, None, :]).any(-1)
    return prefix[:, None] + top_logp.double(), skip


def rank_branches(scores: torch.Tensor, skip: torch.Tensor, top_ids: torch.Tensor, budget: int):
    """The ``budget`` best hypotheses of scores [T, kappa], best first (ties in (r, rank) order), the
    skipped ones after every other: (r, roots, scores, valid) [min(budget, T * kappa)]."""
    kappa = scores.shape[1]
    scores, skip = scores.flatten(), skip.flatten()
    order = torch.sort(scores, descending=True, stable=True).indices  # best first
    order = order[torch.sort(skip[order].byte(), stable=True).indices][:budget]  # the skipped ones last
    return order // kappa, top_ids.flatten()[order], scores[order], ~skip[order]


def choose_branches(draft: list[int], top_ids: torch.Tensor, top_logp: torch.Tensor, window_logp: torch.Tensor,
                    budget: int, parents: list[int] | None = None):
    """The rows the draft rolls out for a window of draft tokens ``draft`` (a chain, or with
    ``parents`` a tree), from the token channel where it lies, nothing read to the host:
    (r, roots, scores, valid) [min(budget, T * kappa)], best first (module docstring)."""
    if parents is None:
        drafted = torch.tensor(draft, dtype=torch.long).to(top_ids.device)
        scores, skip = chain_scores(top_ids, top_logp, window_logp, drafted)
    else:
        scores, skip = tree_scores(draft, parents, top_ids, top_logp, window_logp)
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


def _rows(values: torch.Tensor, R: int) -> torch.Tensor:
    """values [n] cut or padded with zeros to [R]."""
    if values.shape[0] >= R:
        return values[:R]
    return torch.cat([values, values.new_zeros(R - values.shape[0])])
