"""Acceptance rules shared by every speculative method: losslessness is proved once, here.

* Greedy (temperature 0): accept the longest prefix of the draft that equals the target's argmax;
  the target's argmax at the first mismatch is the correction (or, if the whole draft matched, the
  argmax after it is the bonus). The committed tokens are exactly vanilla greedy decoding's.
* Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): accept draft token x_i ~ q_i with
  probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw the correction from
  norm(max(0, p_i - q_i)); if all are accepted draw the bonus from p_{gamma+1}. Each committed
  token is then distributed exactly as p given the prefix, whatever q is.
* Greedy tree walk (EAGLE-2, temperature 0): from the root follow the child that equals the
  target's argmax; the argmax where no child matches is the correction (after a leaf: the bonus).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..devices import to_device
from ..drafting.tree import Tree, tree_of_fields
from ..models.forwards import staged_for
from ..models.stages import MAX_WIDTH
from ..sampling import Sampler
from ..trace import SpanKind
from ..tree_rules import ancestors, greedy_path


@dataclass
class Verdict:
    accepted: int  # how many draft tokens were accepted
    token: int  # the correction (accepted < len(draft)) or the bonus token (all accepted)

    def committed(self, draft: list[int]) -> tuple[list[int], list[str]]:
        """The tokens this verdict commits and their origins."""
        last = "bonus" if self.accepted == len(draft) else "correction"
        return draft[:self.accepted] + [self.token], ["accepted"] * self.accepted + [last]


def verify_greedy(draft: list[int], target_logits: torch.Tensor) -> Verdict:
    """draft: gamma tokens; target_logits: [gamma + 1, V], row i scores the token after draft[:i]."""
    return verdict_of_picks(draft, target_logits.argmax(-1).tolist())


def verdict_of_picks(draft: list[int], picks: list[int]) -> Verdict:
    """``verify_greedy`` from the target's argmax at each of the gamma + 1 rows, already read."""
    n = 0
    while n < len(draft) and draft[n] == picks[n]:
        n += 1
    return Verdict(n, picks[n])


def verify_sampling(draft: list[int], q: torch.Tensor, p: torch.Tensor, sampler: Sampler) -> Verdict:
    """draft: gamma tokens drawn from q [gamma, V]; p: the target's [gamma + 1, V] distributions."""
    for i, x in enumerate(draft):
        if sampler.uniform() * q[i, x] < p[i, x]:  # u < p/q without dividing by a tiny q
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        total = residual.sum()
        return Verdict(i, sampler.sample(residual / total if total > 0 else p[i]))
    return Verdict(len(draft), sampler.sample(p[len(draft)]))


def verify(draft: list[int], q: torch.Tensor | None, target_logits: torch.Tensor, sampler: Sampler) -> Verdict:
    """The lossless rule for the sampler's temperature: greedy match at 0, else speculative sampling."""
    if sampler.greedy:
        return verify_greedy(draft, target_logits)
    return verify_sampling(draft, q, sampler.probs(target_logits), sampler)


def walk_tree_greedy(tokens: list[int], parents: list[int], logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy tree verification: from the root, follow the child whose token is the target's argmax.

    tokens, parents: a token and a parent (-1: the root) per node; logits [N + 1, V]: the target's
    logits for the token after each row's path (row 0 the root, node i at i + 1). Returns the
    accepted path (nodes, root excluded) and the target's argmax after it: the correction (or the
    bonus after a leaf). Children of one parent carry distinct tokens, so at most one matches, and
    every committed token is the target's argmax given the committed prefix: exactly vanilla greedy
    decoding's tokens.
    """
    return walk_tree_picks(tokens, parents, logits.argmax(-1))


def walk_tree_picks(tokens: list[int], parents: list[int], picks) -> tuple[list[int], int]:
    """``walk_tree_greedy`` from the target's argmax at each of the N + 1 rows (a tensor, or a list
    already read): the rule a tree verification stage runs (``tree_rules.greedy_path``), read once."""
    picks = torch.as_tensor(picks)
    rows = to_device([[0, *tokens], [0, *(p + 1 for p in parents)]], picks.device)  # [2, N + 1]: token, parent row
    accepted, deepest, path = greedy_path(ancestors(rows[1]), rows[0], rows[1], picks)
    read = torch.cat([accepted, picks.index_select(0, deepest), path]).tolist()
    return [row - 1 for row in read[3:3 + read[0]]], read[1]


def accept_tree(tree: Tree, logits: torch.Tensor, sampler: Sampler) -> tuple[list[int], int]:
    """The lossless rule over a verified tree; logits [N + 1, V], row i + 1 for node i (row 0: the root).

    Greedy: walk the children that match the target's argmax. Sampling: the tree is a sampled chain,
    checked with the speculative-sampling rule. Returns the accepted path (nodes) and the next token.
    """
    if sampler.greedy:
        return walk_tree_greedy(tree.tokens, tree.parents, logits)
    verdict = verify_sampling(tree.tokens, tree.q, sampler.probs(logits), sampler)
    return list(range(verdict.accepted)), verdict.token


def verify_stages(run, cache, tree, spec):
    """The target's stage set for ``verify_tree_on_stage``, where it can verify ``tree``: T = 0, the
    target on stages whose warm-up made ``spec``'s stages, and a tree within the widest stage; else None."""
    stages = staged_for(run.pair.target, cache, spec)
    return stages if run.target_sampler.greedy and len(tree.tokens) < MAX_WIDTH else None


def verify_tree_on_stage(run, stages, cache, tree, spec):
    """A greedy tree verification in one replay of the stage ``spec`` names (models/eagle_verify.py):
    the tree's rows copied in at once, the verdict read once. Returns the accepted path (nodes), the
    next token, and the path's features [A + 1, d], early features and hidden states (``spec``'s;
    views of the stage's output: use them before its next replay). The cache keeps the root and
    the path, as ``keep_path`` leaves it."""
    rows = [[run.sequence[-1], *tree.tokens], [0, *tree.depths], [0, *(p + 1 for p in tree.parents)]]
    verdict, *outputs = stages.run(spec.name, rows)
    return _kept(run, cache, verdict.tolist(), *outputs)


def drafted_verify_stages(run, cache, spec, total_tokens: int, copied: list[int]):
    """The target's stage set for ``draft_and_verify_on_stages``: T = 0, ``spec``'s stages made, a tree
    of ``total_tokens`` nodes within the widest stage, and nothing ``copied`` from the context this
    step (grafting it needs the tree on the host); else None."""
    if copied or not run.target_sampler.greedy or total_tokens >= MAX_WIDTH:
        return None
    return staged_for(run.pair.target, cache, spec)


def draft_and_verify_on_stages(run, ex, draft_lane, draft, nodes: int, stages, cache, spec, **draft_span):
    """One greedy step's draft and verification on stages, read once: ``draft`` (fn, *args) gives a
    tree's fields [1, 4, nodes] on the draft's device (``grow_fields``' layout), run on ``draft_lane``
    as span "draft" (``draft_span``: its label, step, tokens); the target lane then
    verifies it on the stage ``spec`` names in ``stages`` (``queue_drafted_verify``: the stage lays
    the tree's rows out and returns them with the verdict). Queued (``ex``: executors.Streams), the
    target's stream waits for the draft on a CUDA event, not the host, and the host waits for the
    GPU once, reading the verdict. Returns what ``read_drafted_verdict`` returns."""
    drafted = ex.start(draft_lane, SpanKind.DRAFT, *draft, **draft_span)
    verified = ex.start(run.target_lane, SpanKind.VERIFY, queue_drafted_verify, run, stages, drafted, spec,
                        label=f"verify {nodes + 1} tokens", step=draft_span.get("step"), tokens=nodes + 1)
    ex.finish(drafted, verified)  # the step's one wait for the GPU
    return read_drafted_verdict(run, cache, *verified.result())


def queue_drafted_verify(run, stages, fields, spec):
    """``verify_tree_on_stage`` for a greedy tree still on the device, as a one-stage draft left it
    (``tree_growth.grow_fields``' fields [1, 4, M]), replayed and not read: (the stage, the tree's
    size M, the verdict and the stage's other outputs, on the device)."""
    M = fields.shape[-1]
    stage = stages.stage(spec.name, stages.route(spec.name, M + 1))
    return stage, M, *stage.run_drafted(fields, run.sequence[-1])


def read_drafted_verdict(run, cache, stage, M: int, verdict, *outputs):
    """``queue_drafted_verify``'s verdict read (the wait for the GPU) and applied: the tree, then
    what ``verify_tree_on_stage`` returns."""
    read = verdict.tolist()
    drafted = read[stage.width + 2:]  # the stage's drafted buffer [4, W - 1], flattened
    tree = tree_of_fields(*(drafted[i * (stage.width - 1):i * (stage.width - 1) + M] for i in range(4)))
    return (tree, *_kept(run, cache, read, *outputs))


def _kept(run, cache, verdict: list[float], feats, early, hidden):
    """A tree stage's verdict (accepted nodes A, next token, the path's rows) applied: the cache
    keeps the root and the path (moved to slots n - 1 .. n - 1 + A); the path's nodes, the token,
    and the first A + 1 rows of the features, early features and hidden states."""
    accepted, token = int(verdict[0]), int(verdict[1])
    cache.length = len(run.sequence) + accepted
    kept = slice(0, accepted + 1)
    return ([int(row) - 1 for row in verdict[3:3 + accepted]], token, feats[kept],
            early[kept] if early is not None else None, hidden[kept] if hidden is not None else None)
