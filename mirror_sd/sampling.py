"""Turning logits into the distribution a method samples from, and drawing from it.

Every method uses the same :class:`Sampler` settings for target and draft, so "the target's
distribution" means one thing everywhere: softmax(logits / temperature), restricted to the top-p
nucleus and renormalised. Temperature 0 means greedy (argmax). Random draws use a CPU
``torch.Generator`` seeded from the user's seed, so a run is reproducible on any device.
"""
from __future__ import annotations

import torch


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Distribution [..., V] (fp32, on CPU) that this sampler draws tokens from."""
        logits = logits.float().cpu()
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_p < 1.0:
            probs = top_p_filter(probs, self.top_p)
        return probs

    def sample(self, probs: torch.Tensor) -> int:
        """One token from a distribution [V]."""
        if self.greedy:
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def sample_rows(self, probs: torch.Tensor) -> list[int]:
        """One token from each row of probs [n, V], each drawn independently (one call for all rows)."""
        if self.greedy:
            return probs.argmax(-1).tolist()
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0].tolist()

    def pick(self, logits: torch.Tensor) -> int:
        """One token from logits [V]: argmax at temperature 0, else a draw from probs(logits)."""
        if self.greedy:
            return int(logits.argmax())
        return self.sample(self.probs(logits))

    def draw(self, logits: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
        """One token per row of logits [n, V], each drawn independently: (tokens, probs [n, V]),
        probs None at temperature 0 (argmax)."""
        if self.greedy:
            return logits.argmax(-1).tolist(), None
        probs = self.probs(logits)
        return self.sample_rows(probs), probs

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
    sorted_probs[mass_before >= top_p] = 0.0
    filtered = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return filtered / filtered.sum(-1, keepdim=True)


def draft_argmax(logits: torch.Tensor, vocab_map: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """The target id of each row's most likely draft token, for logits [..., V_head]: what
    ``to_target_vocab(...).argmax(-1)`` gives, without laying the rows over the target's vocabulary
    first (a vocab_map in ascending order, as the drafts' are, keeps ties on the same token)."""
    if vocab_map is not None:
        return vocab_map.to(logits.device)[logits.argmax(-1)]
    return logits[..., :vocab_size].argmax(-1)


def to_target_vocab(logits: torch.Tensor, vocab_map: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Logits of a draft head [..., V_head] laid out on the target's vocabulary [..., vocab_size].

    A reduced-vocabulary head is scattered through its vocab_map (tokens it cannot propose get
    -inf); a full head only differs in padding rows, which are trimmed or padded with -inf.
    """
    if vocab_map is not None:
        full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))
        return full.index_copy_(-1, vocab_map.to(logits.device), logits)
    if logits.shape[-1] >= vocab_size:
        return logits[..., :vocab_size]
    pad = logits.new_full((*logits.shape[:-1], vocab_size - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
