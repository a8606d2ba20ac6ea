"""Temperature > 0: speculative decoding samples exactly the target's distribution.

On tiny random models (vocabulary 16) the exact law of generated tokens 2 and 3 is computed by
enumeration; thousands of seeded `sd` runs are compared to it with a chi-square test. A negative
control shows the test has the power to tell the target's law from the draft's.
"""
import pytest
import torch
from scipy.stats import chisquare

from mirror_sd import generate, load_pair
from mirror_sd.sampling import Sampler

PROMPT = "t1 t2 t3"
SAMPLES = 2000


def exact_law_of_tokens_2_and_3(model, prompt_ids, temperature, top_p) -> torch.Tensor:
    """P(x2, x3) [V, V] under the sampler's distribution, marginalised over x1."""
    sampler = Sampler(temperature, top_p)

    def next_probs(ids):
        with torch.no_grad():
            return sampler.probs(model(torch.tensor([ids]), model.new_cache(len(ids)))[0, -1])

    p1 = next_probs(prompt_ids)
    V = p1.shape[0]
    law = torch.zeros(V, V)
    for x1 in range(V):
        if p1[x1] == 0:
            continue
        p2 = next_probs(prompt_ids + [x1])
        for x2 in range(V):
            if p2[x2] > 0:
                law[x2] += p1[x1] * p2[x2] * next_probs(prompt_ids + [x1, x2])
    return law


def chi_square_p(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Chi-square goodness of fit; cells expecting fewer than 5 counts are pooled into one."""
    expected = law.flatten() * counts.sum()
    observed = counts.flatten().float()
    big = expected >= 5
    f_obs = torch.cat([observed[big], observed[~big].sum(0, keepdim=True)])
    f_exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    return float(chisquare(f_obs.numpy(), f_exp.numpy() * f_obs.sum().item() / f_exp.sum().item()).pvalue)


def sample_counts(pair, method, temperature, top_p, **options) -> torch.Tensor:
    """Counts [V, V] of generated tokens (x2, x3) over SAMPLES seeded runs."""
    counts = torch.zeros(16, 16, dtype=torch.long)
    for seed in range(SAMPLES):
        out = generate(pair, PROMPT, method=method, max_new_tokens=3, raw=True, temperature=temperature,
                       top_p=top_p, seed=seed, **options)
        counts[out.token_ids[1], out.token_ids[2]] += 1
    return counts


@pytest.mark.parametrize("draft,temperature,top_p", [("draft", 1.0, 1.0), ("draft", 0.7, 0.9),
                                                     ("reduced_draft", 1.0, 1.0)])
def test_sd_samples_the_target_distribution(tiny_dirs, draft, temperature, top_p):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs[draft]))
    prompt_ids = pair.encode(PROMPT, raw=True)
    law = exact_law_of_tokens_2_and_3(pair.target, prompt_ids, temperature, top_p)
    counts = sample_counts(pair, "sd", temperature, top_p, gamma=2)
    assert chi_square_p(counts, law) > 1e-3
    # negative control: the same test rejects a law the draft pulls towards (its own, unverified)
    full_draft = load_pair(target=str(tiny_dirs["draft"]), draft=None).target
    draft_law = exact_law_of_tokens_2_and_3(full_draft, prompt_ids, temperature, top_p)
    assert 0.5 * (law - draft_law).abs().sum() > 0.2  # the draft really differs from the target
    assert chi_square_p(counts, draft_law) < 1e-6


def test_same_seed_same_output(tiny_pair):
    for method in ("vanilla", "sd"):
        a = generate(tiny_pair, PROMPT, method=method, max_new_tokens=12, raw=True, temperature=1.0, seed=5)
        b = generate(tiny_pair, PROMPT, method=method, max_new_tokens=12, raw=True, temperature=1.0, seed=5)
        assert a.token_ids == b.token_ids
