"""sd verifies every window as a tree (methods/sd.py): a chain is a tree of one path
(``Proposal.window``), and verifying it so gives the chain rule's verdict (methods/verify.py:
``verify``), on the plain forward and on the target's tree verification stage alike, and leaves
the target's cache as the chain's causal forward and rollback leave it."""
from types import SimpleNamespace

import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.drafting import Proposal
from mirror_sd.methods.sd import verify_tree
from mirror_sd.methods.verify import accept_tree, verify
from mirror_sd.models.eagle_verify import TreeVerify
from mirror_sd.models.forwards import FULL, forward, stage_cache
from mirror_sd.sampling import Sampler
from mirror_sd.trace import DraftWork

PREFIX = [1, 5, 2, 9, 4, 7]
V = 16


def chain(tokens: list[int], q=None) -> Proposal:
    return Proposal(tokens, q, DraftWork(forwards=len(tokens)))


def test_a_chain_is_a_tree_of_one_path():
    window = chain([3, 1, 4]).window()
    assert (window.tokens, window.parents, window.depths) == ([3, 1, 4], [-1, 0, 1], [1, 2, 3])
    assert window.children() == {-1: [0], 0: [1], 1: [2]}
    assert window.committed([0, 1, 2], 9) == ([3, 1, 4, 9], ["accepted"] * 3 + ["bonus"])
    assert window.committed([0], 9) == ([3, 9], ["accepted", "correction"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_tree_rule_on_a_chain_is_the_chain_rule(temperature):
    """accept_tree over the one-path tree: the accepted count and next token of ``verify``, from
    the same draws (the same seed), over windows accepted in full, in part and not at all."""
    torch.manual_seed(0)
    for trial in range(40):
        n = 1 + trial % 5
        logits = torch.randn(n + 1, V) * 3
        q = torch.softmax(torch.randn(n, V), -1) if temperature else None
        picks = logits.argmax(-1).tolist()
        draft = [picks[i] if i < trial % (n + 1) else (picks[i] + 1) % V for i in range(n)]  # agrees up to a point
        verdict = verify(draft, q, logits, Sampler(temperature, seed=trial))
        path, token = accept_tree(chain(draft, q).window(), logits, Sampler(temperature, seed=trial))
        assert (path, token) == (list(range(verdict.accepted)), verdict.token)


@pytest.mark.parametrize("agree", [0, 2, 4])
def test_a_chain_verified_as_a_tree_on_the_plain_forward_and_the_stage_is_the_causal_verification(tiny_dirs, agree):
    """sd's verify_tree of a chain, on a plain cache and on the target's tree verification stage:
    the verdict of the causal forward's ``verify``, and the cache it leaves after its rollback."""
    target = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    run = SimpleNamespace(pair=SimpleNamespace(target=target), sequence=PREFIX, target_sampler=Sampler(0.0))
    causal = target.new_cache(64)
    forward(target, torch.tensor([PREFIX[:-1]]), causal)
    draft, ids = [], torch.tensor([PREFIX])
    scratch = target.new_cache(64)
    for i in range(4):  # the target's greedy tokens, the ones after ``agree`` changed
        token = int(forward(target, ids, scratch)[0, -1].argmax())
        draft.append(token if i < agree else (token + 1) % V)
        ids = torch.tensor([[draft[-1]]])
    window_logits = forward(target, torch.tensor([[PREFIX[-1], *draft]]), causal)[0]  # [5, V]
    verdict = verify(draft, None, window_logits, run.target_sampler)
    causal.rollback(len(PREFIX) + verdict.accepted)
    assert verdict.accepted == agree
    for cache in (target.new_cache(64), stage_cache({}, target, 64, [FULL, TreeVerify()])):
        forward(target, torch.tensor([PREFIX[:-1]]), cache)
        path, token = verify_tree(run, cache, chain(draft).window())
        assert (path, token, cache.length) == (list(range(verdict.accepted)), verdict.token, causal.length)
        assert torch.allclose(cache.k[:, :, :, :cache.length], causal.k[:, :, :, :causal.length], atol=1e-5)
        assert torch.allclose(cache.v[:, :, :, :cache.length], causal.v[:, :, :, :causal.length], atol=1e-5)
