"""EAGLE-2's greedy draft as one fixed-shape stage: on a CUDA lane, a whole draft is one graph.

At T = 0 an EAGLE step drafts in two parts (methods/eagle.py): the head runs over the (feature,
token) pairs it has not seen, then a tree grows ``depth`` levels deep from its last output, one
head forward per level over the ``top_k`` best nodes of the newest level, and the best
``total_tokens`` nodes are kept (``tree_growth.grow_fields``). Run an operation at a time, that
is some two hundred launches from the host per step, each costing the host more than the GPU's
work it launches (docs/devices.md). But every shape in it is fixed by (depth, top_k, total_tokens)
and the bucket of the pairs, and nothing in it needs the host until the tree is read. So a
:class:`TreeDraftStage` runs all of it in its body: the host copies the pairs in, replays one
graph, and reads the tree once.

The body: the head over the pairs (a causal window, laid out as every stage lays one out), the
first level from the last pair's output, then ``grow_fields`` with an ``expand`` that runs the
head's layer over each level's rows at a fixed width: their slots follow the pairs' (uncommitted:
the next step's pairs overwrite them), their positions are the root's plus their depth, and each
sees the committed slots and its ancestors' rows. A run over padding only (warm-up, capture)
writes scratch slots only, as every stage's does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import MirrorSDError
from ..tree_growth import grow_fields
from .eagle import EagleHead, HeadStage
from .stages import OwnStage, SlotWriter
from .tuned import run_layers


class TreeDraftStage(HeadStage):
    """The head over up to ``width`` pairs, then the tree grown from the last one (module docstring)."""

    def __init__(self, head: EagleHead, width: int, cache, draft: TreeDraft):
        super().__init__(head, width, cache, early=draft.early)
        self.draft = draft
        self.k = min(draft.top_k, head.vocab_map.numel())
        self.tree_rows = (draft.depth - 1) * self.k  # slots the levels write after the pairs'

    def run(self, ids, positions=None, mask=None, feats=None, early=None) -> torch.Tensor:
        """The kept nodes' fields [1, 4, total_tokens] (``drafting.tree.read_trees``) of the tree drafted
        after T pairs: ids [1, T] with features ``feats`` [1, T, d] (and ``early``), written after the
        cache's slots as a causal window. The cache's length does not move."""
        if positions is not None or mask is not None:
            raise MirrorSDError("a tree draft's pairs are a causal window: no positions or mask")
        T = ids.shape[1] if isinstance(ids, torch.Tensor) else len(ids[0])
        if self.cache.length + T + self.tree_rows > self.cache.max_slots:
            raise MirrorSDError(f"KV cache full: {self.cache.length} + {T} pairs + {self.tree_rows} tree rows "
                                f"> {self.cache.max_slots} slots")
        with torch.inference_mode():
            self.load_pairs(ids, None, None, feats, early)
            self.replay()
        return self.out

    def body(self) -> torch.Tensor:
        head = self.model
        h = super().body()[0]  # [W, d]: the head's output after each pair (padding rows after them)
        layout = self.layout()
        T, start = layout.rows, layout.start  # [1] each
        base, live = start + T, T > 0  # the committed slots (n - 1); padding only: scratch slots only
        s, usable = self.slot_ids, self.cache.max_slots  # s [S]

        def run_head(feats, tokens, depth, ancestors):  # [R, d], [R], an int, [R, R'] -> the head's outputs [R, d]
            R, seen = tokens.shape[0], ancestors.shape[1]
            rows = torch.arange(R, device=s.device)
            slots = torch.where(live, base + seen - R + rows, usable + rows)  # [R]: after the rows so far
            theirs = ancestors.gather(1, (s - base).clamp(0, seen - 1).expand(R, -1))  # [R, S]: ancestors[r, s - base]
            sees = (s < base) | ((s >= base) & (s < base + seen) & theirs)
            mask = torch.where(live, sees, s == (usable + rows)[:, None])  # [R, S]
            positions = (base - 1 + depth).expand(1, R)  # a node at depth j: n - 2 + j
            x = head.inputs(feats[None], tokens[None])
            return run_layers([head.layer], x, SlotWriter(self.cache, slots), self.rows_window(positions, mask), 0)[0]

        last = h.index_select(0, (T - 1).clamp(min=0))  # [1, d]: f^_{n-1}, the root's
        return grow_head_tree(head, last, run_head, self.draft.depth, self.draft.top_k, self.draft.total_tokens)


def grow_head_tree(head: EagleHead, last: torch.Tensor, run_head, depth: int, top_k: int,
                   total_tokens: int) -> torch.Tensor:
    """EAGLE-2's dynamic tree from the head's last output last [1, d] (f^_{n-1}), the rule both paths
    run (methods/eagle.py: ``draft_tree``, a forward at a time; ``TreeDraftStage``'s body): the first
    level from last's logits, then ``grow_fields`` (tree_growth.py), each frontier node fed to the head
    with its parent's output (the root's: last) and its own token. ``run_head(feats [R, d], tokens [R],
    depth, ancestors [R, R'])`` runs the head's layer over a level's rows (``grow_fields``' expand:
    each row seeing the committed slots and its ancestors, at the root's position plus its depth)
    and returns their outputs [R, d]. Returns the kept nodes' fields [1, 4, M]."""
    k = min(top_k, head.vocab_map.numel())
    predicted = last.new_zeros(1 + k + (depth - 1) * k * k, last.shape[-1])  # row i + 1: node i's output
    predicted[0] = last[0]

    def expand(_trees, nodes, parents, tokens, depth, ancestors):
        out = run_head(predicted[parents + 1], tokens, depth, ancestors)  # [R, d]
        predicted[nodes + 1] = out
        return torch.log_softmax(head.logits(out), dim=-1)

    first = torch.log_softmax(head.logits(last), dim=-1)  # [1, rows]
    return grow_fields(first, expand, lambda rows: head.vocab_map[rows], depth, top_k, total_tokens)


@dataclass(frozen=True)
class TreeDraft(OwnStage):
    """A head stage set's forward (``HeadStages``): the whole greedy draft at these settings. Give it
    to ``ModelPair.new_cache`` among the head's ranges to make (capture) its stages at warm-up."""

    depth: int
    top_k: int
    total_tokens: int
    early: bool = False  # the pairs bring early features (a head with early layers)

    stage = TreeDraftStage

    @property
    def name(self) -> str:
        return (f"tree draft {self.depth}x{self.top_k}, {self.total_tokens} kept"
                + (" + early features" if self.early else ""))
