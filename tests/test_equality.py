"""Temperature 0: every method commits exactly the tokens vanilla decoding commits."""
import pytest

from conftest import EQUALITY_TOKENS
from mirror_sd import generate


@pytest.mark.parametrize("gamma", [4])
def test_sd_equals_vanilla_on_varied_prompts(embedded_pair, equality_prompts, vanilla_reference, gamma):
    assert len(equality_prompts) >= 20
    origins = set()
    for i, (prompt, expected) in enumerate(zip(equality_prompts, vanilla_reference)):
        streams = i % 2  # every other prompt: the window from the draft's speculative streams
        out = generate(embedded_pair, prompt, method="sd", max_new_tokens=EQUALITY_TOKENS, gamma=gamma,
                       streams=streams)
        assert out.error is None
        assert out.token_ids == expected, f"sd differs from vanilla on {prompt[:60]!r}"
        origins |= {o for step in out.trace.steps for o in step.origins}
    # the shipped draft exercises every path of the acceptance rule
    assert {"accepted", "correction", "bonus"} <= origins


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
