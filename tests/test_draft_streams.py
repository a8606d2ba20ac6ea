"""A draft with speculative streams: sd and mirror draft a window in one forward (streams=1), or sd
drafts it with the draft checking its own streams' lookahead (streams=2).

On the tiny pair, with random (untrained) streams on the draft's top layer: the window is what the
streams compute on a fresh cache, Mirror-SD's branch rollouts in one tree equal the same rollouts
done one branch at a time, both methods commit vanilla's tokens at T = 0, and at T > 0 mirror
with streams samples the target's law. With streams=2, sd drafts the token-by-token windows in
fewer forwards and samples the target's law. The own greedy continuations that streams learn for
streams=2 (train ss --labels own) equal decoding each position alone. The first two compare drafts made two ways, so they draft
in fp32: int8 drafting quantises each product's input as a whole (models/linear.py), so a row's
draft may differ in a near tie with the rows beside it. The others draft in int8, the default.
"""
import shutil
from contextlib import contextmanager

import pytest
import torch

from app.explain import explain
from mirror_sd import generate, load_pair
from mirror_sd.errors import MirrorSDError
from mirror_sd.models.streams import StreamConfig, Streams, draft_streams, split_forward
from mirror_sd.train.ss import greedy_continuations

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


def draft_alone(pair, context: list[int], n: int) -> list[int]:
    """The draft's n greedy tokens after ``context``, one forward per token on a fresh cache."""
    draft, tokens, ids = pair.draft, [], context
    cache = draft.new_cache(len(context) + n)
    with torch.no_grad():
        for _ in range(n):
            row = int(draft(torch.tensor([ids]), cache)[0, -1].argmax())
            tokens.append(int(draft.vocab_map[row]))
            ids = tokens[-1:]
    return tokens


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
            for accepted, root, tokens in (step.rendezvous.branches if step.rendezvous else []):
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
            hits += sum(bool(s.rendezvous and s.rendezvous.hit) for s in out.trace.steps[1:])
    assert hits > 0


def test_streams_need_a_draft_that_has_them(tiny_pair, streamed_pair):
    for method, streams in (("sd", 1), ("sd", 2), ("mirror", 1)):
        with pytest.raises(MirrorSDError, match="has none"):
            generate(tiny_pair, PROMPT, method=method, raw=True, streams=streams)
    with pytest.raises(MirrorSDError, match="gamma must be at most 4"):
        generate(streamed_pair, PROMPT, method="sd", raw=True, gamma=5, streams=1)
    with pytest.raises(MirrorSDError, match="between 0 and 1"):
        generate(streamed_pair, PROMPT, method="mirror", raw=True, streams=2)


@pytest.mark.parametrize("gamma", [3, 6])
def test_sd_with_streams_checked_by_the_draft_drafts_the_token_by_token_windows(streamed_pair, gamma):
    """streams=2: every window is the one streams=0 drafts, and some took fewer than gamma draft
    forwards (the main stream accepted lookahead). gamma may exceed the trained streams + 1: a
    forward checks at most as much lookahead as the streams give. The lookahead is a tree with a
    branch copied from the context ("t4 t4 t4 t4" repeats itself): the tree mask, positions and the
    cache's compaction of the walked path must keep the windows the token-by-token ones."""
    saved = 0
    with fp32_drafting(streamed_pair):
        for prompt in PROMPTS:
            expected = generate(streamed_pair, prompt, method="vanilla", max_new_tokens=24, raw=True).token_ids
            plain = generate(streamed_pair, prompt, method="sd", max_new_tokens=24, raw=True, gamma=gamma, streams=0)
            checked = generate(streamed_pair, prompt, method="sd", max_new_tokens=24, raw=True, gamma=gamma, streams=2)
            assert checked.error is None and checked.token_ids == plain.token_ids == expected
            assert [s.proposed for s in checked.trace.steps] == [s.proposed for s in plain.trace.steps]
            forwards = [s.draft.forwards for s in checked.trace.steps if s.proposed]
            assert [s.draft.forwards for s in plain.trace.steps if s.proposed] == [gamma] * len(forwards)
            assert all(1 <= f <= gamma for f in forwards)
            saved += sum(gamma - f for f in forwards)
            for step in checked.trace.steps[1:]:  # the app's step sentence says what the window cost
                f, checks = step.draft.forwards, step.draft.lookahead
                assert len(checks) == f and sum(kept + 1 for _, kept in checks) == gamma  # a token per forward + kept
                assert all(0 <= kept <= checked for checked, kept in checks)
                if 1 < f < gamma:
                    sentence = explain(checked.trace, step.index, {})
                    assert f"in {f} forwards, not {gamma}" in sentence
                    assert f"{', '.join(str(kept) for _, kept in checks)} kept)" in sentence
            assert all("checked by the draft" in s.label for s in checked.trace.spans if s.kind == "draft")
    assert saved > 0


@pytest.mark.slow
def test_sd_with_streams_checked_by_the_draft_samples_the_target_distribution(streamed_pair):
    """Tokens 2 and 3 come from the first window of at least 3 tokens; the draft's own walk of its
    lookahead tree (a draw from each main row, matched against the children there) must leave the
    law the target's."""
    prompt_ids = streamed_pair.encode(PROMPT, raw=True)
    outputs = []
    counts = sample_counts(streamed_pair, "sd", 1.0, 1.0, outputs=outputs, gamma=3, streams=2)
    assert sum(s.draft.forwards < 3 for out in outputs for s in out.trace.steps[1:]) > 100
    law = exact_joint_law(streamed_pair.target, prompt_ids, 1.0, 1.0, 3).sum(0)  # P(x2, x3)
    assert chi_square_p(counts, law) > 1e-3


def test_own_greedy_continuations_equal_decoding_each_position_alone(streamed_pair):
    """train ss --labels own: the chains of every position, computed together behind the sequence."""
    draft = streamed_pair.draft
    ids = streamed_pair.encode("t1 t2 t3 t4 t5 t6 t7 t8 t9", raw=True)
    at = [2, 3, 6, len(ids) - 1]
    chains = greedy_continuations(draft, ids, at, 4)
    for t, chain in zip(at, chains):
        assert chain == draft_alone(streamed_pair, ids[:t + 1], 4)


@pytest.mark.slow
def test_mirror_with_streams_samples_the_target_distribution(tiny_dirs, streamed_pair):
    """As in test_distribution, tokens 3 and 4: with gamma = 2 every window holds the draft's main
    stream token and its first stream's token, from a reused branch (a hit) or a fresh draft."""
    prompt_ids = streamed_pair.encode(PROMPT, raw=True)
    outputs = []
    counts = sample_counts(streamed_pair, "mirror", 1.0, 1.0, first=2, outputs=outputs, gamma=2, kappa=4,
                           branch_budget=6, streams=1)
    assert sum(bool(s.rendezvous.hit) for out in outputs for s in out.trace.steps[1:]) > 0
    law = exact_joint_law(streamed_pair.target, prompt_ids, 1.0, 1.0, 4).sum((0, 1))  # P(x3, x4)
    assert chi_square_p(counts, law) > 1e-3


def test_the_app_card_says_how_many_draft_tokens_each_draft_forward_gave(streamed_pair):
    import threading

    from app.cards import card_html
    from app.race import run_race

    for results in run_race(streamed_pair, "t1 t2 t3", ["vanilla", "sd"], threading.Event(), max_new_tokens=24,
                            options={"sd": dict(gamma=6, streams=2)}):
        pass
    metrics = results["sd"].metrics
    assert 1 < metrics["draft_tokens_per_forward"] <= 6
    assert f"{metrics['draft_tokens_per_forward']:.2f} draft tokens per draft forward" in card_html(results["sd"])
    assert "draft tokens per draft forward" not in card_html(results["vanilla"])
