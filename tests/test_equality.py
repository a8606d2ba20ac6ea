"""Temperature 0: every method commits exactly the tokens vanilla decoding commits."""
import pytest

from conftest import EQUALITY_TOKENS, needs_native_bf16
from mirror_sd import generate


@pytest.mark.parametrize("gamma", [4])
def test_sd_equals_vanilla_on_varied_prompts(embedded_pair, equality_prompts, vanilla_reference, gamma):
    assert len(equality_prompts) >= 12
    origins, saved, copies_accepted = set(), 0, 0
    # one prompt in four each: token by token, the streams' window, the draft checking its streams,
    # token by token with copies from the context where the draft is unsure
    variants = [dict(streams=0), dict(streams=1), dict(streams=2), dict(streams=0, copy_below=0.9)]
    for i, (prompt, expected) in enumerate(zip(equality_prompts, vanilla_reference)):
        options = variants[i % 4]
        out = generate(embedded_pair, prompt, method="sd", max_new_tokens=EQUALITY_TOKENS, gamma=gamma, **options)
        assert out.error is None
        assert out.token_ids == expected, f"sd with {options} differs from vanilla on {prompt[:60]!r}"
        origins |= {o for step in out.trace.steps for o in step.origins}
        if options["streams"] == 2:
            saved += sum(gamma - step.draft.forwards for step in out.trace.steps[1:])
        if "copy_below" in options:
            copies_accepted += sum(j < step.accepted for step in out.trace.steps[1:] for j in step.draft.copied_at)
    # the shipped draft exercises every path of the acceptance rule, its streams save draft forwards,
    # and the target accepts tokens copied from the context
    assert {"accepted", "correction", "bonus"} <= origins and saved > 0 and copies_accepted > 0


def test_default_pair_loads_and_sd_matches_vanilla():
    """load_pair() with no arguments: the embedded target and the default draft."""
    from mirror_sd import load_pair

    pair = load_pair()
    assert pair.draft is not None and pair.target.num_layers == 30
    vanilla = generate(pair, "Name a fruit.", method="vanilla", max_new_tokens=8)
    sd = generate(pair, "Name a fruit.", method="sd", max_new_tokens=8)
    assert sd.token_ids == vanilla.token_ids and sd.text == vanilla.text


def test_reduced_vocabulary_draft_equals_vanilla(tiny_dirs):
    """A draft whose head covers 8 of 16 tokens (vocab_map) still commits vanilla's tokens."""
    from mirror_sd import load_pair

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]))
    assert pair.draft.vocab_map.tolist() == [0, 2, 3, 5, 7, 8, 11, 13]
    for prompt in ["t1 t2 t3", "t9", "t4 t4 t4 t4", "t15 t0 t7"]:
        expected = generate(pair, prompt, method="vanilla", max_new_tokens=24, raw=True).token_ids
        out = generate(pair, prompt, method="sd", max_new_tokens=24, raw=True, gamma=3)
        assert out.token_ids == expected
        assert all(t in pair.draft.vocab_map.tolist() for s in out.trace.steps for t in s.proposed)


def test_the_draft_s_picks_are_the_argmax_over_its_rows_laid_on_the_target_s_vocabulary():
    """draft_argmax (greedy drafting) picks what to_target_vocab(...).argmax(-1) does, ties included:
    a reduced head (its vocab_map ascending), a head with padding rows and one with fewer rows."""
    import torch

    from mirror_sd.sampling import draft_argmax, to_target_vocab

    gen = torch.Generator().manual_seed(0)
    vocab_map = torch.tensor([0, 2, 3, 5, 7, 8, 11, 13])
    for rows, vmap in ((8, vocab_map), (20, None), (12, None)):
        logits = torch.randint(0, 3, (50, rows), generator=gen).float()  # many ties
        assert torch.equal(draft_argmax(logits, vmap, 16), to_target_vocab(logits, vmap, 16).argmax(-1))


def test_a_swapped_draft_is_the_one_that_drafts_and_swapping_back_reuses_the_first(tiny_dirs):
    """ModelPair.use_draft (research/ swaps drafts with it): after a swap, sd and mirror draft with the new
    draft (a reduced head proposes only its own tokens; mirror's early-exit rows follow its head)
    and still commit vanilla's tokens; swapping back by name gives the very model loaded first."""
    from mirror_sd import load_pair

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    first, first_name = pair.draft, pair.draft_name
    expected = generate(pair, "t1 t2 t3", method="vanilla", max_new_tokens=24, raw=True).token_ids

    pair.use_draft(str(tiny_dirs["reduced_draft"]))
    assert pair.draft is not first and pair.draft.vocab_map.tolist() == [0, 2, 3, 5, 7, 8, 11, 13]
    for method, options in (("sd", {}), ("mirror", dict(lookup=0))):
        out = generate(pair, "t1 t2 t3", method=method, max_new_tokens=24, raw=True, gamma=3, **options)
        assert out.token_ids == expected
        assert all(t in pair.draft.vocab_map.tolist() for s in out.trace.steps if s.index > 0 for t in s.proposed)
    assert pair.early_exit_rows.shape[0] == 8  # the target's head rows of the reduced draft's tokens

    pair.use_draft(first_name)
    assert pair.draft is first and pair.early_exit_rows is None  # a full head: no rows of its own
    assert generate(pair, "t1 t2 t3", method="mirror", max_new_tokens=24, raw=True, lookup=0).token_ids == expected


@needs_native_bf16
def test_every_method_equals_vanilla_in_exact_bf16(bf16_pair, equality_prompts):
    """Where the CPU computes bf16 natively (where dtype="auto" may pick it): the exact bf16 target
    (models/exact.py) keeps the promise for chains (sd, mirror) and trees (eagle, ss) alike, on one
    prompt of each Spec-Bench category."""
    for prompt in equality_prompts[::2]:
        expected = generate(bf16_pair, prompt, method="vanilla", max_new_tokens=EQUALITY_TOKENS).token_ids
        for method in ("sd", "eagle", "ss", "mirror"):
            out = generate(bf16_pair, prompt, method=method, max_new_tokens=EQUALITY_TOKENS)
            assert out.error is None
            assert out.token_ids == expected, f"{method} differs from vanilla in bf16 on {prompt[:60]!r}"
