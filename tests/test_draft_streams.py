"""A draft with speculative streams (streams=1): sd and mirror draft a window in one forward.

On the tiny pair, with random (untrained) streams on the draft's top layer: the window is what the
streams compute on a fresh cache, Mirror-SD's branch rollouts in one tree equal the same rollouts
done one branch at a time, both methods commit vanilla's tokens at T = 0, and at T > 0 mirror
with streams samples the target's law. The first two compare drafts made two ways, so they draft
in fp32: int8 drafting quantises each product's input as a whole (models/linear.py), so a row's
draft may differ in a near tie with the rows beside it. The others draft in int8, the default.
"""
import shutil
from contextlib import contextmanager

import pytest
import torch

from mirror_sd import generate, load_pair
from mirror_sd.errors import MirrorSDError
from mirror_sd.models.streams import StreamConfig, Streams, draft_streams, split_forward

from test_distribution import PROMPT, chi_square_p, exact_joint_law, sample_counts

PROMPTS = ["t1 t2 t3", "t9", "t4 t4 t4 t4", "t15 t0 t7"]


@pytest.fixture(scope="module")
def streamed_pair(tiny_dirs, tmp_path_factory):
    """The tiny target with its reduced-vocabulary draft, carrying 3 random streams on its top layer."""
    folder = tmp_path_factory.mktemp("streamed") / "draft"
    shutil.copytree(tiny_dirs["reduced_draft"], folder)
    draft = load_pair(target=str(tiny_dirs["target"]), draft=str(folder)).draft
    torch.manual_seed(0)
    streams = Streams(draft.args, StreamConfig(num_streams=3, stream_layers=1, rank=4))
    with torch.no_grad():
        for p in streams.lora_b.values():
            p.normal_(0, 0.5)  # nonzero adapters, so stream rows differ from main rows
        streams.embeddings.normal_(0, 1.0)
    streams.save(folder / "streams", dtype=torch.float32)
    return load_pair(target=str(tiny_dirs["target"]), draft=str(folder))


@contextmanager
def fp32_drafting(pair):
    before, pair.int8_drafting = pair.int8_drafting, False
    try:
        yield
    finally:
        pair.int8_drafting = before


def streams_alone(pair, context: list[int], gamma: int) -> list[int]:
    """The draft's greedy window after ``context``, computed on a fresh cache: main argmax, then streams."""
    draft, streams = pair.draft, draft_streams(pair)
    cache = draft.new_cache(64)
    with torch.no_grad():
        main, h0 = split_forward(draft, torch.tensor([context]), cache, streams.first_layer)
        cache.length = len(context)
        ahead = streams(draft, cache, h0[:, -1:], torch.tensor([[len(context) - 1]]))[0, 0, :gamma - 1]
    rows = torch.cat([main[0, -1:], ahead]).argmax(-1)
    return streams.to_target_ids(rows).tolist()


def test_sd_with_streams_drafts_what_the_streams_compute_and_equals_vanilla(streamed_pair):
    with fp32_drafting(streamed_pair):
        _check_sd_windows(streamed_pair)


def _check_sd_windows(streamed_pair):
    for prompt in PROMPTS:
        expected = generate(streamed_pair, prompt, method="vanilla", max_new_tokens=20, raw=True).token_ids
        out = generate(streamed_pair, prompt, method="sd", max_new_tokens=20, raw=True, gamma=4, streams=1)
        assert out.error is None and out.token_ids == expected
        sequence = streamed_pair.encode(prompt, raw=True)
        for step in out.trace.steps:
            if step.proposed:
                assert step.proposed == streams_alone(streamed_pair, sequence, 4)
            sequence = sequence + step.committed
        drafts = [s for s in out.trace.spans if s.kind == "draft"]
        assert drafts and all("streams" in s.label for s in drafts)


def test_mirror_branches_in_one_tree_equal_each_branch_alone(streamed_pair):
    """Every rolled-out branch (accepted r, root v) holds what the streams give after
    prefix + d1..dr + v, computed alone: the tree mask, positions and stream masks are right."""
    with fp32_drafting(streamed_pair):
        _check_branches(streamed_pair)


def _check_branches(streamed_pair):
    for prompt in PROMPTS[:2]:
        expected = generate(streamed_pair, prompt, method="vanilla", max_new_tokens=20, raw=True).token_ids
        out = generate(streamed_pair, prompt, method="mirror", max_new_tokens=20, raw=True, gamma=3, kappa=3,
                       branch_budget=6, streams=1)
        assert out.error is None and out.token_ids == expected
        sequence = streamed_pair.encode(prompt, raw=True)
        checked = 0
        for step in out.trace.steps:
            for accepted, root, tokens in (step.extras or {}).get("branches", []):
                context = sequence + step.proposed[:accepted] + [root]
                assert tokens == streams_alone(streamed_pair, context, 3)
                checked += 1
            sequence = sequence + step.committed
        assert checked >= 6


def test_mirror_with_streams_equals_vanilla(streamed_pair):
    hits = 0
    for prompt in PROMPTS:
        expected = generate(streamed_pair, prompt, method="vanilla", max_new_tokens=24, raw=True).token_ids
        for gamma, kappa, budget in [(4, 4, 8), (2, 16, 32)]:
            out = generate(streamed_pair, prompt, method="mirror", max_new_tokens=24, raw=True, gamma=gamma,
                           kappa=kappa, branch_budget=budget, streams=1)
            assert out.error is None and out.token_ids == expected
            hits += sum(bool(s.extras.get("hit")) for s in out.trace.steps[1:])
    assert hits > 0


def test_streams_need_a_draft_that_has_them(tiny_pair, streamed_pair):
    for method in ("sd", "mirror"):
        with pytest.raises(MirrorSDError, match="has none"):
            generate(tiny_pair, PROMPT, method=method, raw=True, streams=1)
    with pytest.raises(MirrorSDError, match="gamma must be at most 4"):
        generate(streamed_pair, PROMPT, method="sd", raw=True, gamma=5, streams=1)


def test_mirror_with_streams_samples_the_target_distribution(tiny_dirs, streamed_pair):
    """As in test_distribution, tokens 3 and 4: with gamma = 2 every window holds the draft's main
    stream token and its first stream's token, from a reused branch (a hit) or a fresh draft."""
    prompt_ids = streamed_pair.encode(PROMPT, raw=True)
    outputs = []
    counts = sample_counts(streamed_pair, "mirror", 1.0, 1.0, first=2, outputs=outputs, gamma=2, kappa=4,
                           branch_budget=6, streams=1)
    assert sum(bool(s.extras["hit"]) for out in outputs for s in out.trace.steps[1:]) > 0
    law = exact_joint_law(streamed_pair.target, prompt_ids, 1.0, 1.0, 4).sum((0, 1))  # P(x3, x4)
    assert chi_square_p(counts, law) > 1e-3
