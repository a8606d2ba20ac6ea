"""Context lookup (prompt lookup decoding, Saxena 2023): draft tokens copied from the context.

Answers often repeat what the context already holds: a name or a sentence from the prompt's
passage, a phrase of an earlier turn, a pattern of their own. So find the latest earlier place
where the sequence's last n tokens occur (n = 3, else 2, else 1) and propose the tokens that followed it.
It costs no model work, only a scan of the token ids. The tree methods (eagle, ss) graft the
copied tokens onto their draft tree as one more branch (``tree.graft``), Mirror-SD copies a window
after a miss, and the token-by-token draft copies where it is unsure; the target verifies them with
the rest, so decoding stays lossless: a copied token is committed only where it equals the
target's own choice.
"""
from __future__ import annotations

# Longest first; the last token alone matches too (docs/experiments/lookup.md#matching-the-last-token-alone).
NGRAM_SIZES = (3, 2, 1)


def copy_from_context(sequence: list[int], max_tokens: int, ngram_sizes: tuple[int, ...] | None = None) -> list[int]:
    """Up to ``max_tokens`` tokens that followed the latest earlier occurrence of the sequence's last
    n tokens (n from ``ngram_sizes``, longest first); [] when there is none or max_tokens is 0."""
    if max_tokens < 1:
        return []
    for n in ngram_sizes or NGRAM_SIZES:  # read at call time, so a script may try other sizes
        if len(sequence) <= n:
            continue
        tail = sequence[-n:]
        for start in range(len(sequence) - n - 1, -1, -1):  # latest first; the tail itself excluded
            if sequence[start] == tail[0] and sequence[start:start + n] == tail:
                return sequence[start + n:start + n + max_tokens]
    return []
