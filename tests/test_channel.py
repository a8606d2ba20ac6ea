"""Mirror-SD's token channel as one stage (models/channel.py): the prefix's hidden states and the
channel (top candidates, their log-probs, the window tokens' log-probs) that ``token_channel``
computes an operation at a time, packed in one tensor, with the logit lens or a trained head of
either kind."""
import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.methods.mirror import exit_reader, target_ranges
from mirror_sd.models.channel import Channel, TokenChannel
from mirror_sd.models.forwards import forward, stage_cache
from conftest import channel_of
from test_exit_head import random_head

ATOL = 1e-5


@pytest.mark.parametrize("head", [None, 0, 24])  # the logit lens; a low-rank head; a SwiGLU head
@pytest.mark.parametrize("draft", ["draft", "reduced_draft"])  # the exit over the whole head, or the draft's rows
@pytest.mark.parametrize("window", [[4], [4, 8, 2], [3, 1, 4, 1, 5, 9, 2, 6, 5]])
def test_one_replay_gives_the_channel_token_channel_computes(tiny_dirs, draft, window, head):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs[draft]), target_device="cpu",
                     draft_device="cpu")
    target, kappa = pair.target, 3
    head = None if head is None else random_head(target, mlp=head)
    spec = TokenChannel(1, kappa, exit_reader(pair, head), target.args.vocab_size)
    plain, staged = target.new_cache(100), stage_cache({}, target, 100, [*target_ranges(pair, 1, head), spec])
    for cache in (plain, staged):
        forward(target, torch.tensor([[1, 5, 2, 9]]), cache)
    hidden, top_ids, top_logp, window_logp = channel_of(pair, plain, window, 1, kappa, head)
    got_hidden, got = staged.stages.run(spec.name, [window])
    got_ids, got_logp, got_window = got.top_ids, got.top_logp, got.window_logp
    assert got.packed.shape == (len(window), 2 * kappa + 1) and staged.length == plain.length == 4
    assert torch.allclose(got_hidden, hidden, atol=ATOL)
    assert torch.allclose(got_logp, top_logp, atol=ATOL) and torch.allclose(got_window, window_logp, atol=ATOL)
    apart = torch.ones_like(top_ids, dtype=torch.bool)  # candidates whose log-prob no neighbour ties
    gaps = (top_logp[:, :-1] - top_logp[:, 1:]).abs() > 10 * ATOL
    apart[:, :-1] &= gaps
    apart[:, 1:] &= gaps
    assert torch.equal(got_ids[apart], top_ids[apart])
    assert torch.equal(Channel.of(top_ids, top_logp, window_logp).top_ids, top_ids)  # ids survive the packing
    if head is not None:  # the head, not the lens, made the channel
        lens = target.new_cache(100)
        forward(target, torch.tensor([[1, 5, 2, 9]]), lens)
        lens_logp = channel_of(pair, lens, window, 1, kappa)[2]
        assert not torch.allclose(lens_logp, top_logp, atol=ATOL)
