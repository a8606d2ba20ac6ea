"""Speculative Streaming's greedy draft as one stage (models/stream_draft.py): the tree the streams'
pass gives an operation at a time (``methods.ss.draft_from_streams`` on the plain forward), from
one replay, with and without the next-token input."""
from types import SimpleNamespace

import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.methods.ss import draft_from_streams
from mirror_sd.models.forwards import forward, stage_cache, stream_layers
from mirror_sd.models.llama import Unstored
from mirror_sd.models.stream_draft import StreamDraft
from mirror_sd.models.streams import StreamConfig, Streams, split_forward, stream_mask, stream_ranges


def streams_for(model, next_token_rank: int) -> Streams:
    """Four untrained streams on the top layer, made to act (their LoRA and next-token map start at zero)."""
    torch.manual_seed(3)
    streams = Streams(model.args, StreamConfig(num_streams=4, stream_layers=1, rank=4,
                                               next_token_rank=next_token_rank))
    with torch.no_grad():
        for p in streams.lora_b.values():
            p.normal_(0, 0.1)
        streams.embeddings.normal_(0, 1.0)
        if next_token_rank:
            streams.token_b.normal_(0, 0.1)
    return streams.attach(model)


def stream_rows_after_a_prompt(target, streams: Streams):
    """A cache holding 4 prompt tokens, random stream rows 1..3 of its last token [1, 3, d], their
    positions [1, 3] and what they see [1, 3, 4 + 3]."""
    cache = target.new_cache(100)
    with torch.no_grad():  # the main stream is frozen (as in training)
        forward(target, torch.tensor([[1, 5, 2, 9]]), cache)
    torch.manual_seed(0)
    rows = torch.randn(1, 3, target.args.hidden_size)
    return cache, rows, torch.tensor([[4, 5, 6]]), stream_mask(torch.tensor([[3]]), cache.length, 3)


@pytest.mark.parametrize("next_token_rank", [0, 2])
@pytest.mark.parametrize("gamma,top_k,total_tokens", [(4, 2, 6), (3, 3, 9), (1, 1, 1)])
def test_one_replay_drafts_the_tree_the_streams_pass_gives(tiny_dirs, next_token_rank, gamma, top_k, total_tokens):
    target = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    streams = streams_for(target, next_token_rank)
    spec = StreamDraft(streams, gamma, top_k, total_tokens)
    plain, staged = target.new_cache(100), stage_cache({}, target, 100, [*stream_ranges(streams), spec])
    sequence = [1, 5, 2, 9, 4, 7]  # the main row: 4 (the cache's last slot); 7: the step's next token
    trees = []
    for cache in (plain, staged):
        forward(target, torch.tensor([sequence[:-2]]), cache)
        _, h0 = split_forward(target, torch.tensor([sequence[-2:-1]]), cache, streams.first_layer)  # [1, 1, d]
        cache.length += 1
        run = SimpleNamespace(pair=SimpleNamespace(target=target), sequence=sequence,
                              draft_sampler=SimpleNamespace(greedy=True))
        trees.append(draft_from_streams(run, streams, cache, h0, gamma, top_k, total_tokens, copied=[]))
    expected, got = trees
    assert (got.tokens, got.parents, got.depths) == (expected.tokens, expected.parents, expected.depths)
    assert got.scores == pytest.approx(expected.scores, abs=1e-4)
    assert len(got.tokens) == min(total_tokens, top_k + top_k * top_k * (gamma - 1))
    assert staged.length == plain.length == 5


def test_merged_layers_compute_the_layers_with_the_adapters_and_follow_the_streams(tiny_dirs):
    """Stream rows through the streams' merged copies of the top layers (what inference runs) give
    what the layers with the adapters beside their maps give (what training runs), and the copies
    are remade when the streams' parameters change."""
    target = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    streams = streams_for(target, next_token_rank=0)
    cache, rows, positions, mask = stream_rows_after_a_prompt(target, streams)
    a, b = streams.first_layer, target.num_layers
    win = target.window(None, 3, positions, mask)

    def adapted_and_merged():
        with torch.inference_mode():
            return (target.forward_layers(rows, Unstored(cache), win, a, b, stack=streams.adapted_layers(target)),
                    target.forward_layers(rows, Unstored(cache), win, a, b, stack=streams.layers_for(target, a, b)))

    adapted, merged = adapted_and_merged()
    assert torch.allclose(merged, adapted, atol=1e-4)
    with torch.inference_mode():
        bare = target.forward_layers(rows, Unstored(cache), win, a, b)
    assert not torch.allclose(adapted, bare, atol=1e-3)  # the adapters act
    with torch.enable_grad():  # training: the adapters beside the maps, and gradients reach them
        stream_layers(target, streams, rows, cache, positions, mask).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in streams.lora_a.values())
    with torch.no_grad():
        for p in streams.lora_b.values():
            p.mul_(2)
    adapted_again, merged_again = adapted_and_merged()
    assert torch.allclose(merged_again, adapted_again, atol=1e-4)
    assert not torch.allclose(adapted_again, adapted, atol=1e-3)
    assert cache.length == 4  # the stream rows stored nothing


def test_streams_loaded_in_inference_mode_merge_too(tiny_dirs):
    """Streams made inside ``torch.inference_mode`` (their tensors keep no version count) still give
    their merged layers."""
    target = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    with torch.inference_mode():
        streams = streams_for(target, next_token_rank=0)
        assert next(streams.parameters()).is_inference()
        merged = streams.merged_layers(target)
    assert len(merged) == target.num_layers - streams.first_layer
    assert streams.merged_layers(target) is merged  # made once


def test_a_sharded_model_runs_the_streams_with_their_adapters(tiny_dirs):
    """A sharded model's layers sit on several devices, so its stream rows run the adapters, not merged
    copies, and give what the same streams give on the model whole."""
    from test_sharding import TWO_CPUS

    from mirror_sd.models.loading import load_model
    from mirror_sd.models.sharding import shard

    whole = load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)[0]
    sharded = shard(load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)[0], TWO_CPUS)
    got = []
    for target in (whole, sharded):
        streams = streams_for(target, next_token_rank=0)
        cache, rows, positions, mask = stream_rows_after_a_prompt(target, streams)
        with torch.inference_mode():
            got.append(stream_layers(target, streams, rows, cache, positions, mask))
        assert cache.length == 4  # the stream rows stored nothing
    assert torch.allclose(got[1], got[0], atol=1e-4) and "_merged" not in streams.__dict__


def test_a_streams_stage_runs_fewer_operations_merged_than_with_the_adapters(tiny_dirs, monkeypatch):
    """mirror_sd/tools/stage_ops.py counts what a stage's body dispatches: the streams' stage over their merged
    layers runs about what the target's own top layer and head run, and fewer than with the adapters."""
    from mirror_sd.tools.stage_ops import stage_rows

    pair = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu", graphs="on")
    streams = streams_for(pair.target, next_token_rank=0)
    stage_cache(pair.stage_sets, pair.target, 100, stream_ranges(streams))

    def launching():
        return {row["stage"]: row["launching"] for row in stage_rows(pair)}

    merged = launching()
    a, b = streams.first_layer, pair.target.num_layers
    def with_the_adapters(self, model, a, b):
        return self.adapted_layers(model)[a - self.first_layer:b - self.first_layer]

    monkeypatch.setattr(Streams, "layers_for", with_the_adapters)
    adapted = launching()
    assert merged[f"layers {a}-{b} + head"] > 0 and merged[f"streams {a}-{b}"] < adapted[f"streams {a}-{b}"]
    assert merged[f"streams {a}-{b}"] <= merged[f"layers {a}-{b} + head"] + 12  # the streams' rows laid out, their head
