"""Drafters: what proposes the draft tokens a target verifies, apart from how they are verified.

A drafter proposes a window for the committed prefix of a run: ``propose(run, cache, gamma)``
returns a :class:`Proposal` (the tokens, their laws q at T > 0, and what the work was), whose
``window()`` is what the target verifies: a draft tree, or the chain as a tree of one path.
``settle`` tells it how much of the window the target accepted, for drafters that carry something
over to the next window. Each drafter carries only its own options (``OPTIONS``: token by token's).

The draft model's drafters, picked by a method's ``streams`` option (``DRAFTERS``):

  0  ``TokenByToken``    one draft forward per token (token_by_token.py)
  1  ``Streamed``        the whole window in one forward, from the draft's speculative streams
  2  ``CheckedStreams``  each forward checks the lookahead its streams proposed in the one before:
                         token-by-token's window in fewer forwards (streamed.py)

Context copies (lookup.py) and draft trees (tree.py) are shared by the drafters and the methods.
"""
from __future__ import annotations

from ..options import Option
from .base import Drafter, Proposal
from .streamed import CheckedStreams, Streamed
from .token_by_token import TokenByToken

__all__ = ["Drafter", "Proposal", "TokenByToken", "Streamed", "CheckedStreams", "DRAFTERS", "drafter_options",
           "make_drafter"]

DRAFTERS: dict[int, type[Drafter]] = {0: TokenByToken, 1: Streamed, 2: CheckedStreams}


def drafter_options(selector: str = "streams", choices: tuple[int, ...] = tuple(DRAFTERS)) -> tuple[Option, ...]:
    """Every option of the drafters ``choices``, each applying only when its drafter is chosen."""
    return tuple(o.scoped(selector, value) for value in choices for o in DRAFTERS[value].OPTIONS)


def make_drafter(streams: int, **options) -> Drafter:
    """The drafter ``streams`` picks, with its own options (the others' are ignored)."""
    kind = DRAFTERS[streams]
    return kind(**{o.name: options[o.name] for o in kind.OPTIONS if o.name in options})
