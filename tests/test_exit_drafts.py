"""Early-exit drafts (``exit:N``, models/exit_draft.py): the target's first N layers read by its exit head
for layer N. They are what the trade-off command sizes drafts with; every draft-model method stays
lossless with each: vanilla's tokens at T = 0, the target's law at T > 0 (chi-square)."""
import pytest
import torch

from mirror_sd import MirrorSDError, generate, load_pair
from mirror_sd.models.exit_head import EarlyExit, attach_exit_head, embedded_exit_heads, new_exit_head
from mirror_sd.sampling import to_target_vocab

from conftest import EQUALITY_TOKENS
from test_distribution import PROMPT, chi_square_p, exact_law_of_tokens_2_and_3, sample_counts


@pytest.fixture(scope="module")
def exit_pair():
    """The embedded target with its smallest early-exit draft."""
    return load_pair(draft=f"exit:{min(embedded_exit_heads())}")


def test_the_shipped_family_spans_a_tenth_to_most_of_the_target():
    """Exit heads (so exit:N drafts) ship for six layers of the embedded target's 30, from a tenth of
    its layers to three quarters."""
    layers = sorted(embedded_exit_heads())
    assert len(layers) >= 6 and layers[0] <= 3 and layers[-1] >= 22


def test_an_exit_draft_reads_the_targets_first_layers_through_its_head(exit_pair):
    """The draft's log-probs are the target's early exit at layer N through the same head and rows
    (what Mirror-SD's token channel reads at that exit), laid over the target's vocabulary."""
    pair = exit_pair
    draft, target = pair.draft, pair.target
    layer = draft.num_layers
    ids = torch.tensor([pair.encode("Name three colours.")])
    pair.int8_drafting = False  # the draft in the target's fp32 products, to compare with its exit
    try:
        with torch.inference_mode():
            got = torch.log_softmax(draft(ids, None)[0], dim=-1)  # [T, rows]
    finally:
        pair.int8_drafting = True
    with torch.inference_mode():
        hidden = target.forward_layers(target.embed(ids), None, target.window(None, ids.shape[1]), 0, layer)
        rows = target.lm_head.weight[draft.vocab_map]
        expected = EarlyExit(target, rows, pair.exit_heads[layer], draft.vocab_map)(hidden)[0]
    assert torch.allclose(got, expected, atol=1e-4)
    full = to_target_vocab(got, draft.vocab_map, target.args.vocab_size)
    assert torch.isinf(full).sum(-1).eq(target.args.vocab_size - len(draft.vocab_map)).all()


@pytest.mark.parametrize("method,options", [("sd", dict(gamma=4)), ("mirror", {}),
                                            pytest.param("sd", dict(gamma=3, tree=8), marks=pytest.mark.slow),
                                            pytest.param("mirror", dict(gamma=3, branch_budget=4),
                                                         marks=pytest.mark.slow)])
def test_exit_drafts_commit_vanillas_tokens(exit_pair, equality_prompts, method, options):
    pair = exit_pair
    smallest, largest = min(embedded_exit_heads()), max(embedded_exit_heads())
    for prompt in equality_prompts[::6]:
        expected = generate(pair, prompt, method="vanilla", max_new_tokens=EQUALITY_TOKENS).token_ids
        for layer in (smallest, largest):
            pair.use_draft(f"exit:{layer}")
            out = generate(pair, prompt, method=method, max_new_tokens=EQUALITY_TOKENS, **options)
            assert out.error is None and out.token_ids == expected, f"{method} {options} with exit:{layer}"
    pair.use_draft(f"exit:{smallest}")


def test_exit_drafts_are_refused_with_one_clear_line(tiny_dirs):
    with pytest.raises(MirrorSDError, match="1 <= N < 30"):
        load_pair(draft="exit:30")
    with pytest.raises(MirrorSDError, match="needs an early-exit head trained for layer 1"):
        load_pair(target=str(tiny_dirs["target"]), draft="exit:1")


@pytest.fixture(scope="module")
def tiny_exit_pair(tiny_dirs):
    """The tiny target (2 layers) with a random SwiGLU exit head at layer 1 and the draft exit:1: half
    the target, a bigger draft than the tiny pair's own."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    torch.manual_seed(5)
    head = new_exit_head(pair.target, 1, mlp=16)
    torch.nn.init.normal_(head.down.weight, std=0.3)
    attach_exit_head(pair, head)
    pair.use_draft("exit:1")
    return pair


@pytest.mark.parametrize("method", ["sd", "mirror"])
def test_an_exit_draft_samples_the_target_distribution(tiny_exit_pair, method):
    pair = tiny_exit_pair
    prompt_ids = pair.encode(PROMPT, raw=True)
    law = exact_law_of_tokens_2_and_3(pair.target, prompt_ids, 1.0, 1.0)
    counts = sample_counts(pair, method, 1.0, 1.0, gamma=3)
    assert chi_square_p(counts, law) > 1e-3
    draft_law = exact_law_of_tokens_2_and_3(pair.draft, prompt_ids, 1.0, 1.0)
    assert chi_square_p(counts, draft_law) < 1e-6  # the test can tell the draft's law from the target's
