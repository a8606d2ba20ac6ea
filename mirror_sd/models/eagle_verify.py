"""EAGLE's greedy tree verification as one fixed-shape stage: the target's forward over the tree, the
acceptance and the cache's compaction, in one graph.

At T = 0 an EAGLE step verifies its tree (methods/eagle.py: ``verify_tree``) by one target forward
over [root, nodes] under the tree mask, then walks the tree along the target's argmax
(``verify.walk_tree_greedy``), keeps the root and the accepted path in the cache and hands their
features to the head. A :class:`TreeVerifyStage` does all of that in its body from the tree's
rows (token, depth, parent row), copied in at once:

* the tree mask: each row's ancestors, by pointer jumping over the parent rows
  (``tree_rules.ancestors``, the rule the host's ``tree_mask`` runs), so the host builds no mask;
* the forward, at positions root + depth, writing rows at slots start..; the features (the final
  norm's output; early features too, for a head that reads them) and the argmax of the LM head;
* the acceptance (``tree_rules.greedy_path``, the rule the host's ``verify.walk_tree_picks`` runs):
  a node is accepted when its token is the argmax at its parent's row and its parent is accepted.
  Siblings carry different tokens, so the accepted nodes are one path; its deepest node gives the
  next token (the argmax there);
* the compaction: the path's keys and values moved to slots start, start + 1, ...; its features
  gathered in path order for the head's next pairs.

The host reads one verdict [2 + W] (accepted length, next token, the path's rows). EAGLE, ss (the
path's hidden states where its streams start) and sd's trees verify on it. A run over padding only
(warm-up, capture) writes scratch slots only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import MirrorSDError
from ..tree_rules import ancestors, greedy_path
from .llama import Transformer
from .stages import Layout, OwnStage, SlotWriter, Stage, copy_into
from .tuned import run_layers


class TreeVerifyStage(Stage):
    """The tree's forward, its acceptance and the cache's compaction (module docstring)."""

    def __init__(self, model: Transformer, width: int, cache, spec: TreeVerify):
        super().__init__(model, width, cache, layers=(0, model.num_layers), head=False)
        self.spec = spec
        device = model.device
        self.tree = torch.zeros(3, width, dtype=torch.long, device=device)  # token, depth, parent row
        self.drafted = torch.zeros(4, width - 1, dtype=torch.float64, device=device)  # or a draft's nodes (run_drafted)
        self.root = torch.zeros(1, dtype=torch.long, device=device)  # and its root's token
        self.from_draft = torch.zeros((), dtype=torch.bool, device=device)  # which of the two the rows are

    def run(self, x, positions=None, mask=None):
        """For a tree's rows x [3][T] (lists: token, depth, parent row; row 0 the root, at depth 0 and
        its own parent), written from the cache's first free slot: the verdict [2 + W + 4 (W - 1)],
        float64 (accepted nodes A, the next token, then the path's rows: the root's 0 and the A
        nodes' rows; then the ``drafted`` buffer, read in the same go by ``run_drafted``'s caller),
        the features [W, d] of the root and the path (first A + 1 rows), their early features
        [W, n * d] (None without early layers) and their hidden states entering layer
        ``hidden_at`` [W, d] (None without it). The cache then holds the root and the path in its
        first A + 1 slots after the old length; its length does not move (the caller sets it)."""
        if positions is not None or mask is not None:
            raise MirrorSDError("a tree verify lays out its rows from their depths and parents: no positions or mask")
        with torch.inference_mode():
            copy_into(self.tree[:, :self._fits(len(x[0]))], x)  # one copy for the three rows
            self.from_draft.fill_(False)
            return self._replay(len(x[0]))

    def run_drafted(self, fields: torch.Tensor, root: int):
        """``run`` for a tree still on the device, as a one-stage draft left it (``drafting.tree.
        grow_fields``' fields [1, 4, M]: token, parent (-1: the root's child), depth, score) after
        the root token ``root``: the body lays its rows out, so the host reads nothing between the
        draft and the verdict, whose tail holds the fields."""
        M = fields.shape[-1]
        with torch.inference_mode():
            copy_into(self.drafted[:, :self._fits(M + 1) - 1], fields[0])
            self.root.fill_(root)
            self.from_draft.fill_(True)
            return self._replay(M + 1)

    def _fits(self, T: int) -> int:
        if not 1 <= T <= self.width or self.cache.length + T > self.cache.max_slots:
            raise MirrorSDError(f"a tree verify of width {self.width} after {self.cache.length} of "
                                f"{self.cache.max_slots} slots cannot hold {T} rows")
        return T

    def _replay(self, T: int):
        self.window.fill_(Layout(self.cache.length, T).code)
        self.replay()
        return self.out

    def rows_from_draft(self) -> torch.Tensor:
        """The rows [3, W] (token, depth, parent row) of the drafted tree: the root, then its nodes."""
        nodes = self.drafted.long()  # [4, W - 1]
        zero = torch.zeros_like(self.root)
        return torch.stack([torch.cat([self.root, nodes[0]]), torch.cat([zero, nodes[2]]),
                            torch.cat([zero, nodes[1] + 1])])

    def body(self):
        model, W, r, s = self.model, self.width, self.rows, self.slot_ids
        layout = self.layout()
        T, start = layout.rows, layout.start  # [1] each
        usable, live = self.cache.max_slots, T > 0
        real = (r < T) & live  # [W]
        tree = torch.where(self.from_draft, self.rows_from_draft(), self.tree)  # [3, W]
        tokens, depths = tree[0], tree[1]
        parents = torch.where(real, tree[2], r)  # padding rows: their own parent (no ancestor)
        seen = ancestors(parents)  # [W, W]: each row's ancestors and itself
        theirs = seen.gather(1, (s - start).clamp(0, W - 1).expand(W, -1))  # [W, S]: seen[row, s - start]
        sees = (s < start) | ((s >= start) & (s < start + W) & theirs)
        mask = torch.where(real[:, None], sees, self.padding)
        slots = torch.where(real, start + r, usable + r)
        positions = torch.where(real, start + depths, 0)
        win = self.rows_window(positions, mask)
        writer, spec = SlotWriter(self.cache, slots), self.spec
        h, early, hidden, a = model.embed(tokens[None]), [], None, 0
        bounds = sorted({*spec.early_layers, *([spec.hidden_at] if spec.hidden_at is not None else [])})
        for b in (*bounds, model.num_layers):  # the ranges target_features runs, split where hidden_at asks
            h = run_layers(model.model.layers[a:b], h, writer, win, a) if a < b else h
            if b in spec.early_layers:
                early.append(model.model.layers[b].input_layernorm(h))
            if b == spec.hidden_at:
                hidden = h[0]  # [W, d]
            a = b
        feats = model.model.norm(h)[0]  # [W, d]
        picks = model.lm_head(feats).float().argmax(-1)  # [W]: the target's token after each row

        accepted, deepest, path = greedy_path(seen, tokens, parents, picks, real)  # [1], [1], [W]
        kv = self.cache.kv  # [2, L, B, K, S, D]
        kv.index_copy_(4, torch.where(live, start + r, usable + r), kv.index_select(4, torch.where(live, start + path,
                                                                                                usable + r)))
        verdict = torch.cat([accepted, picks.index_select(0, deepest), path])  # [2 + W]
        verdict = torch.cat([verdict.double(), self.drafted.flatten()])  # the drafted tree with it: one read
        early = torch.cat(early, dim=-1)[0][path] if early else None
        return verdict, feats[path], early, (hidden[path] if hidden is not None else None)


@dataclass(frozen=True)
class TreeVerify(OwnStage):
    """A target stage set's forward: the greedy verification of a draft tree, the features of its
    accepted path and, for a head that reads them, their early features at ``early_layers``; with
    ``hidden_at``, the path's hidden states entering that layer too (ss's streams start there)."""

    early_layers: tuple[int, ...] = ()
    hidden_at: int | None = None

    stage = TreeVerifyStage

    @property
    def name(self) -> str:
        return ("tree verify" + (f", early features at {list(self.early_layers)}" if self.early_layers else "")
                + (f", hidden states at {self.hidden_at}" if self.hidden_at is not None else ""))
