"""The target's generation loop for the training data: the greedy answers of ``data``, the sampled
requests of self-instruct prompts (:mod:`.instruct`).

:func:`generate_stream` batches continuously: rows leave the batch as their answers finish and new
prompts join it, so the batch stays full instead of idling on its longest answer.
"""
from __future__ import annotations

import torch


def _left_pad(t, length: int, dim: int):
    """Zero-pad tensor t on the left of dimension dim up to length."""
    missing = length - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class _Rows:
    """The decoding state of a batch of rows: KV cache, attention mask, next tokens and positions."""

    def __init__(self, model, prompts: list[list[int]], ids: list[int], pad: int, pick):
        from transformers import DynamicCache

        width = max(len(x) for x in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, x in enumerate(prompts):  # left padding
            input_ids[i, width - len(x):] = torch.tensor(x, dtype=torch.long)
            mask[i, width - len(x):] = 1
        input_ids, self.mask = input_ids.to(model.device), mask.to(model.device)
        pos = (self.mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = DynamicCache(config=model.config)
        out = model(input_ids=input_ids, attention_mask=self.mask, position_ids=pos,
                    past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.pick = pick                            # logits [B, V] -> next tokens [B]
        self.next = pick(out.logits[:, -1])         # the token not yet recorded, per row
        self.pos = pos[:, -1] + 1                   # its position
        self.ids = list(ids)                        # which prompt each row is

    def merge(self, other: "_Rows"):
        """Append other's rows (caches and masks left-padded to a common length)."""
        length = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([_left_pad(mine.keys, length, 2), _left_pad(theirs.keys, length, 2)])
            mine.values = torch.cat([_left_pad(mine.values, length, 2), _left_pad(theirs.values, length, 2)])
        self.mask = torch.cat([_left_pad(self.mask, length, 1), _left_pad(other.mask, length, 1)])
        self.next = torch.cat([self.next, other.next])
        self.pos = torch.cat([self.pos, other.pos])
        self.ids += other.ids

    def keep(self, rows: list[int]):
        """Drop every row not in rows; then drop leading columns that no row attends to."""
        if len(rows) < len(self.ids):
            idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
            self.cache.batch_select_indices(idx)
            self.mask, self.next, self.pos = self.mask[idx], self.next[idx], self.pos[idx]
            self.ids = [self.ids[j] for j in rows]
        used = self.mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start >= 8:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
            self.mask = self.mask[:, start:]

    def step(self, model):
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.ids), 1))], dim=1)
        out = model(input_ids=self.next[:, None], attention_mask=self.mask, position_ids=self.pos[:, None],
                    past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.next = self.pick(out.logits[:, -1])
        self.pos = self.pos + 1


def greedy(logits):
    return logits.argmax(-1)


SAMPLERS = ("multinomial", "inverse-cdf")  # how self-instruct draws tokens (--sampler)


def sampler(generator, method: str = SAMPLERS[0]):
    """Sampling at temperature 1 from the full distribution, with random numbers from a seeded CPU
    torch.Generator (so a seed draws the same tokens whatever device computed the logits, up to rounding).

    multinomial: ``torch.multinomial`` on the CPU (the draws of the project's earlier data sets); it
    moves the [B, V] probabilities to the CPU.
    inverse-cdf: one uniform number per row, looked up in the cumulative probabilities where the
    logits are: the same law, other draws, and no copy of the probabilities, so far faster on a GPU
    (measured: docs/experiments/devices.md#the-third-gpu-session-data-and-the-shipped-draft).
    """
    def multinomial(logits):  # [B, V] -> [B]
        return torch.multinomial(logits.float().softmax(-1).cpu(), 1, generator=generator)[:, 0].to(logits.device)

    def inverse_cdf(logits):  # [B, V] -> [B]
        cdf = logits.float().softmax(-1).cumsum(-1)  # [B, V]
        u = torch.rand(len(logits), 1, generator=generator).to(logits.device) * cdf[:, -1:]  # [B, 1]
        return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(logits.shape[-1] - 1)

    return {"multinomial": multinomial, "inverse-cdf": inverse_cdf}[method]


def generate_stream(model, tokenizer, prompts: list[list[int]], batch_size: int, max_new_tokens: int,
                    pick=greedy):
    """Greedy answers to prompts (token id lists), yielded as (index, answer_ids) when each finishes.

    A greedy loop over the model's forward with a KV cache (token for token what ``generate`` does
    with do_sample=False), with continuous batching: finished rows leave the batch at once, and when
    half of the batch has left, the next prompts (in the given order) are prefilled and join it, so
    the batch stays full instead of idling on its longest answer. Answers end with the eos token
    unless cut at max_new_tokens. ``pick`` chooses each next token from the logits (``sampler(g)``
    samples instead).
    """
    eos = tokenizer.eos_token_id
    pad = next((t for t in (tokenizer.pad_token_id, eos) if t is not None), 0)  # masked out: any id serves
    refill_below = max(1, batch_size // 2)
    queue = 0
    rows: _Rows | None = None
    answers: dict[int, list[int]] = {}
    with torch.inference_mode():
        while True:
            active = len(rows.ids) if rows else 0
            if queue < len(prompts) and active <= refill_below:
                take = list(range(queue, min(len(prompts), queue + batch_size - active)))
                queue += len(take)
                new = _Rows(model, [prompts[i] for i in take], take, pad, pick)
                for i in take:
                    answers[i] = []
                if rows is None:
                    rows = new
                else:
                    rows.merge(new)
            if rows is None:
                return
            keep = []
            for j, t in enumerate(rows.next.tolist()):
                i = rows.ids[j]
                answers[i].append(t)
                if t == eos or len(answers[i]) >= max_new_tokens:
                    yield i, answers.pop(i)
                else:
                    keep.append(j)
            if not keep:
                rows = None
                continue
            rows.keep(keep)
            rows.step(model)


def _generate_batch(model, tokenizer, batch: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy answers for one batch (all at once), via generate_stream."""
    out: list[list[int]] = [[] for _ in batch]
    for i, ans in generate_stream(model, tokenizer, batch, len(batch), max_new_tokens):
        out[i] = ans
    return out


def _generate_batch_hf(model, tokenizer, batch: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """The same with transformers' generate (kept as a reference for tests; slower on long tails)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    width = max(len(x) for x in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        input_ids[i, width - len(x):] = torch.tensor(x)
        mask[i, width - len(x):] = 1
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             do_sample=False, temperature=None, top_p=None, top_k=None,
                             eos_token_id=eos, pad_token_id=pad)
    answers = []
    for row in out[:, width:].tolist():
        if eos in row:
            row = row[:row.index(eos) + 1]
        answers.append(row)
    return answers
