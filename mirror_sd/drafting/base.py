"""What every drafter is: the :class:`Drafter` interface and the :class:`Proposal` it returns
(the package's docstring, ``drafting/__init__.py``, says how they are used). The drafters subclass it,
and the registry in ``__init__`` imports them, so it lives apart from both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.forwards import FULL
from ..options import Option
from ..trace import DraftWork
from .tree import Tree


@dataclass
class Proposal:
    tokens: list[int]  # the window (a tree's nodes, in creation order)
    q: torch.Tensor | None  # [len(tokens), V]: each token's law at T > 0; None at T = 0
    work: DraftWork  # draft forwards, copies, lookahead checked
    tree: Tree | None = None  # the draft tree the tokens are the nodes of (None: a chain)

    def window(self) -> Tree:
        """What the target verifies: the draft tree, or the chain as a one-path tree (token i the
        parent of token i + 1, carrying its law q)."""
        if self.tree is not None:
            return self.tree
        n = len(self.tokens)
        return Tree(self.tokens, list(range(-1, n - 1)), list(range(1, n + 1)), [None] * n, self.q)


class Drafter:
    """Proposes windows for a run's committed prefix; see the module docstring."""

    OPTIONS: tuple[Option, ...] = ()
    how = ""  # how it drafts, for span labels ("" for token by token)
    tree = 0  # draft tree nodes it proposes at T = 0 (0: a chain of gamma)

    def check(self, pair, gamma: int):
        """Refuse, with a MirrorSDError, a pair or window this drafter cannot draft with."""

    def extra_slots(self, pair, gamma: int) -> int:
        """The draft cache's room beyond a window of gamma (a tree's nodes while it grows)."""
        return 0

    def layer_ranges(self, pair, gamma: int = 0, greedy: bool = False) -> list:
        """The draft's layer ranges (and forwards of its own) this drafter's forwards run, for windows
        of ``gamma`` tokens at T = 0 (``greedy``) or above (``ModelPair.new_cache``)."""
        return [FULL]

    def propose(self, run, cache, gamma: int) -> Proposal:
        raise NotImplementedError

    def settle(self, proposal: Proposal, accepted: int):
        """The target accepted ``accepted`` tokens of ``proposal``."""
