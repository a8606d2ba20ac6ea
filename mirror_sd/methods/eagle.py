"""EAGLE-2 decoding (Li et al., 2024): a feature-level head drafts a dynamic tree on the target's lane.

State between steps, with n committed tokens x_0 .. x_{n-1}: the target's KV cache holds x_0 ..
x_{n-2} (x_{n-1} is the root of the next tree); the head's cache holds its positions i < n-1 - p,
and ``pending`` holds the p (target feature f_i, next token x_{i+1}) pairs it has not seen yet,
with their early features if the head reads any (``models/eagle.py``).

One step:
1. Draft (target lane, span kind "draft"). The head takes the pending pairs; its last output
   f^_{n-1} gives the first level of the tree: the top_k tokens for x_n. For ``depth - 1`` more
   levels the head runs once over the frontier (the top_k nodes of the newest level by score), each
   node seeing the committed positions and its ancestors (tree mask, depth position ids), and every
   frontier node gets its top_k children. Score = product of draft probabilities along the path
   (sum of log-probs). The best ``total_tokens`` nodes are kept; a child never outscores its parent
   and ties go to the earlier node, so the kept set is a tree. With ``lookup`` > 0, up to that many
   tokens copied from the context (``lookup.py``) join the tree as one more branch from the root.
2. Verify (target lane, span kind "verify"). ONE target forward over [x_{n-1}, tree nodes] with the
   tree mask (each node sees the prefix, its ancestors and itself) and positions n-1 + depth. Then
   ``verify.accept_tree`` (greedy: ``verify.walk_tree_greedy``) follows the children that match the
   target's argmax from the root: the accepted path, plus the target's token after it.
3. ``KVCache.keep`` moves the root and the accepted path's entries into place; the target's features
   there become the head's pending pairs. The head's tree entries are dropped (rollback).

Temperature > 0: the head samples a chain of ``depth`` tokens from its distribution q (the top_k /
total_tokens tree is a greedy device, and a deterministic top-k tree has no exact sampling rule),
and ``verify.accept_tree`` (``verify.verify_sampling``) checks it with the standard speculative-sampling
rule: accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), else draw from
norm(max(0, p_i - q_i)); if all pass, draw the bonus from p. Each draft token is a draw from q given exactly the committed prefix (the
head sees only committed tokens, their target features, and its own earlier draws), which is all
the Leviathan/Chen proof needs, so every committed token is distributed exactly as the target's
p given the prefix. tests/test_eagle.py checks this with a chi-square test against the exact law.
"""
from __future__ import annotations

import torch

from ..devices import to_device
from ..drafting.lookup import copy_from_context
from ..drafting.tree import Tree, graft, keep_path, read_trees, sampled_chain, tree_window
from ..executors import Streams
from ..models.eagle import EagleHead, HeadStages, head_for, stage_ranges, target_features
from ..models.eagle_tree import TreeDraft, grow_head_tree
from ..models.eagle_verify import TreeVerify
from ..models.forwards import staged_for
from ..models.stages import MAX_WIDTH
from ..sampling import to_target_vocab
from ..trace import SpanKind, Step
from .verify import (accept_tree, draft_and_verify_on_stages, drafted_verify_stages, verify_stages,
                     verify_tree_on_stage)

def check(pair, options):
    head_for(pair)  # load now: a missing head is an input error, not a failure mid-run


# -- drafting (target lane) ----------------------------------------------------------------------
def head_step(head: EagleHead, cache, feats, ids, positions=None, mask=None, early=None) -> torch.Tensor:
    """Run the head on T (feature, token) pairs; returns its predicted features [T, d].

    early [T, n * d]: the pairs' early features (true target features only)."""
    dev = head.device
    feats = feats.to(dev)[None]  # [1, T, d]
    ids = ids.to(dev)[None] if isinstance(ids, torch.Tensor) else to_device([ids], dev)  # [1, T]
    positions = to_device(positions, dev) if positions is not None else None
    early = early.to(dev)[None] if early is not None else None
    return head(feats, ids, cache, positions, to_device(mask, dev) if mask is not None else None, early)[0]


def to_target_logits(head: EagleHead, feats: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Head logits [T, rows] laid out on the target vocabulary [T, V] (-inf outside the head's rows)."""
    return to_target_vocab(head.logits(feats), head.vocab_map, vocab_size)


def draft_tree(head: EagleHead, cache, last: torch.Tensor, n: int, depth: int, top_k: int, total_tokens: int) -> Tree:
    """EAGLE-2 dynamic tree (module docstring, step 1; ``eagle_tree.grow_head_tree``, the rule the
    tree draft stage runs), a head forward per level. last: f^_{n-1} [d]; cache length n - 1."""
    base = cache.length

    def run_head(feats, tokens, depth, ancestors):  # a level's rows: a node at depth j at position n-2+j
        positions = torch.full((1, len(tokens)), n - 2 + depth, device=last.device)
        mask = torch.cat([ancestors.new_ones(len(tokens), base), ancestors], dim=1)  # every committed slot
        return head_step(head, cache, feats, tokens, positions, mask)  # [R, d]

    return read_trees(grow_head_tree(head, last[None], run_head, depth, top_k, total_tokens))[0]


def draft_chain(head: EagleHead, cache, last: torch.Tensor, n: int, depth: int, sampler, vocab_size: int) -> Tree:
    """Temperature > 0: ``depth`` tokens sampled from the head's q, each fed back (module docstring)."""
    tokens, q, feat = [], [], last
    for d in range(1, depth + 1):
        q.append(sampler.probs(to_target_logits(head, feat[None], vocab_size)[0]))
        tokens.append(sampler.sample(q[-1]))
        if d < depth:
            feat = head_step(head, cache, feat[None], [tokens[-1]], torch.tensor([[n - 2 + d]]))[0]
    return sampled_chain(tokens, torch.stack(q))


def draft(run, head: EagleHead, cache, pending, depth: int, top_k: int, total_tokens: int, copied: list[int]) -> Tree:
    """Feed the pending (feature, token, early) triples, then draft, with the tokens ``copied`` from
    the context (greedy only) grafted on as a branch; the head's cache ends at n - 1 slots. At
    T = 0 on a head's stages, all of it is one stage (``draft_on_stage``)."""
    n = len(run.sequence)
    spec = TreeDraft(depth, top_k, total_tokens, bool(head.early_layers))
    stages = staged_for(head, cache, spec)
    if run.draft_sampler.greedy and stages is not None:
        return graft(read_trees(draft_fields(run, head, stages, cache, pending, spec))[0], copied)
    feats, ids, early = pending
    last = head_step(head, cache, feats, ids, early=early)[-1]  # f^_{n-1} [d]
    if run.draft_sampler.greedy:
        tree = graft(draft_tree(head, cache, last, n, depth, top_k, total_tokens), copied)
    else:
        tree = draft_chain(head, cache, last, n, depth, run.draft_sampler, run.pair.target.args.vocab_size)
    cache.rollback(n - 1)
    return tree


def draft_on_stage(head: EagleHead, stages, cache, pending, spec: TreeDraft) -> torch.Tensor:
    """The pending pairs and the greedy tree after them in one replay of the stage ``spec`` names
    (models/eagle_tree.py): the tree's fields [1, 4, M] on the device (``read_trees`` reads them);
    pairs beyond the stage's widest window (a long prompt's, after the prefill) go through the
    head first."""
    feats, ids, early = pending
    extra = len(ids) - MAX_WIDTH
    if extra > 0:
        head_step(head, cache, feats[:extra], ids[:extra], early=early[:extra] if early is not None else None)
        feats, ids, early = feats[extra:], ids[extra:], (early[extra:] if early is not None else None)
    fields = stages.run(spec.name, to_device([ids], head.device), feats=feats[None],
                        early=early[None] if early is not None else None)  # [1, 4, M]
    cache.length += len(ids)  # the pairs are the head's now; the tree's rows after them are not
    return fields


def draft_fields(run, head: EagleHead, stages, cache, pending, spec: TreeDraft) -> torch.Tensor:
    """``draft_on_stage``, its tree left on the device for ``draft_and_verify_on_stages``; the head's
    cache ends at n - 1 slots."""
    fields = draft_on_stage(head, stages, cache, pending, spec)
    cache.rollback(len(run.sequence) - 1)
    return fields


# -- verification (target lane) ------------------------------------------------------------------
def features_of(target, ids, cache, early_layers, positions=None, mask=None):
    """Features [T, d] (final-normed hidden states) of ids [1, T] written after the cache's slots,
    and their early features [T, n * d] (None if ``early_layers`` is empty): ``target_features``
    of the one sequence."""
    feats, early = target_features(target, ids, cache, early_layers, positions, mask)
    return feats[0], (early[0] if early is not None else None)


def prefill(run, cache, early_layers=()):
    """The prompt through the target: its features [P, d], their early features and the first token."""
    target = run.pair.target
    feats, early = features_of(target, to_device([run.prompt_ids], target.device), cache, early_layers)
    cache.length = len(run.prompt_ids)
    return feats, early, run.target_sampler.pick(target.lm_head(feats[-1]).float())


def verify_tree(run, cache, tree: Tree, early_layers=()):
    """One target forward over [root, nodes]; the accepted path (nodes), the next token, and the
    features of the root and the path [A + 1, d] with their early features; the cache keeps the
    root and the path. At T = 0 on the target's stages, all of it is one stage (``verify_tree_on_stage``)."""
    target = run.pair.target
    spec = TreeVerify(tuple(early_layers))
    stages = verify_stages(run, cache, tree, spec)
    if stages is not None:
        return verify_tree_on_stage(run, stages, cache, tree, spec)[:4]
    ids, positions, mask = tree_window(tree, run.sequence, target.device)
    feats, early = features_of(target, ids, cache, early_layers, positions, mask)
    logits = target.lm_head(feats).float()  # [N + 1, V]: one pass over the head's weights for every node
    path, token = accept_tree(tree, logits, run.target_sampler)
    keep_path(cache, path, len(run.sequence))
    rows = [0] + [i + 1 for i in path]
    return path, token, feats[rows], (early[rows] if early is not None else None)


def one_read_stages(run, head: EagleHead, head_cache, cache, tree_draft: TreeDraft, verify_ranges: list,
                    copied: list[int]):
    """(the head's stages, the target's) where a step can draft and verify on them with one read
    to the host (``drafted_verify_stages``, and the tree draft made on the head's); else None."""
    if not verify_ranges:
        return None
    target_stages = drafted_verify_stages(run, cache, verify_ranges[0], tree_draft.total_tokens, copied)
    head_stages = staged_for(head, head_cache, tree_draft) if target_stages is not None else None
    return (head_stages, target_stages) if head_stages is not None else None


def decode(run, depth: int, top_k: int, total_tokens: int, lookup: int):
    pair = run.pair
    target, lane, head = pair.target, run.target_lane, head_for(pair)
    greedy = run.draft_sampler.greedy
    verify_ranges = [TreeVerify(tuple(head.early_layers))] if greedy else []  # the verification as one stage
    cache = pair.new_cache(target, run.cache_slots + total_tokens + lookup,
                           [*stage_ranges(target, head.early_layers), *verify_ranges])
    tree_draft = TreeDraft(depth, top_k, total_tokens, bool(head.early_layers))  # the whole draft: one stage
    head_ranges = [HeadStages.name(None), *([HeadStages.name(True)] if head.early_layers else []),
                   tree_draft] if greedy else []  # []: every forward
    head_cache = pair.new_cache(head, run.cache_slots + total_tokens + depth * top_k, ranges=head_ranges,
                                lane=pair.target_lane, stage_set=HeadStages)  # the head runs on the target lane
    P = len(run.prompt_ids)
    early_layers = head.early_layers
    feats, early, token = lane.run(SpanKind.PREFILL, prefill, run, cache, early_layers, label=f"prefill {P} tokens",
                                   step=0, tokens=P)
    yield run.commit(Step(0, [token], ["target"]))
    pending = (feats, run.prompt_ids[1:] + [token], early)  # f_0 .. f_{P-1} with x_1 .. x_P
    size = f"{total_tokens} tokens" + (f" + up to {lookup} copied" if lookup else "") if greedy else f"{depth} tokens"
    ex = Streams()  # its phases follow one another: queued, each read when needed
    while not run.done:
        step = run.next_step
        copied = copy_from_context(run.sequence, lookup) if greedy else []
        on_device = one_read_stages(run, head, head_cache, cache, tree_draft, verify_ranges, copied)
        if on_device:  # drafted and verified on the device, read once
            draft_work = (draft_fields, run, head, on_device[0], head_cache, pending, tree_draft)
            tree, path, token, feats, early, _ = draft_and_verify_on_stages(
                run, ex, lane, draft_work, total_tokens, on_device[1], cache, verify_ranges[0],
                label=f"draft tree of {size}, depth {depth}", step=step, tokens=len(pending[1]))
        else:  # each read to the host (the tree, to graft a copy on it; the verdict)
            drafted = ex.start(lane, SpanKind.DRAFT, draft, run, head, head_cache, pending, depth, top_k, total_tokens,
                               copied, label=f"draft tree of {size}, depth {depth}", step=step,
                               tokens=len(pending[1]))
            tree = drafted.result()
            path, token, feats, early = ex.start(lane, SpanKind.VERIFY, verify_tree, run, cache, tree, early_layers,
                                                 label=f"verify {len(tree.tokens) + 1} tokens", step=step,
                                                 tokens=len(tree.tokens) + 1).result()
        committed, origins = tree.committed(path, token)
        pending = (feats, committed, early)  # f_{n-1} .. f_{n-1+A} with x_n .. x_{n+A}
        yield run.commit(Step(step, committed, origins, proposed=tree.tokens, accepted=len(path),
                              tree=tree.record(path)))
