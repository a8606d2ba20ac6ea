"""Self-instruct prompts: user requests written by the target itself (the Magpie recipe).

An instruction-tuned model that is given its chat template only up to the start of a user turn
(default system prompt + ``<|im_start|>user\\n``) writes a user message of the kind it was tuned on,
then closes the turn with ``<|im_end|>`` (Xu et al., 2024, "Magpie: Alignment Data Synthesis from
Scratch by Prompting Aligned LLMs with Nothing"). Sampled at temperature 1, SmolLM2-135M-Instruct
writes everyday requests ("Can you help me prepare for a wedding party?"): the kind of prompt a user
types into the demo and the benchmark holds, which the corpora of :mod:`.prompts` (Wikipedia
extracts, chit-chat, maths templates) lack.

:func:`self_instruct_prompts` samples rounds of :data:`ROUND` requests (``round_size``). Round r draws from
``torch.Generator().manual_seed(seed * 1_000_003 + r)`` (tokens drawn by ``generate.sampler``), so a
seed, with its round size and sampler, gives the same prompts on the same software (and the
prompts for N are the first N of any larger run, which can go on from them: ``earlier``). A
sample is kept when the model closed the turn itself within :data:`MAX_TOKENS` tokens, has 4-80
words, holds no special token, is not a duplicate and shares no text with the benchmark prompts
(:class:`.prompts.BenchFilter`).
"""
from __future__ import annotations

import re

import torch
from tqdm import tqdm

from . import prompts as P
from .generate import SAMPLERS, generate_stream, sampler

ROUND = 64          # requests sampled together
MAX_TOKENS = 64     # a request the model has not closed by then is dropped
SOURCE = "self-instruct"


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template (default system prompt) up to the content of a user turn."""
    marker = "\x00MARK\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return tokenizer(text[:text.index(marker)], add_special_tokens=False)["input_ids"]


def rejection(text: str, closed: bool, bench: P.BenchFilter, seen: set[str]) -> str | None:
    """Why a sampled request is dropped (a stats key), or None to keep it."""
    if not closed:
        return "dropped_unfinished"
    if not 4 <= P.word_count(text) <= 80:
        return "dropped_length"
    if re.search(r"<\|[a-z_]+\|>", text):
        return "dropped_special_token"
    if P.normalise(text) in seen:
        return "dropped_duplicate"
    if bench.overlaps(text):
        return "dropped_bench_overlap"
    return None


def resume_point(earlier: list[dict], seed: int, round_size: int) -> tuple[int, int]:
    """(round, first sample) where sampling goes on after ``earlier``, the prompts of a run with this seed."""
    if not earlier:
        return 0, 0
    m = re.fullmatch(r"seed (-?\d+), round (\d+), sample (\d+)", earlier[-1]["ref"])
    if m is None or int(m[1]) != seed:
        raise ValueError(f"cannot go on from prompts sampled as {earlier[-1]['ref']!r} with seed {seed}")
    r, i = int(m[2]), int(m[3]) + 1
    return (r + 1, 0) if i >= round_size else (r, i)


def self_instruct_prompts(model, tokenizer, num_prompts: int, seed: int = 0, stats: dict | None = None,
                          round_size: int = ROUND, earlier: list[dict] | None = None,
                          sampling: str = SAMPLERS[0]) -> list[dict]:
    """``num_prompts`` single-turn prompts ({"id", "category", "source", "ref", "messages"}).

    earlier: the first prompts of a run with the same seed and round size (an earlier, smaller run):
    kept, and sampling goes on after the last of them, so the result equals a run from scratch
    (``stats`` then counts the new samples only). sampling: how tokens are drawn (``generate.sampler``).
    """
    prefix = user_turn_prefix(tokenizer)
    eos = tokenizer.eos_token_id
    bench = P.BenchFilter()
    st = stats if stats is not None else {}
    st.update(sampled=0, dropped_unfinished=0, dropped_length=0, dropped_special_token=0,
              dropped_duplicate=0, dropped_bench_overlap=0)
    out: list[dict] = list(earlier or [])[:num_prompts]
    seen: set[str] = {P.normalise(p["messages"][0]["content"]) for p in out}
    first_round, first_sample = resume_point(out, seed, round_size)
    bar = tqdm(total=num_prompts, initial=len(out), desc="self-instruct prompts", unit="prompt", mininterval=10)
    for r in range(first_round, first_round + 100 * (num_prompts // round_size + 1)):
        if len(out) >= num_prompts:
            break
        g = torch.Generator().manual_seed(seed * 1_000_003 + r)
        answers = dict(generate_stream(model, tokenizer, [prefix] * round_size, round_size, MAX_TOKENS,
                                       pick=sampler(g, sampling)))
        for i in range(first_sample if r == first_round else 0, round_size):
            ids = answers[i]
            text = tokenizer.decode(ids, skip_special_tokens=True).strip()
            st["sampled"] += 1
            why = rejection(text, ids[-1] == eos, bench, seen)
            if why:
                st[why] += 1
                continue
            seen.add(P.normalise(text))
            out.append(dict(id=f"instruction-{len(out) + 1:06d}", category="instruction", source=SOURCE,
                            ref=f"seed {seed}, round {r}, sample {i}", messages=P.user_turns(text)))
            bar.update(1)
            if len(out) == num_prompts:
                break
    bar.close()
    if len(out) < num_prompts:
        raise RuntimeError(f"self-instruct kept only {len(out)} of {st['sampled']} samples ({st})")
    return out
