"""The draft's speculative streams (models/streams.py) as drafters.

* ``Streamed``: the window in one forward: the main stream gives the first token and the streams
  the other gamma - 1. At T > 0 that window is still a valid proposal: token j is drawn from a law
  that depends only on the committed prefix, and the verifier records it.
* ``CheckedStreams``: Speculative Streaming inside the draft. Each draft forward checks the
  lookahead its streams proposed in the forward before and proposes the next. The window is the
  one ``TokenByToken`` drafts (the same tokens at T = 0, the same laws at T > 0), in fewer forwards.
  The lookahead is a tree (``LOOKAHEAD_TOP_K`` candidates per stream, the best ``LOOKAHEAD_NODES``
  nodes, and up to ``LOOKAHEAD_LOOKUP`` tokens copied from the context as one more branch).
"""
from __future__ import annotations

import torch

from ..devices import to_device
from ..errors import MirrorSDError
from ..models.forwards import FULL
from ..models.streams import draft_streams, forward_with_streams, split_forward, stream_ranges
from ..trace import DraftWork
from .base import Drafter, Proposal
from .lookup import copy_from_context
from .tree import Tree, graft, stream_tree, tree_mask, tree_positions, walk_tree

# The lookahead tree each draft forward checks: candidates per stream, nodes kept, tokens copied from
# the context (docs/experiments/draft.md#a-lookahead-tree-context-lookup-and-overshoot---streams-2).
LOOKAHEAD_TOP_K, LOOKAHEAD_NODES, LOOKAHEAD_LOOKUP = 8, 4, 8


def streamed_window(run, cache, gamma: int):
    """gamma draft tokens in one draft forward: the main stream's next token, then streams
    1..gamma-1 at the same position. The draft's cache ends holding exactly the committed sequence.
    Returns (tokens, q [gamma, V] or None)."""
    draft, sampler = run.pair.draft, run.draft_sampler
    streams = draft_streams(run.pair)
    pending = run.sequence[cache.length:]
    ids = to_device([pending], draft.device)  # [1, pending]
    main, h0 = split_forward(draft, ids, cache, streams.first_layer)  # [1, pending, V_d], [1, pending, d]
    cache.length += len(pending)
    at = to_device([[cache.length - 1]], draft.device)  # [1, 1]
    ahead = streams(draft, cache, h0[:, -1:], at)[0, 0, :gamma - 1]  # [gamma - 1, V_d]
    return sampler.draw(run.as_target_vocab(torch.cat([main[0, -1:], ahead])))  # from logits [gamma, V]


class Streamed(Drafter):
    how = " in one forward, streams"

    def check(self, pair, gamma: int):
        trained = draft_streams(pair).num_streams
        if gamma > trained + 1:
            raise MirrorSDError(f"gamma must be at most {trained + 1} with streams=1 (the draft's {trained} "
                                f"trained streams + its main stream), got {gamma}")

    def layer_ranges(self, pair, gamma: int = 0, greedy: bool = False) -> list:
        return [FULL, *stream_ranges(draft_streams(pair))]

    def propose(self, run, cache, gamma: int) -> Proposal:
        tokens, q = streamed_window(run, cache, gamma)
        return Proposal(tokens, q, DraftWork(forwards=1))


def lookahead_tree(streams, ahead: torch.Tensor | None, context: list[int], depth: int) -> Tree:
    """The lookahead a draft forward checks after ``context``, at most ``depth`` levels deep: a tree
    from the streams' logits ahead [G, head rows] of the row before (stream_tree: LOOKAHEAD_TOP_K
    candidates per stream, the best LOOKAHEAD_NODES nodes), plus up to LOOKAHEAD_LOOKUP tokens
    copied from the context as one more branch (lookup.py)."""
    tree = Tree([], [], [], [])
    if depth <= 0:
        return tree
    if ahead is not None:
        logp = torch.log_softmax(ahead[:depth].float(), -1).cpu()
        tree = stream_tree(logp, streams.to_target_ids, LOOKAHEAD_TOP_K, LOOKAHEAD_NODES)
    return graft(tree, copy_from_context(context, min(LOOKAHEAD_LOOKUP, depth)))


def window_layout(start: int, unseen: int, tree: Tree):
    """Positions [1, U + N] and mask [U + N, U + N] of a draft window [unseen tokens, tree nodes]
    written from cache slot ``start``: the unseen tokens causal, each node seeing them and its
    ancestors, at the depth after the last unseen token (the tree's root)."""
    root = start + unseen - 1
    positions = torch.cat([torch.arange(start, root)[None], tree_positions(tree.depths, root)], dim=1)
    mask = torch.ones(unseen + len(tree.tokens), unseen + len(tree.tokens), dtype=torch.bool).tril()
    mask[unseen - 1:, unseen - 1:] = tree_mask(tree.parents)
    return positions, mask


def checked_window(run, cache, gamma: int, carried: torch.Tensor | None = None):
    """draft_window's window in fewer forwards: (tokens, q [n, V] or None, the lookahead tokens each
    draft forward checked and kept, the streams' logits [G, head rows] at the row that drafted each
    token).

    Each forward feeds the tokens the draft has not seen (committed ones, or the last drafted one),
    then a tree of lookahead from the streams of the row before (lookahead_tree); the streams of the
    last unseen row and of every node run right after it (models/streams.py: forward_with_streams). The main rows walk the tree (tree.walk_tree): the accepted path and one
    more token. That row's streams give the next forward's lookahead. The cache keeps the unseen
    tokens and the path: it ends holding the sequence and tokens[:-1], as draft_window's does.

    carried: streams' logits to build the first forward's lookahead from, for the tokens after the
    unseen committed ones (see ``CheckedStreams.settle``), so that the first forward of a window can
    also yield more than one token. A forward checks only as much lookahead as fits in the window.
    """
    draft, sampler = run.pair.draft, run.draft_sampler
    streams = draft_streams(run.pair)
    tokens, rows, after, checks, ahead = [], [], [], [], carried
    while len(tokens) < gamma:
        unseen = (run.sequence + tokens)[cache.length:]
        room = gamma - len(tokens) - 1  # lookahead that fits in the window after this forward's first token
        tree = lookahead_tree(streams, ahead, run.sequence + tokens, room)
        start, U = cache.length, len(unseen)
        positions, mask = window_layout(start, U, tree)
        ids = to_device([unseen + tree.tokens], draft.device)  # [1, U + N]
        main, streamed = forward_with_streams(draft, streams, ids, cache, streams.num_streams,
                                              rows=list(range(U - 1, ids.shape[1])),
                                              positions=to_device(positions, draft.device),
                                              tree_mask=mask)  # [1, U + N, V_d], [1, N + 1, G, head rows]
        logits = run.as_target_vocab(main[0, U - 1:])  # [N + 1, V]: root, then the nodes
        # Walk the tree with the main rows: each token drawn as the draft alone draws it (argmax at
        # T = 0, a sample at T > 0), then the child that carries it. Children carry distinct tokens,
        # so each window token follows the main stream's law given the tokens before it.
        path, token = walk_tree(tree.tokens, tree.children(), lambda node: logits[node + 1], sampler.pick)
        checks.append((len(tree.tokens), len(path)))
        drafted_at = [0] + [i + 1 for i in path]  # the row that drafted each new token
        tokens += [tree.tokens[i] for i in path] + [token]
        rows.append(logits[drafted_at])
        after += list(streamed[0, drafted_at])
        cache.keep([start + U + i for i in path], at=start + U)  # unseen tokens stay; the path follows them
        ahead = after[-1]
    q = None if sampler.greedy else sampler.probs(torch.cat(rows))
    return tokens, q, checks, after


class CheckedStreams(Drafter):
    how = ", streams checked by the draft"

    def __init__(self):
        self.carried = None  # the streams' logits the next window's first lookahead comes from
        self.after: list = []  # the streams' logits at the row that drafted each token of the last window

    def check(self, pair, gamma: int):
        draft_streams(pair)

    def extra_slots(self, pair, gamma: int) -> int:
        return LOOKAHEAD_NODES + LOOKAHEAD_LOOKUP  # a forward's lookahead tree, behind the window

    def propose(self, run, cache, gamma: int) -> Proposal:
        tokens, q, checks, self.after = checked_window(run, cache, gamma, self.carried)
        return Proposal(tokens, q, DraftWork(forwards=len(checks), lookahead=checks))

    def settle(self, proposal: Proposal, accepted: int):
        # A correction replaced the token the draft drafted at row ``accepted``: the streams there
        # (made without that token) guess the tokens after it, the next window's first lookahead.
        # After a bonus: none.
        self.carried = self.after[accepted] if accepted < len(proposal.tokens) else None
