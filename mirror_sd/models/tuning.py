"""Tuned kernels: each matrix product, attention, RMSNorm, residual add, rotary embedding and cache
write a CUDA stage captures runs the way timed fastest on that GPU for its shape.

Decoding runs a few rows at a time (a token, a draft window, a tree, a batch of branches: 1 to 64).
On a GPU in fp32, cuBLAS's kernels for 2 to 16 rows can cost many times its one-row
matrix-vector kernels, and then verifying a window costs more than the decoding steps it saves
(docs/devices.md; the H200's figures: docs/experiments/devices.md, "Tuned kernels"). So each such
operation a captured stage records (models/stages.py) runs the fastest of a few formulations,
timed on the device. Matrix products (``models/linear.py``):

* ``cublas``: ``F.linear``, PyTorch's own call (what every product runs outside a stage);
* ``swapped``: the same product with its two sides swapped, ``(W x^T)^T``: cuBLAS picks a
  kernel by the shapes it is given, so it may pick another one;
* ``skinny`` and ``skinny-wide``: a Triton kernel written for few rows (models/fused.py): each
  program multiplies a block of weight rows (16, or 64 for the wide one) by 16 rows of x at a time,
  reading the block once, in IEEE fp32 (no TF32);
* ``matvec`` and ``matvec-wide``: a Triton kernel built like a matrix-vector one (models/fused.py):
  each program multiplies a block of weight rows (2, or 4 for the wide one) by one row of x, its
  loop over K unrolled so that all its loads are in flight at once; fp32 products and sums.

Attention (over every slot of a stage's cache under its mask):

* ``sdpa``: ``F.scaled_dot_product_attention`` with grouped-query heads, as outside a stage
  (PyTorch runs its plain "math" attention for it in fp32: a product, a softmax, a product);
* ``expanded``: the key and value heads repeated to one per query head first, so that PyTorch may
  choose its fused memory-efficient kernel, which takes fp32 and masks but not grouped heads;
* ``triton``: split attention (:func:`split_attention`, models/fused.py): two kernels, whose work
  follows the slots the mask admits rather than every slot of the stage's cache.

And the small operations, which cost a kernel launch each whatever their size, so that a
one-token forward's time is mostly their count:

* RMSNorm: ``composite`` (six PyTorch kernels, as outside a stage), ``fused`` (PyTorch's own
  ``F.rms_norm``) or ``triton`` (models/fused.py);
* the rotary embedding of q and k (:func:`rotary`): ``composite`` (five kernels each) or
  ``triton`` (one each);

and, joining operations that llama.py runs apart (models/tuned.py's layers, a stage's body, call them):

* a residual add and the RMSNorm after it (:func:`added_norm`): ``separate`` or ``triton`` (one
  kernel writing both);
* the rotary embedding and the cache writes of k and v together (:func:`rotary_store`):
  ``separate`` (the rotary embedding, then two index copies) or ``triton`` (one kernel);
* products that share their input: q, k and v (:func:`projections`) as three products
  (``separate``) or one over their weights stacked (``joined``, the stack made once in a
  warm-up); the MLP's silu(gate(x)) * up(x) (:func:`gated`) as two products, a silu and a
  product (``separate``), one product and the two (``joined``), or one product and one Triton
  kernel (``joined-triton``). The joined products are tuned as products.

The formulations of an operation differ only in rounding (the order of floating-point sums, fused
multiply-adds), as cuBLAS's own kernels for two widths do, so every method stays lossless (the
tests hold each formulation to the default one and the methods to vanilla).

Chosen when a stage is captured, not during the forward: the modules whose operations are tuned
(:class:`Planned`: llama.py's Linear, RMSNorm and Attention, and the heads that multiply by rows
of an LM head) carry a ``plan``, None by default (PyTorch's default calls, as every forward outside
a stage runs). A CUDA stage converts the modules its body runs to a :class:`Plan` for its warm-up
and capture (:func:`converted`; models/stages.py), and the graph keeps what it recorded.

Measured, not assumed: with a plan, the first operation of a new kind (its op, device, shapes,
dtype, TF32 on or off) is tuned: :func:`tune`
times each formulation (:func:`graph_us`: REPEATS runs captured as one CUDA graph, its replays
timed with CUDA events), checks its result against the default one's on the same inputs, and
keeps the fastest, unless it saves less than MARGIN against the default. A formulation that
cannot run here (no Triton, a compile error, no fused kernel for these inputs) or whose result
differs by more than rounding is recorded with the reason and left out, so a kernel that is fast
but wrong on some GPU is never chosen. The choices and their times hold for the
process (``PLAN``, ``TIMES``; :func:`plan_table` for gpu-check's report).
"""
from __future__ import annotations

import functools
import statistics
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FORMULATIONS = {  # op -> its formulations, the default first
    "product": ("cublas", "swapped", "skinny", "skinny-wide", "matvec", "matvec-wide"),
    "attention": ("sdpa", "expanded", "triton"),
    "norm": ("composite", "fused", "triton"),
    "added_norm": ("separate", "triton"),
    "rotary": ("composite", "triton"),
    "rotary_store": ("separate", "triton"),
    "projections": ("separate", "joined"),
    "gated": ("separate", "joined", "joined-triton"),
}
REPEATS = 10  # runs captured in one timed graph
TIMED_REPLAYS = 5  # replays of it timed (the median is kept)
MARGIN = 0.05  # another formulation replaces the default only if it saves more than this fraction
ROUNDING, LOOSE = 1e-4, 3e-2  # a formulation's result must be the default's within this, relative to its largest value
SKINNY = {"skinny": (16, 2), "skinny-wide": (64, 4)}  # formulation -> (weight rows per program, warps)
BLOCK_M, BLOCK_K = 16, 64  # rows of x per program (tl.dot's least), inputs per loop step
# formulation -> (weight rows per program, inputs per unrolled step, warps). Small programs: at 2
# warps, each step's [BLOCK_N, BLOCK_K] tile is 16 fp32 per thread, read as 16-byte vectors, and
# N/2 (or N/4) programs per row of x put even one row of a 576-wide product on every SM. The wide
# one reads each chunk of x once for 4 weight rows, in half as many programs.
MATVEC = {"matvec": (2, 512, 2), "matvec-wide": (4, 256, 2)}
MAX_STEPS = 16  # the matrix-vector kernel unrolls K / BLOCK_K steps: at most this many
CHUNK, BLOCK_S = 256, 64  # split attention: slots per program, slots per loop step

PLAN: dict[tuple, str] = {}  # kind of operation -> the formulation a plan runs for it
TIMES: dict[tuple, dict[str, float | str]] = {}  # kind -> formulation -> GPU us per run, or why it cannot run


@dataclass(frozen=True)
class Plan:
    """What a CUDA stage's capture runs: each operation of a kind tuned before in the formulation
    ``PLAN`` holds for it, a new kind tuned first with ``timer(fn) -> us per call`` (None:
    :func:`graph_us`, CUDA only)."""

    timer: object = None


class Planned:
    """A module whose operations are tuned: ``plan`` is None (PyTorch's default calls) but while a
    CUDA stage captures it (:func:`converted`)."""

    plan: Plan | None = None


@contextmanager
def converted(modules, plan: Plan | None):
    """The :class:`Planned` modules among ``modules`` and their submodules run ``plan`` while
    inside, and what they ran before on leaving: how a stage converts the modules its body runs
    for its warm-up and capture (models/stages.py)."""
    found = list({id(m): m for root in modules for m in root.modules() if isinstance(m, Planned)}.values())
    before = [m.plan for m in found]
    for m in found:
        m.plan = plan
    try:
        yield
    finally:
        for m, was in zip(found, before):
            m.plan = was


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            plan: Plan | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [..., K], weight [N, K] -> [..., N], in the formulation
    ``plan`` holds for its kind (no plan: ``F.linear``)."""
    x2d = x.reshape(-1, x.shape[-1])  # [M, K]
    shape = f"{weight.shape[0]} x {weight.shape[1]}" + (" + bias" if bias is not None else "")
    name = choice("product", shape, x2d.shape[0], x, lambda name: run_product(name, x2d, weight, bias), plan)
    if name == "cublas":
        return F.linear(x, weight, bias)
    return run_product(name, x2d, weight, bias).view(*x.shape[:-1], weight.shape[0])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool, plan: Plan | None = None) -> torch.Tensor:
    """Scaled dot-product attention of q [B, H, T, D] over k, v [B, KV, S, D] (KV divides H) under
    ``mask`` [B|1, 1, T, S] (True: may attend) or ``causal``: [B, H, T, D], in the formulation
    ``plan`` holds for its kind (no plan: ``sdpa``). Tuned on random inputs of the same shapes
    (:func:`trial_attention_inputs`)."""
    if plan is None:
        return run_attention("sdpa", q, k, v, mask, causal)
    B, H, T, D = q.shape
    inputs = []  # made on the first trial, before any capture (tune runs the default once first)

    def trial(name):
        if not inputs:
            inputs.extend(trial_attention_inputs(q, k, v, mask))
        return run_attention(name, *inputs, causal)
    shape = f"{H} heads of {D} over {k.shape[2]} slots, {k.shape[1]} key heads" + (", causal" if causal else "")
    name = choice("attention", shape, B * T, q, trial, plan)
    return run_attention(name, q, k, v, mask, causal)


def trial_attention_inputs(q, k, v, mask):
    """Random q, k, v like these, and a random mask like this one (each row sees slot 0 and about
    half of the others): what attention is tuned on. A stage's warm-up runs padding rows, each
    seeing one slot: timed on them, the split kernel would skip nearly every block of slots, which
    real windows do not, and its check would never join two parts' results. Here every block is in
    use, its slowest case, so a formulation chosen here is at least as fast in use."""
    gen = torch.Generator(q.device).manual_seed(0)
    like = [torch.randn(x.shape, generator=gen, device=x.device).to(x.dtype) for x in (q, k, v)]
    if mask is None:
        return [*like, None]
    seen = torch.rand(mask.shape, generator=gen, device=mask.device) < 0.5
    seen[..., 0] = True
    return [*like, seen]


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, plan: Plan | None = None) -> torch.Tensor:
    """RMSNorm of x [..., D] with ``weight`` [D], as Hugging Face's Llama computes it, in the
    formulation ``plan`` holds for its kind (no plan: ``composite``)."""
    if plan is None:
        return run_norm("composite", x, weight, eps)
    rows = x.numel() // x.shape[-1]
    name = choice("norm", f"{x.shape[-1]} wide", rows, x, lambda name: run_norm(name, x, weight, eps), plan)
    return run_norm(name, x, weight, eps)


def added_norm(x: torch.Tensor, delta: torch.Tensor | None, rms: torch.nn.Module):
    """(x + delta, rms(x + delta)): a residual add and the RMSNorm after it (x, delta [..., D];
    delta None: no add, (x, rms(x))), in the formulation the norm's plan holds for their kind (no
    plan: ``separate``, the add, then ``rms``)."""
    if delta is None:
        return x, rms(x)
    if rms.plan is None:
        return run_added_norm("separate", x, delta, rms)
    rows = x.numel() // x.shape[-1]
    name = choice("added_norm", f"{x.shape[-1]} wide", rows, x, lambda name: run_added_norm(name, x, delta, rms),
                  rms.plan)
    return run_added_norm(name, x, delta, rms)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: Plan | None = None):
    """(q, k) [B, heads, T, D] turned by the rotary embedding: x * cos + rotate_half(x) * sin, cos and
    sin [B or 1, 1, T, D]; in the formulation ``plan`` holds for their kind (no plan: ``composite``)."""
    if plan is None:
        return run_rotary("composite", q, cos, sin), run_rotary("composite", k, cos, sin)
    turned = []
    for x in (q, k):
        B, H, T, D = x.shape
        name = choice("rotary", f"{H} heads of {D}", B * T, x, lambda name, x=x: run_rotary(name, x, cos, sin), plan)
        turned.append(run_rotary(name, x, cos, sin))
    return tuple(turned)


def rotary_store(q, k, v, cos, sin, k_cache, v_cache, slots, plan: Plan | None = None):
    """q turned by the rotary embedding, and k turned and v as it is stored in the caches at
    ``slots``: q, k, v [B, heads, T, D], cos, sin [B|1, 1, T, D], k_cache, v_cache [B, KV, S, D],
    slots [T] (window row t goes to slot slots[t]). Returns (q turned, k_cache, v_cache), in the
    formulation ``plan`` holds for their kind (no plan: ``separate``, :func:`rotary` and two index
    copies). Tuned on zeroed copies of the caches, one per formulation, so that the check sees what
    each formulation itself stored."""
    if plan is None:
        return run_rotary_store("separate", q, k, v, cos, sin, k_cache, v_cache, slots)
    B, H, T, D = q.shape
    copies = {}

    def trial(name):
        if name not in copies:  # made before any capture: tune runs each formulation once first
            copies[name] = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        return run_rotary_store(name, q, k, v, cos, sin, *copies[name], slots, plan)
    name = choice("rotary_store", f"{H} + {k.shape[1]} heads of {D} into {k_cache.shape[2]} slots", B * T, q, trial,
                  plan)
    return run_rotary_store(name, q, k, v, cos, sin, k_cache, v_cache, slots, plan)


def projections(x: torch.Tensor, linears) -> list[torch.Tensor]:
    """[linear(x) for each of ``linears``] (x [..., K], each linear [N_i, K]), in the formulation
    their plan (the first one's) holds for their kind (no plan: ``separate``)."""
    plan = plan_of(linears[0])
    if plan is None:
        return [linear(x) for linear in linears]
    shape = " + ".join(str(linear.out_features) for linear in linears) + f" x {x.shape[-1]}"
    name = choice("projections", shape, x.numel() // x.shape[-1], x, lambda name: run_projections(name, x, linears),
                  plan)
    return run_projections(name, x, linears)


def plan_of(module) -> Plan | None:
    """A module's plan; None for one that is not :class:`Planned` (a linear map with an adapter beside
    it, models/streams.py ``Adapted``): it runs as its parts do, each base map by its own plan."""
    return getattr(module, "plan", None)


def gated(x: torch.Tensor, gate, up) -> torch.Tensor:
    """silu(gate(x)) * up(x) (x [..., K]; gate, up [I, K]): a gated MLP's first half, in the
    formulation the gate's plan holds for its kind (no plan: ``separate``)."""
    if plan_of(gate) is None:
        return F.silu(gate(x)) * up(x)
    shape = f"2 x {gate.out_features} x {x.shape[-1]}"
    name = choice("gated", shape, x.numel() // x.shape[-1], x, lambda name: run_gated(name, x, gate, up), gate.plan)
    return run_gated(name, x, gate, up)


def choice(op: str, shape: str, rows: int, x: torch.Tensor, call, plan: Plan | None) -> str:
    """The formulation of this kind of ``op``: the default with no plan; else the planned one,
    tuned now with ``call(name)`` and the plan's timer if new (not while a graph is being captured,
    which then records the default)."""
    default = FORMULATIONS[op][0]
    if plan is None:
        return default
    key = (op, str(x.device), shape, rows, str(x.dtype).removeprefix("torch."), torch.backends.cuda.matmul.allow_tf32)
    if key not in PLAN:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return default
        tune(key, call, plan.timer)
    return PLAN[key]


def tune(key: tuple, call, timer=None) -> str:
    """Time every formulation of ``key``'s op, ``call(name)`` running one, with ``timer(fn) -> us
    per call`` (default :func:`graph_us`), and check its result against the default one's: one that
    fails or differs by more than rounding (:func:`differs`) is left out. Record the times, or why a
    formulation was left out, in TIMES and the choice in PLAN."""
    timer = timer or graph_us
    names = FORMULATIONS[key[0]]
    expected = call(names[0])
    times: dict[str, float | str] = {}
    for name in names:
        try:
            us = float(timer(lambda name=name, op=key[0]: call(name)))  # (name, op): what is timed
            wrong = None if name == names[0] else differs(call(name), expected, loose=key[4] != "float32" or key[5])
            times[name] = wrong or us
        except Exception as e:  # noqa: BLE001  (this machine cannot run it: no Triton, a compile error, ...)
            times[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    measured = {name: t for name, t in times.items() if isinstance(t, float)}
    best = min(measured, key=measured.get, default=names[0])
    if names[0] in measured and measured[best] > measured[names[0]] * (1 - MARGIN):
        best = names[0]
    PLAN[key], TIMES[key] = best, times
    return best


def differs(got, expected, loose: bool = False) -> str | None:
    """None if ``got`` is ``expected`` up to rounding (within ROUNDING of its largest value; LOOSE
    for half precision or TF32), else what is wrong with it; tensors, or lists of them."""
    if isinstance(expected, (list, tuple)):
        return next(filter(None, (differs(g, e, loose) for g, e in zip(got, expected, strict=True))), None)
    if got.shape != expected.shape:
        return f"wrong: shape {tuple(got.shape)}, not {tuple(expected.shape)}"
    got, expected = got.float(), expected.float()
    scale = expected.nan_to_num(0.0, 0.0, 0.0).abs().max().item() or 1.0
    tolerance = (LOOSE if loose else ROUNDING) * scale
    if torch.isclose(got, expected, rtol=0.0, atol=tolerance, equal_nan=True).all():
        return None
    both_nan = got.isnan() & expected.isnan()
    error = (got - expected).abs().masked_fill(both_nan, 0.0).nan_to_num(float("inf")).max().item()
    return f"wrong: off by {error / scale:.1e} of the largest value"


def run_product(name: str, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x2d [M, K] by weight [N, K] (plus bias [N]) -> [M, N], in formulation ``name``."""
    if name == "cublas":
        return F.linear(x2d, weight, bias)
    if name == "swapped":  # [N, M] = W x^T, then its transpose laid out as [M, N]
        y = torch.mm(weight, x2d.t()) if bias is None else torch.addmm(bias[:, None], weight, x2d.t())
        return y.t().contiguous()
    if name in SKINNY:
        return skinny(x2d, weight, bias, *SKINNY[name])
    if name in MATVEC:
        return matvec(x2d, weight, bias, *MATVEC[name])
    raise ValueError(f"no product formulation {name!r} (formulations: {', '.join(FORMULATIONS['product'])})")


def run_attention(name: str, q, k, v, mask, causal: bool) -> torch.Tensor:
    """:func:`attention` in formulation ``name``."""
    if name == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    if name == "expanded":
        repeats = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)  # [B, H, S, D]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    if name == "triton":
        return split_attention(q, k, v, mask, causal)
    raise ValueError(f"no attention formulation {name!r} (formulations: {', '.join(FORMULATIONS['attention'])})")


def run_norm(name: str, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`norm` in formulation ``name``."""
    if name == "composite":
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * normed.to(x.dtype)
    if name == "fused":
        if x.dtype == torch.float32 and weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)
    if name == "triton":
        return triton_rms_norm(x, None, weight, eps)[1]
    raise ValueError(f"no norm formulation {name!r} (formulations: {', '.join(FORMULATIONS['norm'])})")


def run_added_norm(name: str, x: torch.Tensor, delta: torch.Tensor, rms: torch.nn.Module):
    """:func:`added_norm` in formulation ``name``."""
    if name == "separate":
        x = x + delta
        return x, rms(x)
    if name == "triton":
        return triton_rms_norm(x, delta, rms.weight, rms.eps)
    raise ValueError(f"no added_norm formulation {name!r} (formulations: {', '.join(FORMULATIONS['added_norm'])})")


def triton_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """models/fused.py's RMSNorm kernel: (x + delta, its RMSNorm) [..., D], or with delta None
    (x, its RMSNorm). x, delta and weight in one dtype."""
    if any(t is not None and t.dtype != weight.dtype for t in (x, delta)):
        raise ValueError("the RMSNorm kernel takes x, delta and its weight in one dtype")
    fused, D = _fused(x), x.shape[-1]
    x2d = x.reshape(-1, D).contiguous()
    y = torch.empty_like(x2d)
    if delta is None:
        total, delta2d = x2d, x2d  # nothing added, nothing written but y
    else:
        total, delta2d = torch.empty_like(x2d), delta.reshape(-1, D).contiguous()
    fused.rms_norm_kernel[(x2d.shape[0],)](x2d, delta2d, total, weight.contiguous(), y, eps, D=D,
                                           ADD=delta is not None, BLOCK=_power_of_two(D))
    return (x if delta is None else total.view(x.shape)), y.view(x.shape)


def run_rotary(name: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] turned by the rotary embedding (cos, sin [B or 1, 1, T, D]), in ``name``."""
    if name == "composite":
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin
    if name == "triton":
        fused = _fused(x)
        B, H, T, D = x.shape
        if x.stride(-1) != 1 or cos.stride(-1) != 1 or cos.stride() != sin.stride():
            raise ValueError("the rotary kernel reads rows of stride 1, and cos and sin laid out alike")
        y = torch.empty(B, H, T, D, dtype=x.dtype, device=x.device)
        fused.rotary_kernel[(B * H * T,)](x, cos, sin, y, H, T, x.stride(0), x.stride(1), x.stride(2),
                                          cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(2),
                                          HALF=D // 2, BLOCK=_power_of_two(D // 2))
        return y
    raise ValueError(f"no rotary formulation {name!r} (formulations: {', '.join(FORMULATIONS['rotary'])})")


def run_rotary_store(name: str, q, k, v, cos, sin, k_cache, v_cache, slots, plan: Plan | None = None):
    """:func:`rotary_store` in formulation ``name`` (``separate``: the rotary embedding in the
    formulation ``plan`` holds for it)."""
    if name == "separate":
        q, k = rotary(q, k, cos, sin, plan)
        k_cache.index_copy_(2, slots, k)
        v_cache.index_copy_(2, slots, v)
        return q, k_cache, v_cache
    if name == "triton":
        fused = _fused(q)
        (B, H, T, D), KV = q.shape, k.shape[1]
        if any(x.stride(-1) != 1 for x in (q, k, v, cos, k_cache)) or cos.stride() != sin.stride() \
                or k_cache.stride() != v_cache.stride():
            raise ValueError("the rotary-store kernel reads rows of stride 1, cos and sin alike, both caches alike")
        out = torch.empty(B, H, T, D, dtype=q.dtype, device=q.device)
        fused.rotary_store_kernel[(B * (H + 2 * KV) * T,)](
            q, k, v, cos, sin, slots, out, k_cache, v_cache, H, KV, T, *q.stride()[:3], *k.stride()[:3],
            *v.stride()[:3], cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(2), *k_cache.stride()[:3],
            HALF=D // 2, BLOCK=_power_of_two(D // 2))
        return out, k_cache, v_cache
    raise ValueError(f"no rotary_store formulation {name!r} (formulations: {', '.join(FORMULATIONS['rotary_store'])})")


def run_projections(name: str, x: torch.Tensor, linears) -> list[torch.Tensor]:
    """:func:`projections` in formulation ``name``."""
    if name == "separate":
        return [linear(x) for linear in linears]
    if name == "joined":  # one product, its output split into views [..., N_i]
        weight, bias = joined(linears)
        return list(product(x, weight, bias, linears[0].plan).split([linear.out_features for linear in linears], dim=-1))
    raise ValueError(f"no projections formulation {name!r} (formulations: {', '.join(FORMULATIONS['projections'])})")


def run_gated(name: str, x: torch.Tensor, gate, up) -> torch.Tensor:
    """:func:`gated` in formulation ``name``."""
    if name == "separate":
        return F.silu(gate(x)) * up(x)
    if name not in FORMULATIONS["gated"]:
        raise ValueError(f"no gated formulation {name!r} (formulations: {', '.join(FORMULATIONS['gated'])})")
    weight, bias = joined((gate, up))
    both = product(x, weight, bias, gate.plan)  # [..., 2I]: gate(x), then up(x)
    if name == "joined":
        g, u = both.chunk(2, dim=-1)
        return F.silu(g) * u
    fused, I = _fused(x), gate.out_features
    rows = both.reshape(-1, 2 * I)
    y = torch.empty(rows.shape[0], I, dtype=both.dtype, device=both.device)
    block = min(1024, _power_of_two(I))
    fused.silu_mul_kernel[(rows.shape[0], -(-I // block))](rows, y, I=I, BLOCK=block)
    return y.view(*x.shape[:-1], I)


def joined(linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [sum of N_i, K], bias or None): the weights and biases of ``linears`` stacked, made
    once and kept on the first one's weight (made again if any of them is another tensor now). Made
    in a stage's warm-up: a tensor made while a graph is captured would hold nothing until replayed."""
    first, weights = linears[0].weight, [linear.weight for linear in linears]
    ids = tuple((id(w), w.data_ptr()) for w in weights)
    kept = getattr(first, "_joined", None)
    if kept is None or kept[0] != ids:
        if first.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("joined weights are made before a capture (in its warm-up), not during it")
        with torch.no_grad():
            biases = [linear.bias for linear in linears]
            bias = None if all(b is None for b in biases) else torch.cat(
                [b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)])
            kept = (ids, torch.cat(weights), bias)
        first._joined = kept
    return kept[1], kept[2]


def _power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _fused(x: torch.Tensor):
    """models/fused.py (importing Triton), refusing CPU tensors outside Triton's interpreter."""
    import triton

    from . import fused

    if not x.is_cuda and not triton.knobs.runtime.interpret:
        raise RuntimeError("Triton kernels run CPU tensors only in Triton's interpreter (TRITON_INTERPRET=1)")
    return fused


def skinny(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_n: int, warps: int):
    """x2d [M, K] by weight [N, K] (plus bias) -> [M, N] through models/fused.py's skinny kernel,
    each program ``block_n`` weight rows by 16 rows of x. CPU tensors need Triton's interpreter."""
    fused = _fused(x2d)
    x2d, weight = x2d.contiguous(), weight.contiguous()
    (M, K), N = x2d.shape, weight.shape[0]
    y = torch.empty(M, N, dtype=x2d.dtype, device=x2d.device)
    grid = (-(-N // block_n), -(-M // BLOCK_M))
    fused.skinny_kernel[grid](x2d, weight, weight if bias is None else bias, y, M, N, K=K,
                              HAS_BIAS=bias is not None, IEEE=x2d.dtype == torch.float32, BLOCK_M=BLOCK_M,
                              BLOCK_N=block_n, BLOCK_K=BLOCK_K, num_warps=warps)
    return y


def matvec(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, block_n: int, block_k: int,
           warps: int) -> torch.Tensor:
    """x2d [M, K] by weight [N, K] (plus bias) -> [M, N] through models/fused.py's matrix-vector
    kernel, each program ``block_n`` weight rows by one row of x, K in unrolled steps of
    ``block_k``. Refuses a K of more than MAX_STEPS steps (its unrolled code would grow with K).
    CPU tensors need Triton's interpreter."""
    (M, K), N = x2d.shape, weight.shape[0]
    if -(-K // block_k) > MAX_STEPS:
        raise ValueError(f"the matrix-vector kernel unrolls at most {MAX_STEPS} steps of {block_k}; K = {K} "
                         f"needs {-(-K // block_k)}")
    fused = _fused(x2d)
    x2d, weight = x2d.contiguous(), weight.contiguous()
    y = torch.empty(M, N, dtype=x2d.dtype, device=x2d.device)
    fused.matvec_kernel[(-(-N // block_n), M)](x2d, weight, weight if bias is None else bias, y, N, K=K,
                                               HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
                                               num_warps=warps)
    return y


def split_attention(q, k, v, mask, causal: bool) -> torch.Tensor:
    """:func:`attention` through models/fused.py's two attention kernels: each program attends one
    query head's rows over one CHUNK of slots, skipping blocks its mask (or causality) hides, and a second kernel
    joins the chunks' partial softmaxes. The result [B, H, T, D] is a view of [B, T, H, D] memory,
    which the output product reads without a copy."""
    fused = _fused(q)
    (B, H, T, D), (S, group) = q.shape, (k.shape[2], q.shape[1] // k.shape[1])
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("the attention kernels read rows of stride 1")
    parts, block_d = -(-S // CHUNK), max(16, _power_of_two(D))
    m = torch.empty(B * H * T, parts, dtype=torch.float32, device=q.device)  # each part's max score
    l, acc = torch.empty_like(m), torch.empty(B * H * T, parts, D, dtype=torch.float32, device=q.device)
    if mask is None:  # attend to every slot
        mask, strides = q, (0, 0, 0)
    else:
        strides = tuple(stride if size > 1 else 0 for size, stride in zip(mask.shape, mask.stride()))
        strides = (strides[0], strides[2], strides[3])  # [B|1, 1, T|1, S]
    fused.attention_part_kernel[(B * H, -(-T // BLOCK_M), parts)](
        q, k, v, mask, m, l, acc, H, T, S, group, D ** -0.5, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        *strides, D=D, HAS_MASK=mask is not q, CAUSAL=causal, IEEE=q.dtype == torch.float32, BLOCK_T=BLOCK_M,
        BLOCK_S=BLOCK_S, BLOCK_D=block_d, CHUNK=CHUNK)
    y = torch.empty(B, T, H, D, dtype=q.dtype, device=q.device)
    fused.attention_join_kernel[(B * H * T,)](m, l, acc, y, H, T, parts, y.stride(0), y.stride(2), y.stride(1), D=D,
                                              BLOCK_P=max(2, _power_of_two(parts)), BLOCK_D=block_d)
    return y.transpose(1, 2)


def graph_us(fn, repeats: int = REPEATS, replays: int = TIMED_REPLAYS) -> float:
    """GPU microseconds of one call of ``fn`` (CUDA work only): ``repeats`` calls captured as one
    CUDA graph, the median of ``replays`` replays timed with CUDA events, over ``repeats``."""
    current = torch.cuda.current_stream()
    side = _tuning_stream(current.device)
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        fn()  # warm up: kernels chosen, Triton's compiled
        # capture_begin/end rather than torch.cuda.graph, which synchronises the device and collects
        # garbage each time: hundreds of times per process here
        graph.capture_begin(capture_error_mode="relaxed")
        try:
            for _ in range(repeats):
                fn()
        finally:
            graph.capture_end()
    current.wait_stream(side)
    graph.replay()  # the first replay uploads the graph
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for begin, end in events:
        begin.record()
        graph.replay()
        end.record()
    events[-1][1].synchronize()
    return 1e3 * statistics.median(begin.elapsed_time(end) for begin, end in events) / repeats


@functools.cache
def _tuning_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per GPU for every timing (cuBLAS keeps a workspace per stream it runs on)."""
    return torch.cuda.Stream(device)


def plan_table() -> list[dict]:
    """One row per kind tuned so far: op, device, shape, rows, dtype, tf32, the chosen formulation
    and each formulation's us per run (or why it could not run)."""
    rows = []
    for key, times in sorted(TIMES.items(), key=lambda item: item[0][:4]):
        op, device, shape, rows_, dtype, tf32 = key
        rows.append(dict(op=op, device=device, shape=shape, rows=rows_, dtype=dtype, tf32=tf32, chosen=PLAN[key],
                         **times))
    return rows
