"""``dtype="auto"`` (the default): bf16 where the processor computes it natively and it checks out
at load, fp32 everywhere else.

On a CPU with AMX or AVX512-BF16 a bf16 target streams half the bytes of an fp32 one and its extra
verification rows are nearly free, so speculation pays more there; elsewhere bf16 is emulated,
slower than fp32, and on a GPU its rounding is not row-invariant (docs/devices.md). So auto picks
bf16 only when all three hold:

* the processor names a native bf16 instruction set (:func:`native_bf16`: the CPU flags
  ``amx_bf16`` or ``avx512_bf16``), and both lanes are CPU lanes;
* the exact bf16 target (models/exact.py) passes :func:`rows_agree`: a window verified at several
  row counts, chain and tree, gives bit for bit the logits of the one-row forwards vanilla runs;
* :func:`bf16_speedup`: its forwards (one row, and a window) time faster than the fp32 target's,
  the fastest of a few of each, interleaved.

Otherwise fp32, as before. :class:`Choice` says which dtype ran and why, for the CLI, the bench's
report and the app's device line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..devices import DEFAULT_DTYPE

NATIVE_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic
CHECK_TEXT = ("The committee met on Tuesday to review the budget, and after a long discussion about roads, "
              "schools and the new library, it agreed to")
ROW_COUNTS = (2, 3, 5, 8)  # window widths verified against the one-row forwards
TIMED_ROUNDS = 5  # interleaved rounds of bf16 and fp32 forwards in the speed check


@dataclass(frozen=True)
class Choice:
    """The dtype a pair runs in and why, e.g. "bf16: native avx512_bf16, self-check passed"."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return short_name(str(self.dtype))

    def __str__(self) -> str:
        return f"{self.name}: {self.reason}"


def short_name(dtype: str) -> str:
    """A dtype's short name, as the CLI, reports and pages write it: "torch.bfloat16" -> "bf16",
    "float32" -> "fp32"."""
    return dtype.removeprefix("torch.").replace("bfloat16", "bf16").replace("float", "fp")


def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The first of NATIVE_FLAGS this processor names, or None (no such flag, or no /proc/cpuinfo)."""
    try:
        flags = set(Path(cpuinfo).read_text().split())
    except OSError:
        return None
    return next((flag for flag in NATIVE_FLAGS if flag in flags), None)


def choose(load, tokenizer, devices) -> tuple[Choice, object]:
    """(the choice, the target loaded in its dtype). ``load(dtype)`` loads the target model in
    ``dtype`` (exact in bf16 on CPU), ``tokenizer()`` its tokenizer; ``devices``: the lanes'
    devices. Where bf16 is a candidate the target is loaded in both dtypes and one is kept."""
    if any(device.type != "cpu" for device in devices):
        return Choice(DEFAULT_DTYPE, "not a CPU lane"), load(DEFAULT_DTYPE)
    flag = native_bf16()
    if flag is None:
        return Choice(DEFAULT_DTYPE, "no native bf16"), load(DEFAULT_DTYPE)
    bf16 = load(torch.bfloat16)
    ids = torch.tensor([tokenizer()(CHECK_TEXT)["input_ids"]], device=bf16.device)
    with torch.no_grad():
        try:
            differs = rows_agree(bf16, ids)
        except RuntimeError as e:  # a bf16 kernel this build or CPU lacks after all
            differs = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
        if differs:
            return Choice(DEFAULT_DTYPE, f"bf16 self-check failed ({differs})"), load(DEFAULT_DTYPE)
        fp32 = load(DEFAULT_DTYPE)
        speedup = bf16_speedup(bf16, fp32, ids)
    if speedup <= 1:
        return Choice(DEFAULT_DTYPE, f"bf16 slower here ({speedup:.2f}x fp32)"), fp32
    return Choice(torch.bfloat16, f"native {flag}, self-check passed ({speedup:.2f}x fp32)"), bf16


def rows_agree(model, ids: torch.Tensor) -> str | None:
    """None if every window row of ``model`` equals, bit for bit, the one-row forward's logits (and
    so its argmax); else what differs. ids [1, P + W]: a prefix, then W window tokens that are
    decoded one at a time (vanilla), then verified as windows of ROW_COUNTS rows (sd's chains) and
    as a tree whose chain rows sit between siblings (eagle's and ss's trees)."""
    W = max(ROW_COUNTS)
    prefix, window = ids[:, :-W], ids[:, -W:]
    cache = model.new_cache(ids.shape[1] + 2 * W)
    model(prefix, cache)
    start = cache.length
    single = torch.cat([model(window[:, i:i + 1], cache) for i in range(W)], dim=1)[0]  # [W, V]
    for rows in ROW_COUNTS:
        cache.rollback(start)
        got = model(window[:, :rows], cache, commit=False)[0]
        if not torch.equal(got, single[:rows]):
            return f"a window of {rows} rows"
    cache.rollback(start)
    tree_ids, positions, mask = chain_between_siblings(window, start, model.args.vocab_size)
    got = model(tree_ids, cache, positions=positions, tree_mask=mask, commit=False)[0, ::2]
    return None if torch.equal(got, single) else "a tree window"


def chain_between_siblings(window: torch.Tensor, start: int, vocab: int):
    """A tree of 2W rows over the window [1, W]: row 2i holds window token i, row 2i + 1 a sibling
    of it (another token at the same depth). Returns (ids [1, 2W], positions [1, 2W], mask [2W, 2W])."""
    W = window.shape[1]
    sibling = (window + 1) % vocab  # any other token
    ids = torch.stack([window, sibling], dim=-1).view(1, 2 * W)
    positions = (start + torch.arange(2 * W, device=window.device) // 2)[None]
    chain = torch.arange(2 * W, device=window.device) % 2 == 0
    depth = torch.arange(2 * W, device=window.device) // 2
    earlier_chain = chain[None, :] & (depth[None, :] < depth[:, None])  # the chain rows above each row
    mask = earlier_chain | torch.eye(2 * W, dtype=torch.bool, device=window.device)
    return ids, positions, mask


def bf16_speedup(bf16, fp32, ids: torch.Tensor) -> float:
    """How many times faster ``bf16`` runs a decoding step (one row, then a window of
    max(ROW_COUNTS) rows, after the prefix) than ``fp32``: the fastest of TIMED_ROUNDS interleaved
    rounds each. Other work on a shared CPU only adds time, so each one's fastest round is the
    nearest to its own cost (as ``timeit`` advises)."""
    W = max(ROW_COUNTS)
    caches = {}
    for model in (bf16, fp32):
        caches[model] = model.new_cache(ids.shape[1] + W)
        model(ids[:, :-W], caches[model])

    def step(model) -> float:
        cache, begin = caches[model], time.perf_counter()
        model(ids[:, -W:-W + 1], cache, commit=False)
        model(ids[:, -W:], cache, commit=False)
        return time.perf_counter() - begin

    step(bf16), step(fp32)  # warm-up
    times = {bf16: [], fp32: []}
    for _ in range(TIMED_ROUNDS):
        for model in (bf16, fp32):
            times[model].append(step(model))
    return min(times[fp32]) / min(times[bf16])
