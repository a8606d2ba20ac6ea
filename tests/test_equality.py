"""Temperature 0: every method commits exactly the tokens vanilla decoding commits."""
import pytest

from conftest import EQUALITY_TOKENS
from mirror_sd import generate


@pytest.mark.parametrize("gamma", [4])
def test_sd_equals_vanilla_on_varied_prompts(embedded_pair, equality_prompts, vanilla_reference, gamma):
    assert len(equality_prompts) >= 20
    origins = set()
    for prompt, expected in zip(equality_prompts, vanilla_reference):
        out = generate(embedded_pair, prompt, method="sd", max_new_tokens=EQUALITY_TOKENS, gamma=gamma)
        assert out.error is None
        assert out.token_ids == expected, f"sd differs from vanilla on {prompt[:60]!r}"
        origins |= {o for step in out.trace.steps for o in step.origins}
    # the test draft must exercise every path of the acceptance rule
    assert {"accepted", "correction", "bonus"} <= origins


def test_default_pair_loads_and_sd_matches_vanilla():
    """load_pair() with no arguments: the embedded target and the default draft."""
    from mirror_sd import load_pair

    pair = load_pair()
    assert pair.draft is not None and pair.target.num_layers == 30
    vanilla = generate(pair, "Name a fruit.", method="vanilla", max_new_tokens=8)
    sd = generate(pair, "Name a fruit.", method="sd", max_new_tokens=8)
    assert sd.token_ids == vanilla.token_ids and sd.text == vanilla.text
