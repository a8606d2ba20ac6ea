"""EAGLE's greedy tree verification as one stage (models/eagle_verify.py): the accepted path, next
token, features and kept keys and values that ``methods.eagle.verify_tree`` gives on the plain
forward, from one replay."""
from types import SimpleNamespace

import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.drafting.tree import Tree
from mirror_sd.methods.eagle import verify_tree
from mirror_sd.models.eagle import stage_ranges
from mirror_sd.models.eagle_verify import TreeVerify
from mirror_sd.models.forwards import forward, stage_cache
from mirror_sd.sampling import Sampler

PREFIX = [1, 5, 2, 9, 4, 7]
ATOL = 1e-5


def greedy_continuation(target, n: int) -> list[int]:
    """The target's next n tokens after PREFIX, greedily."""
    cache, ids, out = target.new_cache(64), torch.tensor([PREFIX]), []
    for _ in range(n):
        out.append(int(forward(target, ids, cache)[0, -1].argmax()))
        ids = torch.tensor([[out[-1]]])
    return out


def trees(g: list[int]) -> dict[str, Tree]:
    """Trees over the target's greedy tokens g (a path the target accepts) and other tokens:
    the whole path accepted, part of it, none, and a deep copied chain hanging off the root."""
    other = [(t + 3) % 16 for t in g]
    return {
        "all": Tree([g[0], other[0], g[1], other[1], g[2]], [-1, -1, 0, 0, 2], [1, 1, 2, 2, 3], [0.0] * 5),
        "part": Tree([other[0], g[0], other[1], g[1], other[2]], [-1, -1, 1, 1, 3], [1, 1, 2, 2, 3], [0.0] * 5),
        "none": Tree([other[0], other[1]], [-1, 0], [1, 2], [0.0] * 2),
        "deep": Tree([other[0], *g[:6]], [-1, -1, 1, 2, 3, 4, 5], [1, 1, 2, 3, 4, 5, 6], [0.0] * 7),
        "chain": Tree(g[:7], [-1, 0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7], [0.0] * 7),  # as deep as 8 rows go
    }


@pytest.mark.parametrize("early_layers", [(), (1,)])
@pytest.mark.parametrize("case", ["all", "part", "none", "deep", "chain"])
def test_one_replay_verifies_as_the_plain_forward_and_walk_do(tiny_dirs, early_layers, case):
    target = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    tree = trees(greedy_continuation(target, 7))[case]
    spec = TreeVerify(early_layers)
    plain = target.new_cache(100)
    staged = stage_cache({}, target, 100, [*stage_ranges(target, early_layers), spec])
    run = SimpleNamespace(pair=SimpleNamespace(target=target), sequence=PREFIX, target_sampler=Sampler(0.0))
    results = []
    for cache in (plain, staged):
        forward(target, torch.tensor([PREFIX[:-1]]), cache)
        results.append((verify_tree(run, cache, tree, early_layers), cache.length))
    ((path, token, feats, early), length), ((got_path, got_token, got_feats, got_early), got_length) = results
    assert (got_path, got_token, got_length) == (path, token, length)
    assert {"all": 3, "part": 2, "none": 0, "deep": 6, "chain": 7}[case] == len(path)
    assert torch.allclose(got_feats, feats, atol=ATOL)
    assert (got_early is None) == (early is None) and (early is None or torch.allclose(got_early, early, atol=ATOL))
    assert torch.allclose(staged.k[:, :, :, :length], plain.k[:, :, :, :length], atol=ATOL)  # the path, compacted
    assert torch.allclose(staged.v[:, :, :, :length], plain.v[:, :, :, :length], atol=ATOL)


@pytest.mark.parametrize("case", ["all", "part", "none"])
def test_ss_verifies_on_the_stage_with_the_hidden_state_its_streams_start_from(tiny_dirs, case):
    """``ss``'s verification (``hidden_at`` the streams' first layer): the same path and token, and
    the last accepted row's hidden state entering that layer, as split_forward gives it."""
    from mirror_sd.methods.ss import verify_tree as ss_verify
    from mirror_sd.models.streams import StreamConfig, Streams, stream_ranges

    target = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    streams = Streams(target.args, StreamConfig(num_streams=3, stream_layers=1, rank=4)).attach(target)
    tree = trees(greedy_continuation(target, 6))[case]
    plain = target.new_cache(100)
    staged = stage_cache({}, target, 100, [*stream_ranges(streams), TreeVerify(hidden_at=streams.first_layer)])
    run = SimpleNamespace(pair=SimpleNamespace(target=target), sequence=PREFIX, target_sampler=Sampler(0.0))
    results = []
    for cache in (plain, staged):
        forward(target, torch.tensor([PREFIX[:-1]]), cache)
        results.append((ss_verify(run, streams, cache, tree, 3, one_forward=False), cache.length))
    ((path, token, h0), length), ((got_path, got_token, got_h0), got_length) = results
    assert (got_path, got_token, got_length) == (path, token, length)
    assert got_h0.shape == h0.shape == (1, 1, target.args.hidden_size) and torch.allclose(got_h0, h0, atol=ATOL)


@pytest.mark.parametrize("case", ["all", "part", "none", "deep"])
def test_a_tree_left_on_the_device_verifies_as_one_read_from_the_host(tiny_dirs, case):
    """``queue_drafted_verify`` then ``read_drafted_verdict``: the tree as a one-stage draft leaves
    it (grow_fields' fields [1, 4, M]), laid out by the stage's body: the same path, token, features
    and kept cache as the plain forward's, and the tree itself read back with the verdict."""
    from mirror_sd.methods.verify import queue_drafted_verify, read_drafted_verdict
    from mirror_sd.models.forwards import staged_for

    target = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    tree = trees(greedy_continuation(target, 6))[case]
    spec = TreeVerify((1,))
    plain = target.new_cache(100)
    staged = stage_cache({}, target, 100, [*stage_ranges(target, (1,)), spec])
    run = SimpleNamespace(pair=SimpleNamespace(target=target), sequence=PREFIX, target_sampler=Sampler(0.0))
    for cache in (plain, staged):
        forward(target, torch.tensor([PREFIX[:-1]]), cache)
    path, token, feats, early = verify_tree(run, plain, tree, (1,))
    fields = torch.tensor([[tree.tokens, tree.parents, tree.depths, [-0.25 * i for i in range(len(tree.tokens))]]],
                          dtype=torch.float64)
    launched = queue_drafted_verify(run, staged_for(target, staged, spec), fields, spec)
    got_tree, got_path, got_token, got_feats, got_early, _ = read_drafted_verdict(run, staged, *launched)
    assert (got_tree.tokens, got_tree.parents, got_tree.depths) == (tree.tokens, tree.parents, tree.depths)
    assert got_tree.scores == [-0.25 * i for i in range(len(tree.tokens))]
    assert (got_path, got_token, staged.length) == (path, token, plain.length)
    assert torch.allclose(got_feats, feats, atol=ATOL) and torch.allclose(got_early, early, atol=ATOL)
    assert torch.allclose(staged.k[:, :, :, :plain.length], plain.k[:, :, :, :plain.length], atol=ATOL)
