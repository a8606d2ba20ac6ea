"""Classic draft-model speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each step a drafter (``mirror_sd/drafting``: option ``streams`` picks token by token, the draft's
streams in one forward, or the draft checking its streams' lookahead) proposes gamma tokens on the
draft lane; the target scores all gamma + 1 positions in one forward on the target lane;
``verify`` accepts a prefix and adds the correction or bonus token. Both KV caches are rolled back
to what was committed. With ``tree`` > 0 (token by token, T = 0) the draft proposes a tree of that
many tokens instead, and the target verifies it as eagle verifies its head's: one forward under
the tree mask, then the walk down the children that match its argmax (``verify_tree``). The draft
sits on the critical path: draft and target take turns (the serial barrier that Mirror-SD removes).

At T = 0, token by token, on stages (a GPU's CUDA graphs), a chain step is two replays queued on
the lanes' streams and one read: the draft's chain stage leaves its picks on the device as a
one-branch tree, the target's stream waits for them on a CUDA event and verifies them on the
tree verification stage (``verify.draft_and_verify_on_stages``); the host waits for the GPU once.
"""
from __future__ import annotations

import torch

from ..drafting import Proposal, TokenByToken, make_drafter
from ..drafting.token_by_token import chain_on_stage, chain_stages
from ..drafting.tree import Tree, keep_path, tree_window
from ..executors import Streams
from ..models.chain_draft import ChainDraft
from ..models.eagle_verify import TreeVerify
from ..models.forwards import FULL, forward
from ..trace import DraftWork, SpanKind, Step
from .prefill import prefill_pair
from .verify import (Verdict, accept_tree, draft_and_verify_on_stages, drafted_verify_stages, verify, verify_stages,
                     verify_tree_on_stage)


def check(pair, options):
    make_drafter(**_drafter_options(options)).check(pair, options["gamma"])


def _drafter_options(options: dict) -> dict:
    return {name: value for name, value in options.items() if name != "gamma"}


def verify_tree(run, cache, tree: Tree) -> tuple[list[int], int]:
    """One target forward over [last committed token, tree nodes] under the tree mask; the accepted
    path (nodes) and the next token. The cache keeps the root and the path. At T = 0 on the target's
    stages, one stage (models/eagle_verify.py)."""
    stages = verify_stages(run, cache, tree, TreeVerify())
    if stages is not None:
        return verify_tree_on_stage(run, stages, cache, tree, TreeVerify())[:2]
    ids, positions, mask = tree_window(tree, run.sequence, run.pair.target.device)
    logits = forward(run.pair.target, ids, cache, positions, mask)[0]  # [N + 1, V]
    path, token = accept_tree(tree, logits, run.target_sampler)
    keep_path(cache, path, len(run.sequence))
    return path, token


def one_read_stages(run, draft_cache, target_cache, chain: ChainDraft, spec: TreeVerify):
    """(the draft's stages, the target's) where this step's greedy chain can be drafted as a tree
    and verified on them with one read (``chain_stages``, ``drafted_verify_stages``); else None."""
    draft_stages = chain_stages(run, draft_cache, chain)
    target_stages = (drafted_verify_stages(run, target_cache, spec, chain.gamma, []) if draft_stages is not None
                     else None)
    return (draft_stages, target_stages) if target_stages is not None else None


def decode(run, gamma: int, **drafter_options):
    pair = run.pair
    drafter = make_drafter(**drafter_options)
    extra_draft, past_gamma = drafter.extra_slots(pair, gamma)
    greedy = run.draft_sampler.greedy
    # a greedy chain drafted as a one-branch tree on the draft's stage, verified on the target's
    # tree verification stage (a draft tree's too): a stage each
    chains_on_stage = greedy and isinstance(drafter, TokenByToken) and not drafter.tree and not drafter.copy_below
    chain, verify_spec = ChainDraft(gamma, pair.target.args.vocab_size, as_tree=True), TreeVerify()
    verify_ranges = [verify_spec] if (greedy and drafter.tree) or chains_on_stage else []
    target_cache, draft_cache, first = prefill_pair(run, extra_draft_slots=extra_draft, extra_target_slots=past_gamma,
                                                    target_ranges=[FULL, *verify_ranges],
                                                    draft_ranges=[FULL, chain] if chains_on_stage
                                                    else drafter.layer_ranges(pair, gamma, greedy))
    yield first
    label = f"draft {'≥' if past_gamma else ''}{gamma} tokens{drafter.how}"
    if drafter.tree:
        label = f"draft tree of {drafter.tree} tokens, depth {gamma}"
    ex = Streams()  # its phases follow one another: queued, each read when needed
    while not run.done:
        step = run.next_step
        committed = len(run.sequence)
        stages = one_read_stages(run, draft_cache, target_cache, chain, verify_spec) if chains_on_stage else None
        if stages is not None:  # drafted and verified on the stages, read once
            drafted, path, token, *_ = draft_and_verify_on_stages(
                run, ex, run.draft_lane, (chain_on_stage, run, stages[0], draft_cache, chain), gamma, stages[1],
                target_cache, verify_spec, label=label, step=step, tokens=gamma)
            proposal = Proposal(drafted.tokens, None, DraftWork(forwards=gamma))
            draft, verdict = proposal.tokens, Verdict(len(path), token)
            accepted, (tokens, origins), tree = verdict.accepted, verdict.committed(draft), None
        else:  # the draft read to the host, then the verification
            # the draft's laws q (T > 0) may still be in the making on its stream: its result waits for them
            proposal = ex.start(run.draft_lane, SpanKind.DRAFT, drafter.propose, run, draft_cache, gamma, label=label,
                                step=step, tokens=gamma).result()
            draft = proposal.tokens
            verifying = dict(label=f"verify {len(draft) + 1} tokens", step=step, tokens=len(draft) + 1)
            if proposal.tree is not None:
                path, token = ex.start(run.target_lane, SpanKind.VERIFY, verify_tree, run, target_cache, proposal.tree,
                                       **verifying).result()
                accepted, (tokens, origins), tree = (len(path), proposal.tree.committed(path, token),
                                                     proposal.tree.record(path))
            else:
                window = torch.tensor([[run.sequence[-1], *draft]], device=pair.target.device)  # [1, len(draft) + 1]
                verified = ex.start(run.target_lane, SpanKind.VERIFY, forward, pair.target, window, target_cache,
                                    **verifying)
                verdict = verify(draft, proposal.q, verified.result()[0], run.target_sampler)
                accepted, (tokens, origins), tree = verdict.accepted, verdict.committed(draft), None
                target_cache.rollback(committed + accepted)  # last committed + accepted drafts
        draft_cache.rollback(min(draft_cache.length, committed + accepted))
        drafter.settle(proposal, accepted)
        yield run.commit(Step(step, tokens, origins, proposed=draft, accepted=accepted, draft=proposal.work, tree=tree))
