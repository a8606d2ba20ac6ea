"""EAGLE's greedy draft as one stage (models/eagle_tree.py): the tree the head grows an operation at a
time, from one replay; and an EAGLE step on stages leaves the host a few dozen operations."""
import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.drafting.tree import read_trees
from mirror_sd.methods.eagle import draft_tree, head_step
from mirror_sd.models.eagle import EagleHead, HeadStages, attach_head
from mirror_sd.models.eagle_tree import TreeDraft
from mirror_sd.models.forwards import stage_cache
from mirror_sd.models.stages import Stage

VOCAB_MAP = torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 11, 13])  # the head's rows: 10 of the tiny target's 16 tokens


@pytest.fixture(scope="module")
def tiny_head(tiny_dirs):
    """The tiny target with an untrained head reading the early features of layer 1 (fuse weights
    random, so that they count)."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    torch.manual_seed(0)
    head = EagleHead.from_target(pair.target, VOCAB_MAP, early_layers=(1,))
    torch.nn.init.normal_(head.fuse.weight, std=0.5)
    return pair, head.eval().requires_grad_(False)


def pairs(head, T: int, seed: int):
    """T random (feature, token, early feature) pairs, as a target would give them."""
    g = torch.Generator().manual_seed(seed)
    d = head.args.hidden_size
    return torch.randn(T, d, generator=g), torch.randint(0, 16, (T,), generator=g), torch.randn(T, d, generator=g)


@pytest.mark.parametrize("depth,top_k,total_tokens", [(3, 3, 8), (4, 2, 6), (1, 4, 3), (2, 16, 20)])
def test_one_replay_drafts_the_tree_the_head_grows_step_by_step(tiny_head, depth, top_k, total_tokens):
    """After 3 committed pairs, 5 pending ones and the tree after them: the stage's tree (nodes,
    parents, depths, scores) and the pairs' keys and values are those of the head run op by op
    (``methods.eagle.draft_tree``), top_k past the head's 10 rows included."""
    _, head = tiny_head
    spec = TreeDraft(depth, top_k, total_tokens, early=True)
    plain = head.new_cache(100)
    stage = stage_cache({}, head, 100, [HeadStages.name(True), spec], stage_set=HeadStages)
    committed, pending = pairs(head, 3, seed=1), pairs(head, 5, seed=2)
    for cache in (plain, stage):
        head_step(head, cache, *committed[:2], early=committed[2])
    last = head_step(head, plain, *pending[:2], early=pending[2])[-1]
    expected = draft_tree(head, plain, last, 9, depth, top_k, total_tokens)  # n = 9: the head's cache holds 8
    fields = stage.stages.run(spec.name, pending[1][None], feats=pending[0][None], early=pending[2][None])
    got = read_trees(fields)[0]
    assert stage.length == 3  # the stage moves no length: the caller commits the pairs
    assert (got.tokens, got.parents, got.depths) == (expected.tokens, expected.parents, expected.depths)
    assert got.scores == pytest.approx(expected.scores, abs=1e-3)
    assert len(got.tokens) == min(total_tokens, sum(min(top_k, 10) ** min(j, 2) for j in range(1, depth + 1)))
    assert torch.allclose(stage.k[:, :, :, :8], plain.k[:, :, :, :8], atol=1e-5)  # the pairs' entries
    assert torch.allclose(stage.v[:, :, :, :8], plain.v[:, :, :, :8], atol=1e-5)


def test_an_eagle_step_on_stages_leaves_the_host_a_few_dozen_operations(tiny_dirs, tiny_head, monkeypatch):
    """mirror_sd/tools/host_ops.py: around the stages, an EAGLE step runs a few dozen operations (its draft and
    its verification one replay each); the plain forwards run every layer's and every tree level's
    one by one."""
    from mirror_sd.tools.host_ops import count_ops, replay_outside_the_count

    monkeypatch.setattr(Stage, "replay", replay_outside_the_count(Stage.replay))
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None, graphs="on")
    attach_head(pair, tiny_head[1])
    on_stages = count_ops(pair, "eagle", 16, prompt="t1 t2 t3", raw=True)
    pair.graphs = "off"
    plain = count_ops(pair, "eagle", 16, prompt="t1 t2 t3", raw=True)
    assert on_stages["ops_per_step"] < 40 and 10 * on_stages["ops_per_step"] < plain["ops_per_step"]
