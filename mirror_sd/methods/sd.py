"""Classic draft-model speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each step the draft proposes gamma tokens on the draft lane; the target scores all gamma + 1
positions in one forward on the target lane; ``verify`` accepts a prefix and adds the correction
or bonus token. Both KV caches are rolled back to what was committed. The draft sits on the
critical path: draft and target take turns (the serial barrier that Mirror-SD removes).

How the draft proposes a window (option ``streams``):

* 0: autoregressively, gamma draft forwards. With option ``copy_below`` > 0, where the draft is
  unsure (its top-1 probability below it) and the context continues the last 3 or 2 tokens
  somewhere, the draft proposes that copied token instead (``unsure_copy``): small drafts copy
  names, numbers and phrases from a prompt's passage badly. At T > 0 the copied token's proposal
  law is one-hot (a law fixed by the prefix), which verify's rule handles like any other.
* 1: in one forward: its main stream gives the first token and its trained speculative streams
  (models/streams.py) the other gamma - 1. At T > 0 that window is still a valid proposal: token
  j is drawn from a law that depends only on the committed prefix, and verify records it (the
  argument of methods/ss.py).
* 2: Speculative Streaming inside the draft (``verified_window``): each draft forward checks the
  lookahead its streams proposed in the forward before and proposes the next. The window is the
  one streams=0 drafts (the same tokens at T = 0, the same laws at T > 0), in fewer forwards. The
  lookahead is a tree (options ``top_k`` candidates per stream, ``total_tokens`` nodes, ``lookup``
  tokens copied from the context as one more branch). With ``overshoot=1`` every forward checks
  the streams' full depth and the window keeps what was accepted past gamma: gamma to
  gamma + G tokens (G streams), the draft's own continuation all the same. Its length depends only
  on the draft's own draws (a stopping rule on the draft's side), so at T > 0 verify's rule still
  leaves every committed token distributed as the target's.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import MirrorSDError
from ..models.streams import draft_streams, forward_with_streams, split_forward
from ..trace import Step
from .lookup import copy_from_context
from .tree import Tree, graft, stream_tree, tree_mask, tree_positions
from .verify import verify, walk_tree


def prefill(run, extra_draft_slots: int = 0, extra_target_slots: int = 0):
    """Prefill the target, then the draft, each alone on its lane; commit the target's first token.

    One after the other, so that on a CPU whose cores the lanes split (Mirror-SD) the target's
    prefill gets them all: the draft's is about a tenth of the work. Side by side, the target ran
    on one core of two, and Mirror-SD's prefills took 1.6 s against vanilla's 1.1 on the 12 bench
    prompts. extra_draft_slots, extra_target_slots: room in the caches beyond the sequence and the
    usual window margin (Mirror-SD's rollout trees; sd's lookahead trees and windows past gamma).
    """
    pair = run.pair
    target_cache = pair.target.new_cache(run.cache_slots + extra_target_slots)
    draft_cache = pair.draft.new_cache(run.cache_slots + extra_draft_slots)
    n = len(run.prompt_ids)
    target_ids = torch.tensor([run.prompt_ids], device=pair.target.device)  # [1, P]
    draft_ids = torch.tensor([run.prompt_ids[:-1]], device=pair.draft.device)  # last token: fed at step 1
    label = f"prefill {n} tokens"
    logits = pair.target_lane.run("prefill", pair.target, target_ids, target_cache, label=label, step=0,
                                  tokens=n, alone=True)
    if n > 1:
        pair.draft_lane.run("prefill", pair.draft, draft_ids, draft_cache, label=label, step=0, tokens=n - 1,
                            alone=True)
    token = run.target_sampler.pick(logits[0, -1])
    return target_cache, draft_cache, run.commit(Step(0, [token], ["target"]))


COPY_NGRAM_SIZES = (3, 2)  # the last token alone matches too often where the draft was right


def unsure_copy(sequence: list[int], logits: torch.Tensor, probs: torch.Tensor | None, below: float) -> int | None:
    """The token the context continues ``sequence``'s last 3 or 2 tokens with (methods/lookup.py),
    where the draft is unsure: its top-1 probability below ``below`` (``probs`` [V], the law it draws
    from at T > 0; at T = 0, None: the softmax of ``logits`` [V]); else None (always for below <= 0)."""
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
    its cache ends holding the sequence and tokens[:-1] (the last drafted token is never fed).
    copy_below: see ``unsure_copy``.
    """
    draft, sampler = run.pair.draft, run.draft_sampler
    pending = run.sequence[cache.length:]
    ids = torch.tensor([pending], device=draft.device)  # [1, pending]
    tokens, q, copies = [], [], []
    for i in range(gamma):
        logits = run.as_target_vocab(draft(ids, cache)[0, -1])  # [V]
        token, probs, copied = draft_token(sampler, logits, run.sequence + tokens if copy_below else None, copy_below)
        tokens.append(token)
        if copied:
            copies.append(i)
        if probs is not None:
            q.append(probs)
        ids = torch.tensor([[token]], device=draft.device)
    return tokens, (torch.stack(q) if q else None), copies


def streamed_window(run, cache, gamma: int):
    """Like draft_window, in one draft forward: the main stream's next token, then streams 1..gamma-1
    at the same position. The draft's cache ends holding exactly the committed sequence."""
    draft, sampler = run.pair.draft, run.draft_sampler
    streams = draft_streams(run.pair)
    pending = run.sequence[cache.length:]
    ids = torch.tensor([pending], device=draft.device)  # [1, pending]
    main, h0 = split_forward(draft, ids, cache, streams.first_layer)  # [1, pending, V_d], [1, pending, d]
    cache.length += len(pending)
    at = torch.tensor([[cache.length - 1]], device=draft.device)  # [1, 1]
    ahead = streams(draft, cache, h0[:, -1:], at)[0, 0, :gamma - 1]  # [gamma - 1, V_d]
    return sampler.draw(run.as_target_vocab(torch.cat([main[0, -1:], ahead])))  # from logits [gamma, V]


def lookahead_tree(streams, ahead: torch.Tensor | None, context: list[int], depth: int, top_k: int,
                   total_tokens: int, lookup: int) -> Tree:
    """The lookahead a draft forward checks after ``context``, at most ``depth`` levels deep: a tree
    from the streams' logits ahead [G, head rows] of the row before (stream_tree: top_k candidates
    per stream, the best total_tokens nodes; top_k = 1: a chain of the streams' argmaxes), plus up
    to ``lookup`` tokens copied from the context as one more branch (methods/lookup.py)."""
    tree = Tree([], [], [], [])
    if depth <= 0:
        return tree
    if ahead is not None:
        logp = torch.log_softmax(ahead[:depth].float(), -1).cpu()
        tree = stream_tree(logp, streams.to_target_ids, top_k, total_tokens)
    return graft(tree, copy_from_context(context, min(lookup, depth)))


def window_layout(start: int, unseen: int, tree: Tree):
    """Positions [1, U + N] and mask [U + N, U + N] of a draft window [unseen tokens, tree nodes]
    written from cache slot ``start``: the unseen tokens causal, each node seeing them and its
    ancestors, at the depth after the last unseen token (the tree's root)."""
    root = start + unseen - 1
    positions = torch.cat([torch.arange(start, root)[None], tree_positions(tree.depths, root)], dim=1)
    mask = torch.ones(unseen + len(tree.tokens), unseen + len(tree.tokens), dtype=torch.bool).tril()
    mask[unseen - 1:, unseen - 1:] = tree_mask(tree.parents)
    return positions, mask


def verified_window(run, cache, gamma: int, carried: torch.Tensor | None = None, top_k: int = 8,
                    total_tokens: int = 4, lookup: int = 8, overshoot: int = 0):
    """draft_window's window in fewer forwards: (tokens, q [n, V] or None, the lookahead tokens each
    draft forward checked and kept, the streams' logits [G, head rows] at the row that drafted each
    token).

    Each forward feeds the tokens the draft has not seen (committed ones, or the last drafted one),
    then a tree of lookahead from the streams of the row before (lookahead_tree); the streams ride
    in the same forward, on the last unseen row and every node (models/streams.py:
    forward_with_streams). The main rows walk the tree (verify.walk_tree): the accepted path and one
    more token. That row's streams give the next forward's lookahead. The cache keeps the unseen
    tokens and the path: it ends holding the sequence and tokens[:-1], as draft_window's does.

    carried: streams' logits to build the first forward's lookahead from, for the tokens after the
    unseen committed ones: those at the row that drafted the token the target replaced (``decode``
    carries them over), so that the first forward of a window can also yield more than one token.

    overshoot: 0, each forward checks only as much lookahead as fits in gamma tokens (the last
    forward of a window often checks none); 1, every forward checks its streams' full depth and
    the window keeps what the main stream accepted past gamma (gamma to gamma + G tokens, G the
    streams; still the token-by-token continuation, verified by the target with the rest).
    """
    draft, sampler = run.pair.draft, run.draft_sampler
    streams = draft_streams(run.pair)
    tokens, rows, after, checks, ahead = [], [], [], [], carried
    while len(tokens) < gamma:
        unseen = (run.sequence + tokens)[cache.length:]
        room = gamma - len(tokens) - 1  # lookahead that fits in the window after this forward's first token
        tree = lookahead_tree(streams, ahead, run.sequence + tokens, max(room, streams.num_streams * overshoot),
                              top_k, total_tokens, lookup)
        start, U = cache.length, len(unseen)
        positions, mask = window_layout(start, U, tree)
        ids = torch.tensor([unseen + tree.tokens], device=draft.device)  # [1, U + N]
        main, streamed = forward_with_streams(draft, streams, ids, cache, streams.num_streams,
                                              rows=list(range(U - 1, ids.shape[1])), positions=positions.to(draft.device),
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


def propose(run, cache, gamma: int, streams: int, carried, top_k: int, total_tokens: int, lookup: int,
            overshoot: int, copy_below: float):
    """One window as option ``streams`` says (see the module docstring): (tokens, q, with streams=2
    the streams' logits after each token (else None), the step's extras: draft_forwards, and
    lookahead (streams=2: each forward's lookahead tokens checked and kept) or copied_at
    (copy_below: the window positions copied from the context))."""
    if streams == 2:
        tokens, q, checks, after = verified_window(run, cache, gamma, carried, top_k, total_tokens, lookup, overshoot)
        return tokens, q, after, dict(draft_forwards=len(checks), lookahead=checks)
    if streams == 1:
        return (*streamed_window(run, cache, gamma), None, dict(draft_forwards=1))
    tokens, q, copies = draft_window(run, cache, gamma, copy_below)
    return tokens, q, None, dict(draft_forwards=gamma, **(dict(copied_at=copies) if copy_below else {}))


HOW = {0: "", 1: " in one forward, streams", 2: ", streams checked by the draft"}


def check_streams(pair, options):
    """streams=1 or 2 needs a draft with trained streams; streams=1 enough of them for gamma;
    overshoot only means something with streams=2, copy_below with streams=0."""
    if options.get("copy_below") and options.get("streams"):
        raise MirrorSDError("copy_below needs streams=0 (it replaces tokens the draft proposes one at a time), "
                            f"got streams={options.get('streams')}")
    if options.get("overshoot") and options.get("streams") != 2:
        raise MirrorSDError("overshoot=1 needs streams=2 (windows past gamma come from the draft checking its "
                            f"streams' lookahead), got streams={options.get('streams')}")
    if options.get("streams"):
        trained = draft_streams(pair).num_streams
        if options["streams"] == 1 and options["gamma"] > trained + 1:
            raise MirrorSDError(f"gamma must be at most {trained + 1} with streams=1 (the draft's {trained} "
                                f"trained streams + its main stream), got {options['gamma']}")


def decode(run, gamma: int, streams: int = 0, top_k: int = 8, total_tokens: int = 4, lookup: int = 8,
           overshoot: int = 0, copy_below: float = 0.0):
    pair = run.pair
    past_gamma = draft_streams(pair).num_streams * overshoot if streams == 2 else 0  # window tokens past gamma
    lookahead_slots = total_tokens + lookup + past_gamma if streams == 2 else 0  # a forward's tree, behind the window
    target_cache, draft_cache, first = prefill(run, extra_draft_slots=lookahead_slots, extra_target_slots=past_gamma)
    yield first
    carried = None  # streams=2: the draft streams' logits to take the next window's first lookahead from
    while not run.done:
        step = run.next_step
        committed = len(run.sequence)
        label = f"draft {'≥' if past_gamma else ''}{gamma} tokens{HOW[streams]}"
        draft, q, after, extras = pair.draft_lane.run(
            "draft", propose, run, draft_cache, gamma, streams, carried, top_k, total_tokens, lookup, overshoot,
            copy_below, label=label, step=step, tokens=gamma)
        window = torch.tensor([[run.sequence[-1], *draft]], device=pair.target.device)  # [1, len(draft) + 1]
        logits = pair.target_lane.run("verify", pair.target, window, target_cache,
                                      label=f"verify {len(draft) + 1} tokens", step=step, tokens=len(draft) + 1)
        verdict = verify(draft, q, logits[0], run.target_sampler)
        tokens, origins = verdict.committed(draft)
        target_cache.rollback(committed + verdict.accepted)  # last committed + accepted drafts
        draft_cache.rollback(min(draft_cache.length, committed + verdict.accepted))
        # A correction replaced the token the draft drafted at row r: the streams there (made without
        # that token) guess the tokens after it, the next window's first lookahead. After a bonus: none.
        carried = after[verdict.accepted] if after and verdict.accepted < len(draft) else None
        yield run.commit(Step(step, tokens, origins, proposed=draft, accepted=verdict.accepted, extras=extras))
