"""Speculative Streaming (Bhendawade et al., 2024), lossless form: the target drafts for itself.

No draft model. The frozen target carries trained speculative streams (models/streams.py) on its
top N_s layers. Each step, on the target lane alone, in one of two forms:

* ``one_forward=1``, the paper's form: the streams of every window row run in the verify step,
  before its correction is known. The window is [last committed token, draft tree] with the tree
  mask and depth positions; it runs through every layer, then streams 1..gamma of every window row
  run through the top layers, each seeing what its row sees (``forward_with_streams``; the paper
  joins the two in one forward, which a stream row's adapters would then have to tell apart from
  a main row's). The main stream's logits walk the tree (verify.accept_tree): the accepted path and the
  correction (or the bonus after a leaf), and ``KVCache.keep`` moves the path's entries into place.
  The streams of the last accepted row are the next draft: stream j gives the token j places after
  the correction. These streams are trained without the next-token input, since the correction is
  what the step decides (the shipped ``ss-paper-smollm2-135m``).
* ``one_forward=0``: the verify forward runs the main rows only; then the streams of the last
  accepted position re-enter the top N_s layers in a pass of their own, g rows that see the cache
  up to that position. This pass comes after the correction is committed, so streams trained with
  ``next_token_rank`` see it (the shipped ``ss-smollm2-135m``; its accuracy: docs/experiments/ss.md), and
  on a CPU, where every row costs time, only the g rows that are used run, in int8 (streams.target_streams).

The draft tree (temperature 0): the top_k tokens of stream 1 are children of the root; the top_k
tokens of stream j + 1 are children of each of the top_k best nodes of level j, scored by the sum
of their streams' log-probs; the best ``total_tokens`` nodes are verified. Every child of a level
carries the same stream's candidates (the streams see only the committed context, not the draft),
as in the paper's tree drafting. top_k = 1 is a flat chain of the streams' argmaxes.

Lossless: the main stream is the target's own computation, untouched by the streams, so at
temperature 0 the committed tokens are vanilla's. At temperature > 0 the draft is a chain whose
token j is drawn from stream j's distribution q_j, which depends only on the committed context:
drawn independently of the earlier draft tokens, it is a valid proposal for the standard
speculative-sampling rule (accept with min(1, p/q), resample from norm(max(0, p - q))), which
makes each committed token exactly target-distributed whatever q is.
"""
from __future__ import annotations

import torch

from ..devices import to_device
from ..drafting.lookup import copy_from_context
from ..drafting.tree import Tree, graft, keep_path, read_trees, sampled_chain, stream_tree, tree_window
from ..executors import Streams
from ..models.eagle_verify import TreeVerify
from ..models.forwards import staged_for
from ..models.stream_draft import StreamDraft
from ..models.streams import forward_with_streams, split_forward, stream_ranges, target_streams
from ..sampling import to_target_vocab
from ..trace import SpanKind, Step
from .verify import (accept_tree, draft_and_verify_on_stages, drafted_verify_stages, verify_stages,
                     verify_tree_on_stage)


def draft_tree(run, streams, logits, top_k: int, total_tokens: int, copied: list[int]) -> Tree:
    """The next draft from the streams' logits [gamma, head rows] after the last committed token: a
    tree at temperature 0 (with the tokens ``copied`` from the context as one more branch), else a
    chain of gamma tokens sampled from the streams."""
    sampler = run.draft_sampler
    if sampler.greedy:
        tree = stream_tree(torch.log_softmax(logits, -1).cpu(), streams.to_target_ids, top_k, total_tokens)
        return graft(tree, copied)
    q = sampler.probs(to_target_vocab(logits, streams.vocab_map, run.pair.target.args.vocab_size))  # [gamma, V]
    return sampled_chain([sampler.sample(q_j) for q_j in q], q)


def draft_from_streams(run, streams, cache, h0_row, gamma: int, top_k: int, total_tokens: int,
                       copied: list[int]) -> Tree:
    """The next draft from the streams of one main row h0_row [1, 1, d] whose token sits in the
    cache's last slot, run in a pass of their own: they see the step's correction/bonus, committed.
    At T = 0 on the target's stages, one stage (models/stream_draft.py) grows the tree."""
    spec = StreamDraft(streams, gamma, top_k, total_tokens)
    stages = staged_for(run.pair.target, cache, spec)
    if run.draft_sampler.greedy and stages is not None:
        tree = read_trees(stream_fields_on_stage(run, stages, streams, h0_row, spec))[0]
        return graft(tree, copied)
    at = to_device([[cache.length - 1]], h0_row.device)  # [1, 1]
    next_ids = to_device([[run.sequence[-1]]], h0_row.device)  # [1, 1]: the step's correction/bonus
    logits = streams(run.pair.target, cache, h0_row, at, next_ids=next_ids)[0, 0, :gamma]  # [gamma, head rows]
    return draft_tree(run, streams, logits, top_k, total_tokens, copied)


def one_read_stages(run, cache, draft_spec: StreamDraft, verify_spec: TreeVerify, copied: list[int]):
    """The target's stages where this step can draft and verify on them with one read to the host
    (``drafted_verify_stages``, and the streams' draft made there); else None."""
    stages = drafted_verify_stages(run, cache, verify_spec, draft_spec.total_tokens, copied)
    return stages if stages is not None and staged_for(run.pair.target, cache, draft_spec) is stages else None


def stream_fields_on_stage(run, stages, streams, h0_row, spec: StreamDraft) -> torch.Tensor:
    """The streams' tree from main row h0_row in one replay of the stage ``spec`` names, left on the
    device: fields [1, 4, M] (``drafting.tree.read_trees`` reads them)."""
    return stages.run(spec.name, h0_row, rows=streams.num_streams, next_id=run.sequence[-1])


def verify_tree(run, streams, cache, tree: Tree, gamma: int, one_forward: bool):
    """One target forward over [root, nodes]: the accepted path, the next token, and what the next
    draft needs: with one_forward the streams' logits [gamma, head rows] at the path's last node
    (they rode in this forward), else that node's layer-L0 hidden state [1, 1, d]. The cache keeps
    the root and the path."""
    target = run.pair.target
    spec = TreeVerify(hidden_at=streams.first_layer)
    stages = None if one_forward else verify_stages(run, cache, tree, spec)
    if stages is not None:  # one stage (models/eagle_verify.py): the path's hidden states where the streams start
        path, token, _, _, hidden = verify_tree_on_stage(run, stages, cache, tree, spec)
        return path, token, hidden[None, -1:]  # the last accepted row's [1, 1, d]
    ids, positions, mask = tree_window(tree, run.sequence, target.device)
    if one_forward:
        logits, stream_logits = forward_with_streams(target, streams, ids, cache, gamma, positions=positions,
                                                     tree_mask=mask)  # [1, N+1, V], [1, N+1, g, .]
    else:
        logits, h0 = split_forward(target, ids, cache, streams.first_layer, positions, mask)
    path, token = accept_tree(tree, logits[0], run.target_sampler)
    keep_path(cache, path, len(run.sequence))
    last = path[-1] + 1 if path else 0  # window index of the last accepted token
    return path, token, stream_logits[0, last] if one_forward else h0[:, last:last + 1]


def prefill(run, streams, window: int, gamma: int, one_forward: bool, top_k: int, total_tokens: int):
    """The prompt through the target: the first token, and what the first draft needs (see verify_tree)."""
    target, lane = run.pair.target, run.target_lane
    ranges = stream_ranges(streams)  # with one_forward too: forward_with_streams runs the same stages
    if run.draft_sampler.greedy and not one_forward:  # the streams' pass and its candidates, the verification:
        ranges += [StreamDraft(streams, gamma, top_k, total_tokens), TreeVerify(hidden_at=streams.first_layer)]
    cache = run.pair.new_cache(target, run.cache_slots + window, ranges)
    ids = torch.tensor([run.prompt_ids], device=target.device)  # [1, P]
    n = ids.shape[1]
    if one_forward:  # the streams of the last prompt token run in the prefill
        logits, stream_logits = lane.run(SpanKind.PREFILL, forward_with_streams, target, streams, ids, cache, gamma,
                                         rows=[n - 1], label=f"prefill {n} tokens", step=0, tokens=n)
        ahead = stream_logits[0, 0]
    else:
        logits, h0 = lane.run(SpanKind.PREFILL, split_forward, target, ids, cache, streams.first_layer,
                              label=f"prefill {n} tokens", step=0, tokens=n)
        ahead = h0[:, -1:]
    cache.length = n
    token = run.target_sampler.pick(logits[0, -1])
    record = run.commit(Step(0, [token], ["target"]))
    return cache, ahead, record


def decode(run, gamma: int, top_k: int, total_tokens: int, lookup: int, one_forward: int):
    lane, one_forward = run.target_lane, bool(one_forward)
    streams = target_streams(run.pair, one_forward=one_forward)
    cache, ahead, first = prefill(run, streams, total_tokens + lookup, gamma, one_forward, top_k, total_tokens)
    yield first
    copy_label = f" + up to {lookup} copied" if lookup else ""
    draft_spec = StreamDraft(streams, gamma, top_k, total_tokens)
    verify_spec = TreeVerify(hidden_at=streams.first_layer)
    ex = Streams()  # its phases follow one another: queued, each read when needed
    while not run.done:
        step = run.next_step
        copied = copy_from_context(run.sequence, lookup) if run.draft_sampler.greedy else []  # a branch from the root
        stages = None if one_forward else one_read_stages(run, cache, draft_spec, verify_spec, copied)
        if stages is not None:  # drafted and verified on the target's stages, read once
            tree, path, token, _, _, hidden = draft_and_verify_on_stages(
                run, ex, lane, (stream_fields_on_stage, run, stages, streams, ahead, draft_spec), total_tokens, stages,
                cache, verify_spec, label=f"streams: draft {gamma} levels{copy_label}", step=step, tokens=gamma)
            window, stream_rows = len(tree.tokens) + 1, 0
            ahead = hidden[None, -1:]  # the last accepted row's [1, 1, d]
        else:  # each read to the host (the tree; the verdict)
            if one_forward:  # the streams' logits came with the last forward: only the tree is left to build
                drafted = ex.start(lane, SpanKind.DRAFT, draft_tree, run, streams, ahead, top_k, total_tokens, copied,
                                   label=f"tree from the streams' logits{copy_label}", step=step, tokens=gamma)
            else:
                drafted = ex.start(lane, SpanKind.DRAFT, draft_from_streams, run, streams, cache, ahead, gamma, top_k,
                                   total_tokens, copied, label=f"streams: draft {gamma} levels{copy_label}",
                                   step=step, tokens=gamma)
            tree = drafted.result()
            window = len(tree.tokens) + 1
            stream_rows = window * gamma if one_forward else 0
            path, token, ahead = ex.start(
                lane, SpanKind.VERIFY, verify_tree, run, streams, cache, tree, gamma, one_forward, step=step,
                tokens=window,
                label=f"verify {window} tokens" + (f" + {stream_rows} stream rows" if stream_rows else "")).result()
        committed, origins = tree.committed(path, token)
        yield run.commit(Step(step, committed, origins, proposed=tree.tokens, accepted=len(path),
                              tree=tree.record(path, stream_rows)))
