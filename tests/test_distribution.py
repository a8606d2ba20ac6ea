"""Temperature > 0: speculative decoding samples exactly the target's distribution.

On tiny random models (vocabulary 16) the exact law of generated tokens 2 and 3 is computed by
enumeration; thousands of seeded `sd` runs are compared to it with a chi-square test. A negative
control shows the test has the power to tell the target's law from the draft's.
"""
import pytest
import torch
from scipy.stats import chisquare

from conftest import needs_native_bf16
from mirror_sd import generate, load_pair
from mirror_sd.sampling import Sampler

PROMPT = "t1 t2 t3"
# Seeded runs per chi-square test (sd, mirror, eagle, ss and the copies use this count). Enough:
# with the tiny pair, the tests' negative controls (the draft's own law) already fail at p < 1e-300
# from 1,000 runs (sd and mirror, measured 2026-11-26).
SAMPLES = 1200


def exact_joint_law(model, prompt_ids, temperature, top_p, n: int) -> torch.Tensor:
    """P(x1, ..., xn) [V] * n under the sampler's distribution, by enumerating every prefix."""
    sampler = Sampler(temperature, top_p)
    V = model.args.vocab_size
    joint = torch.ones(())
    prefixes = torch.tensor([prompt_ids])  # [V^k, P + k]: every continuation of length k
    for _ in range(n):
        with torch.no_grad():
            probs = sampler.probs(model(prefixes, None)[:, -1])  # [V^k, V]
        joint = (joint.reshape(-1, 1) * probs).reshape(*joint.shape, V)
        prefixes = torch.cat([prefixes.repeat_interleave(V, 0), torch.arange(V).repeat(len(prefixes))[:, None]], 1)
    return joint


def exact_law_of_tokens_2_and_3(model, prompt_ids, temperature, top_p) -> torch.Tensor:
    """P(x2, x3) [V, V], marginalised over x1."""
    return exact_joint_law(model, prompt_ids, temperature, top_p, 3).sum(0)


def chi_square_p(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Chi-square goodness of fit; cells expecting fewer than 5 counts are pooled into one."""
    expected = law.flatten() * counts.sum()
    observed = counts.flatten().float()
    big = expected >= 5
    f_obs = torch.cat([observed[big], observed[~big].sum(0, keepdim=True)])
    f_exp = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    return float(chisquare(f_obs.numpy(), f_exp.numpy() * f_obs.sum().item() / f_exp.sum().item()).pvalue)


def sample_counts(pair, method, temperature, top_p, first: int = 1, outputs=None, prompt: str = PROMPT,
                  **options) -> torch.Tensor:
    """Counts [V, V] of generated tokens (x_{first+1}, x_{first+2}) over SAMPLES seeded runs."""
    counts = torch.zeros(16, 16, dtype=torch.long)
    for seed in range(SAMPLES):
        out = generate(pair, prompt, method=method, max_new_tokens=first + 2, raw=True, temperature=temperature,
                       top_p=top_p, seed=seed, **options)
        counts[out.token_ids[first], out.token_ids[first + 1]] += 1
        if outputs is not None:
            outputs.append(out)
    return counts


@pytest.mark.parametrize("draft,temperature,top_p,dtype", [
    ("draft", 1.0, 1.0, "fp32"),
    pytest.param("draft", 1.0, 1.0, "bf16", marks=needs_native_bf16),  # the exact bf16 target (models/exact.py)
    pytest.param("draft", 0.7, 0.9, "fp32", marks=pytest.mark.slow),
    pytest.param("reduced_draft", 1.0, 1.0, "fp32", marks=pytest.mark.slow)])
def test_sd_samples_the_target_distribution(tiny_dirs, draft, temperature, top_p, dtype):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs[draft]), dtype=dtype)
    prompt_ids = pair.encode(PROMPT, raw=True)
    law = exact_law_of_tokens_2_and_3(pair.target, prompt_ids, temperature, top_p)
    counts = sample_counts(pair, "sd", temperature, top_p, gamma=2)
    assert chi_square_p(counts, law) > 1e-3
    # negative control: the same test rejects a law the draft pulls towards (its own, unverified)
    full_draft = load_pair(target=str(tiny_dirs["draft"]), draft=None, dtype=dtype).target
    draft_law = exact_law_of_tokens_2_and_3(full_draft, prompt_ids, temperature, top_p)
    assert 0.5 * (law - draft_law).abs().sum() > 0.2  # the draft really differs from the target
    assert chi_square_p(counts, draft_law) < 1e-6


def test_same_seed_same_output(tiny_pair):
    for method in ("vanilla", "sd"):
        a = generate(tiny_pair, PROMPT, method=method, max_new_tokens=12, raw=True, temperature=1.0, seed=5)
        b = generate(tiny_pair, PROMPT, method=method, max_new_tokens=12, raw=True, temperature=1.0, seed=5)
        assert a.token_ids == b.token_ids


def test_mirror_samples_the_target_distribution_through_reused_branches(tiny_dirs):
    """gamma = 1 and kappa = V: every possible (accepted, token) outcome is a branch, so from the
    second step on every window is a reused branch continuation; tokens 3 and 4 come from those."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    prompt_ids = pair.encode(PROMPT, raw=True)
    outputs = []
    counts = sample_counts(pair, "mirror", 1.0, 1.0, first=2, outputs=outputs, gamma=1, kappa=16, branch_budget=32)
    steps = [s for out in outputs for s in out.trace.steps if s.index >= 2]
    assert steps and all(s.rendezvous.hit for s in outputs[0].trace.steps if s.index >= 1)
    assert sum(not s.rendezvous.fallback for s in steps) == len(steps)  # windows came from branches
    law = exact_joint_law(pair.target, prompt_ids, 1.0, 1.0, 4).sum((0, 1))  # P(x3, x4)
    assert chi_square_p(counts, law) > 1e-3
    draft_law = exact_joint_law(load_pair(target=str(tiny_dirs["draft"]), draft=None).target, prompt_ids,
                                1.0, 1.0, 4).sum((0, 1))
    assert chi_square_p(counts, draft_law) < 1e-6
