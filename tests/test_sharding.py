"""A target sharded over devices by an accelerate device map decodes exactly as on one device.

No GPUs here: the map's two "devices" are ``cpu`` and ``cpu:0``, which torch keeps apart as
devices (so the model keeps two KV-cache parts and moves hidden states at the boundary) while both
are the CPU. The plan itself is accelerate's, for two CUDA GPUs with given memory budgets.
"""
import pytest
import torch

from mirror_sd import MirrorSDError, generate
from mirror_sd.devices import resolve_devices
from mirror_sd.models.llama import ShardedKVCache
from mirror_sd.models.loading import load_model
from mirror_sd.models.pair import load_pair
from mirror_sd.models.sharding import needs_sharding, plan, shard, weight_bytes

GPUS = [torch.device("cuda", 0), torch.device("cuda", 1)]
TWO_CPUS = {"model.embed_tokens": torch.device("cpu"), "model.layers.0": torch.device("cpu"),
            "model.layers.1": torch.device("cpu", 0), "model.norm": torch.device("cpu", 0),
            "lm_head": torch.device("cpu", 0)}


def test_accelerate_plans_whole_layers_in_order_within_budgets(tiny_dirs):
    model, _ = load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)
    layer = sum(p.numel() * 4 for p in model.model.layers[0].parameters())
    embed = model.model.embed_tokens.weight.numel() * 4
    device_map = plan(model, GPUS, [embed + 2 * layer + 64, 10 * weight_bytes(model)])  # 1 layer + room
    assert device_map["model.embed_tokens"] == GPUS[0] and device_map["model.layers.0"] == GPUS[0]
    assert device_map["model.layers.1"] == GPUS[1] and device_map["lm_head"] == GPUS[1]
    with pytest.raises(MirrorSDError, match="do not fit"):
        plan(model, GPUS, [layer, layer])


def test_sharded_target_matches_one_device_forward_rollback_and_keep(tiny_dirs):
    whole, _ = load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)
    sharded = shard(load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)[0], TWO_CPUS)
    assert sharded.layer_devices == [torch.device("cpu"), torch.device("cpu", 0)]
    caches = whole.new_cache(64), sharded.new_cache(64)
    assert isinstance(caches[1], ShardedKVCache) and len(caches[1].parts) == 2
    prompt = torch.tensor([[1, 5, 7, 2, 9]])
    for model, cache in zip((whole, sharded), caches):
        model.logits = [model(prompt, cache)]
        model.logits.append(model(torch.tensor([[3, 4, 6]]), cache, commit=False))  # a window, then
        cache.rollback(6)                                                             # keep one token
        model.logits.append(model(torch.tensor([[8]]), cache))
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)     # two branches
        model.logits.append(model(torch.tensor([[2, 3, 5]]), cache, tree_mask=tree, commit=False))
        cache.keep([7, 9], at=7)                                                      # root + branch 2
        model.logits.append(model(torch.tensor([[4]]), cache))
    for a, b in zip(whole.logits, sharded.logits):
        assert torch.allclose(a, b, atol=1e-6)
    assert caches[1].length == caches[0].length == 10


@pytest.mark.parametrize("method,options", [("sd", dict(gamma=3)), ("mirror", dict(gamma=3, kappa=2)),
                                            ("sd", dict(gamma=3, tree=6, branching=2)),  # trees: a tree mask and keep
                                            ("mirror", dict(gamma=3, kappa=2, tree=6))])
def test_methods_on_a_sharded_target_commit_vanillas_tokens(tiny_dirs, method, options):
    pair = load_pair(str(tiny_dirs["target"]), str(tiny_dirs["draft"]))
    reference = generate(pair, "t1 t2 t3", "vanilla", max_new_tokens=20, raw=True).token_ids
    shard(pair.target, TWO_CPUS)
    out = generate(pair, "t1 t2 t3", method, max_new_tokens=20, raw=True, **options)
    assert out.error is None and out.token_ids == reference
    assert generate(pair, "t1 t2 t3", "vanilla", max_new_tokens=20, raw=True).token_ids == reference
    with pytest.raises(MirrorSDError, match="sharded"):
        generate(pair, "t1 t2 t3", "eagle", max_new_tokens=4, raw=True)


def test_device_lists_are_checked():
    with pytest.raises(MirrorSDError, match="distinct CUDA GPUs"):
        resolve_devices("cpu,cpu")
    with pytest.raises(MirrorSDError, match="not available"):
        resolve_devices("cuda:0,cuda:1")
    assert resolve_devices("cpu") == [torch.device("cpu")]


def test_only_gpus_are_measured_for_sharding(tiny_dirs):
    model, _ = load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)
    assert not needs_sharding(model, torch.device("cpu"))
