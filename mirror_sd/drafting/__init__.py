"""Drafters: what proposes the draft tokens a target verifies, apart from how they are verified.

A drafter proposes a window for the committed prefix of a run: ``propose(run, cache, gamma)``
returns a :class:`Proposal` (the tokens, their laws q at T > 0, and what the work was). ``settle``
tells it how much of the window the target accepted, for drafters that carry something over to
the next window. Each drafter carries only its own options (``OPTIONS``).

The draft model's drafters, picked by a method's ``streams`` option (``DRAFTERS``):

  0  ``TokenByToken``    one draft forward per token (token_by_token.py)
  1  ``Streamed``        the whole window in one forward, from the draft's speculative streams
  2  ``CheckedStreams``  each forward checks the lookahead its streams proposed in the one before:
                         token-by-token's window in fewer forwards (streamed.py)

Context copies (lookup.py) and draft trees (tree.py) are shared by the drafters and the methods.
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


class Drafter:
    """Proposes windows for a run's committed prefix; see the module docstring."""

    OPTIONS: tuple[Option, ...] = ()
    how = ""  # how it drafts, for span labels ("" for token by token)
    tree = 0  # draft tree nodes it proposes at T = 0 (0: a chain of gamma)

    def check(self, pair, gamma: int):
        """Refuse, with a MirrorSDError, a pair or window this drafter cannot draft with."""

    def extra_slots(self, pair, gamma: int) -> tuple[int, int]:
        """Cache room beyond a window of gamma: (draft cache, target cache)."""
        return 0, 0

    def layer_ranges(self, pair, gamma: int = 0, greedy: bool = False) -> list:
        """The draft's layer ranges (and forwards of its own) this drafter's forwards run, for windows
        of ``gamma`` tokens at T = 0 (``greedy``) or above (``ModelPair.new_cache``)."""
        return [FULL]

    def propose(self, run, cache, gamma: int) -> Proposal:
        raise NotImplementedError

    def settle(self, proposal: Proposal, accepted: int):
        """The target accepted ``accepted`` tokens of ``proposal``."""


from .streamed import CheckedStreams, Streamed  # noqa: E402  (they subclass Drafter)
from .token_by_token import TokenByToken  # noqa: E402

DRAFTERS: dict[int, type[Drafter]] = {0: TokenByToken, 1: Streamed, 2: CheckedStreams}


def drafter_options(selector: str = "streams", choices: tuple[int, ...] = tuple(DRAFTERS)) -> tuple[Option, ...]:
    """Every option of the drafters ``choices``, each applying only when its drafter is chosen."""
    return tuple(o.scoped(selector, value) for value in choices for o in DRAFTERS[value].OPTIONS)


def make_drafter(streams: int, **options) -> Drafter:
    """The drafter ``streams`` picks, with its own options (the others' are ignored)."""
    kind = DRAFTERS[streams]
    return kind(**{o.name: options[o.name] for o in kind.OPTIONS if o.name in options})
