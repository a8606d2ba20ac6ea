"""The classic draft: one draft forward per window token, each token the draft's own pick.

With option ``tree`` > 0 (temperature 0), the draft grows a tree instead of a chain: EAGLE-2's
dynamic tree (``tree.grow_tree``), ``gamma`` levels deep, each level one draft forward over the
``branching`` best nodes of the level before (tree mask, depth positions), each node given its
``branching`` most likely children; the best ``tree`` nodes by summed log-prob are what the target
verifies, in one forward (methods/sd.py). At T > 0 it drafts the chain: a deterministic top-k
tree has no exact sampling rule (as in methods/eagle.py).

With option ``copy_below`` > 0, where the draft is unsure (its top-1 probability below it) and the
context continues the last 3 or 2 tokens somewhere, the draft proposes that copied token instead
(``unsure_copy``): small drafts copy names, numbers and phrases from a prompt's passage badly. At
T > 0 the copied token's proposal law is one-hot (a law fixed by the prefix), which the
speculative-sampling rule handles like any other.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..devices import to_device
from ..errors import MirrorSDError
from ..models.chain_draft import ChainDraft, greedy_chain
from ..models.forwards import FULL, forward, staged_for
from ..models.stages import MAX_WIDTH
from ..options import Option
from ..trace import DraftWork
from .base import Drafter, Proposal
from .lookup import copy_from_context
from .tree import Tree, grow_tree

COPY_NGRAM_SIZES = (3, 2)  # the last token alone matches too often where the draft was right
COPY_BELOW = Option("copy_below", 0.0, 0.0, 1.0, "where the draft's top-1 probability is below this and the "
                    "context continues the last 3 or 2 tokens, propose the copied token instead (0: off)", kind=float)
TREE = Option("tree", 0, 0, 63, "draft tree nodes the target verifies in one forward: the best of a tree the draft "
              "grows gamma levels deep (temperature 0 only); 0: a chain of gamma tokens",
              greedy_only=True)
BRANCHING = Option("branching", 4, 1, 16, "with tree: children per expanded node, and nodes expanded per level")


def unsure_copy(sequence: list[int], logits: torch.Tensor, probs: torch.Tensor | None, below: float) -> int | None:
    """The token the context continues ``sequence``'s last 3 or 2 tokens with (lookup.py), where the
    draft is unsure: its top-1 probability below ``below`` (``probs`` [V], the law it draws from at
    T > 0; at T = 0, None: the softmax of ``logits`` [V]); else None."""
    if float((logits.softmax(-1) if probs is None else probs).max()) >= below:
        return None
    copied = copy_from_context(sequence, 1, COPY_NGRAM_SIZES)
    return copied[0] if copied else None


def draft_token(sampler, logits: torch.Tensor, context: list[int] | None, copy_below: float):
    """One draft token from ``logits`` [V] (the target's vocabulary): the draft's own pick, or where
    it is unsure the context's copy (``unsure_copy``; ``context``: the sequence the token follows,
    None when copy_below is 0). Returns (token, its law [V] at T > 0 else None, whether it was copied)."""
    probs = None if sampler.greedy else sampler.probs(logits)  # [V]
    copied = unsure_copy(context, logits, probs, copy_below) if copy_below else None
    if copied is None:
        return (int(logits.argmax()) if probs is None else sampler.sample(probs)), probs, False
    return copied, None if probs is None else F.one_hot(torch.tensor(copied), len(probs)).to(probs), True


def draft_window(run, cache, gamma: int, copy_below: float = 0.0):
    """Draft gamma tokens after the committed sequence: returns (tokens, q [gamma, V] or None, the
    positions of the tokens copied from the context).

    The draft first catches up on committed tokens it has not seen (1 or 2), then autoregresses;
    its cache ends holding the sequence and tokens[:-1] (the last drafted token is never fed). At
    T = 0 without copies each token is fed back from the device, and the host reads the window once
    at the end, so a GPU never waits for the host between forwards.
    """
    draft, sampler = run.pair.draft, run.draft_sampler
    chain = ChainDraft(gamma, run.pair.target.args.vocab_size)
    stages = chain_stages(run, cache, chain) if sampler.greedy and not copy_below else None
    if stages is not None:  # one stage for all
        return chain_on_stage(run, stages, cache, chain).tolist(), None, []
    ids = to_device([run.sequence[cache.length:]], draft.device)  # [1, pending]
    if sampler.greedy and not copy_below:  # the rule the chain's stage runs, a forward at a time
        def feed(pick: torch.Tensor, _k: int) -> torch.Tensor:  # [1] -> its logits [1, V_draft]
            return forward(draft, pick.view(1, 1), cache)[0]

        picks = greedy_chain(forward(draft, ids, cache)[0, -1:], feed, gamma, draft.vocab_map, chain.vocab_size)
        return picks[0].tolist(), None, []
    tokens, q, copies = [], [], []
    for i in range(gamma):
        logits = run.as_target_vocab(forward(draft, ids, cache)[0, -1])  # [V]
        token, probs, copied = draft_token(sampler, logits, run.sequence + tokens if copy_below else None, copy_below)
        tokens.append(token)
        if copied:
            copies.append(i)
        if probs is not None:
            q.append(probs)
        ids = to_device([[token]], draft.device)
    return tokens, (torch.stack(q) if q else None), copies


def chain_stages(run, cache, chain: ChainDraft):
    """The draft's stage set where its greedy chain is one stage this step (``chain``'s: made at
    warm-up, and the committed tokens it has not seen within its widest window); else None."""
    stages = staged_for(run.pair.draft, cache, chain)
    return stages if stages is not None and len(run.sequence) - cache.length <= MAX_WIDTH else None


def chain_on_stage(run, stages, cache, chain: ChainDraft) -> torch.Tensor:
    """The greedy chain, on the draft's device, from one replay of its ``chain_stages`` stage: picks
    [gamma] (target ids), or with ``chain.as_tree`` a tree's fields [1, 4, gamma]. The cache moves
    past the unseen tokens and the first gamma - 1 picks."""
    pending = run.sequence[cache.length:]
    drafted = stages.run(chain.name, [pending])
    cache.length += len(pending) + chain.gamma - 1
    return drafted


def tree_readers(run):
    """How a draft tree reads the draft's logits: (log_probs, to_ids). log_probs: logits [k, draft rows]
    -> log-probs [k, rows] (rows: the draft's vocabulary, or the target's where the draft's head is
    wider); to_ids: rows (a tensor) -> target ids."""
    draft, V = run.pair.draft, run.pair.target.args.vocab_size
    vocab_map = draft.vocab_map

    def log_probs(logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax((logits if vocab_map is not None else logits[..., :V]).float(), dim=-1)

    return log_probs, (lambda rows: vocab_map[rows]) if vocab_map is not None else (lambda rows: rows)


def draft_tree(run, cache, depth: int, branching: int, nodes: int) -> Tree:
    """A dynamic tree of ``nodes`` draft tokens, ``depth`` levels deep (module docstring), after the
    committed sequence; the draft's cache ends holding the sequence (the tree's entries rolled back)."""
    draft, n = run.pair.draft, len(run.sequence)
    log_probs, to_ids = tree_readers(run)

    def expand(_trees, _nodes, _parents, tokens, depth, mask):  # tokens [k] at ``depth``: position n-1+depth
        positions = torch.full((1, len(tokens)), n - 1 + depth, device=draft.device)
        return log_probs(forward(draft, tokens[None], cache, positions, mask)[0])

    first = log_probs(forward(draft, to_device([run.sequence[cache.length:]], draft.device), cache)[0, -1])
    tree = grow_tree(first, expand, to_ids, depth, branching, nodes, cache.length)
    cache.rollback(n)
    return tree


class TokenByToken(Drafter):
    OPTIONS = (COPY_BELOW, TREE, BRANCHING)

    def __init__(self, copy_below: float = 0.0, tree: int = 0, branching: int = 4):
        self.copy_below, self.tree, self.branching = copy_below, tree, branching

    def layer_ranges(self, pair, gamma: int = 0, greedy: bool = False) -> list:
        """The full forward; at T = 0 a chain of gamma tokens as one stage too (models/chain_draft.py)."""
        chain = greedy and gamma and not self.tree and not self.copy_below
        return [FULL, *([ChainDraft(gamma, pair.target.args.vocab_size)] if chain else [])]

    def check(self, pair, gamma: int):
        if self.tree and self.copy_below:
            raise MirrorSDError("copy_below works on a chain of draft tokens, not on a tree: set tree=0 or copy_below=0")

    def extra_slots(self, pair, gamma: int) -> int:
        """A tree's expanded nodes sit in the draft's cache while it grows (its target window, at most
        64 rows, fits the usual margin)."""
        return self.branching * (gamma - 1) if self.tree else 0

    def propose(self, run, cache, gamma: int) -> Proposal:
        if self.tree:  # temperature 0 only: the engine refuses a tree at T > 0
            tree = draft_tree(run, cache, gamma, self.branching, self.tree)
            return Proposal(tree.tokens, None, DraftWork(forwards=gamma), tree=tree)
        tokens, q, copies = draft_window(run, cache, gamma, self.copy_below)
        return Proposal(tokens, q, DraftWork(forwards=gamma, copied_at=copies))
