"""Classic draft-model speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each step a drafter (``mirror_sd/drafting``: option ``streams`` picks token by token, the draft's
streams in one forward, or the draft checking its streams' lookahead) proposes a window on the
draft lane: a chain of gamma tokens or, with ``tree`` > 0 (token by token, T = 0), a tree of that
many tokens grown gamma levels deep. The target verifies the window on the target lane as a tree,
a chain being a tree of one path (``Proposal.window``): one forward over [last committed token,
window] under the tree mask, then the one lossless rule (``verify.accept_tree``: the walk down the
children that match its argmax at T = 0, speculative sampling along the chain at T > 0). Both KV
caches are rolled back to what was committed. The draft sits on the critical path: draft and
target take turns (the serial barrier that Mirror-SD removes).

At T = 0 on stages (a GPU's CUDA graphs) the target verifies each window on its tree verification
stage (models/eagle_verify.py), which runs the same walk. A greedy chain drafted token by token
is then two replays queued on the lanes' streams and one read: the draft's chain stage leaves its
picks on the device as a one-branch tree, the target's stream waits for them on a CUDA event and
verifies them (``verify.draft_and_verify_on_stages``); the host waits for the GPU once.
"""
from __future__ import annotations

from ..drafting import Proposal, TokenByToken, make_drafter
from ..drafting.token_by_token import chain_on_stage, chain_stages
from ..drafting.tree import Tree, keep_path, tree_window
from ..executors import Streams
from ..models.chain_draft import ChainDraft
from ..models.eagle_verify import TreeVerify
from ..models.forwards import FULL, forward
from ..trace import DraftWork, SpanKind, Step
from .prefill import prefill_pair
from .verify import accept_tree, draft_and_verify_on_stages, drafted_verify_stages, verify_stages, verify_tree_on_stage


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


def one_read_stages(run, draft_cache, target_cache, chain: ChainDraft | None):
    """(the draft's stages, the target's) where this step's greedy ``chain`` (None: the drafter's
    windows are no such chain) can be drafted as a tree and verified on them with one read
    (``chain_stages``, ``drafted_verify_stages``); else None."""
    draft_stages = chain_stages(run, draft_cache, chain) if chain is not None else None
    target_stages = (drafted_verify_stages(run, target_cache, TreeVerify(), chain.gamma, [])
                     if draft_stages is not None else None)
    return (draft_stages, target_stages) if target_stages is not None else None


def draft_and_verify(run, ex, drafter, draft_cache, target_cache, gamma: int, chain: ChainDraft | None,
                     **draft_span) -> tuple[Proposal, list[int], int]:
    """One step's window, drafted on the draft lane and verified on the target lane: (the proposal,
    the accepted path, the next token). A greedy chain whose stages are made is drafted and verified
    on them, read once; any other window is read to the host, then verified (``verify_tree``)."""
    stages = one_read_stages(run, draft_cache, target_cache, chain)
    if stages is not None:
        drafted, path, token, *_ = draft_and_verify_on_stages(
            run, ex, run.draft_lane, (chain_on_stage, run, stages[0], draft_cache, chain), gamma, stages[1],
            target_cache, TreeVerify(), **draft_span)
        return Proposal(drafted.tokens, None, DraftWork(forwards=gamma)), path, token
    # the draft's laws q (T > 0) may still be in the making on its stream: its result waits for them
    proposal = ex.start(run.draft_lane, SpanKind.DRAFT, drafter.propose, run, draft_cache, gamma, **draft_span).result()
    n = len(proposal.tokens)
    path, token = ex.start(run.target_lane, SpanKind.VERIFY, verify_tree, run, target_cache, proposal.window(),
                           label=f"verify {n + 1} tokens", step=draft_span["step"], tokens=n + 1).result()
    return proposal, path, token


def decode(run, gamma: int, **drafter_options):
    pair = run.pair
    drafter = make_drafter(**drafter_options)
    greedy = run.draft_sampler.greedy
    # a greedy chain drafted token by token: as a one-branch tree on the draft's stage
    chain = (ChainDraft(gamma, pair.target.args.vocab_size, as_tree=True)
             if greedy and isinstance(drafter, TokenByToken) and not drafter.tree and not drafter.copy_below else None)
    target_cache, draft_cache, first = prefill_pair(run, extra_draft_slots=drafter.extra_slots(pair, gamma),
                                                    target_ranges=[FULL, *([TreeVerify()] if greedy else [])],
                                                    draft_ranges=[FULL, chain] if chain is not None
                                                    else drafter.layer_ranges(pair, gamma, greedy))
    yield first
    label = (f"draft tree of {drafter.tree} tokens, depth {gamma}" if drafter.tree
             else f"draft {gamma} tokens{drafter.how}")
    ex = Streams()  # its phases follow one another: queued, each read when needed
    while not run.done:
        step, committed = run.next_step, len(run.sequence)
        proposal, path, token = draft_and_verify(run, ex, drafter, draft_cache, target_cache, gamma, chain,
                                                 label=label, step=step, tokens=gamma)
        accepted = len(path)
        tokens, origins = proposal.window().committed(path, token)
        draft_cache.rollback(min(draft_cache.length, committed + accepted))
        drafter.settle(proposal, accepted)
        yield run.commit(Step(step, tokens, origins, proposed=proposal.tokens, accepted=accepted, draft=proposal.work,
                              tree=proposal.tree.record(path) if proposal.tree is not None else None))
