"""Triton kernels that do in one launch what PyTorch runs as several, for a stage's few rows.

A captured forward of the embedded target runs about 45 kernels per layer, most of them tiny, and
on a GPU each costs a few microseconds however little it does, so the kernel count, not the
arithmetic, sets a one-token forward's time (docs/devices.md). These kernels cut it:

* :func:`skinny_kernel`: y = x W^T (+ b) for a few rows of x. cuBLAS's fp32 kernels for 2 to 16
  rows use tiles mostly empty at these widths; here program (i, j) streams a block of BLOCK_N
  weight rows once, BLOCK_K inputs at a time, for BLOCK_M rows of x, accumulating in fp32 (IEEE
  products for fp32 inputs: no TF32). K is a compile-time constant (a model has a few).
* :func:`matvec_kernel`: the same product built like a matrix-vector kernel: program (i, m)
  takes BLOCK_N weight rows for one row m of x, its loop over K unrolled, so that every chunk's
  loads are in flight at once rather than one loop step after another; fp32 products and sums (no
  tl.dot, so no TF32). The weights are read once per row of x (from L2 at these sizes): for few rows.
* :func:`rms_norm_kernel`: RMSNorm of one row per program (six PyTorch kernels: cast, square,
  mean, add, rsqrt, two products), with Hugging Face's order: normalise in fp32, cast to the
  model's dtype, then multiply by the weight; with ADD, the residual add before it too (the sum
  written out as well, for the next residual).
* :func:`rotary_kernel`: rotary embedding of one head's row per program (five PyTorch kernels:
  a negation, a concatenation, two products and a sum), reading any strides, so q and k need
  no copy first.
* :func:`rotary_store_kernel`: in one launch, what a layer does between its q, k, v products and
  its attention: q turned, k turned and written to its cache slots, v written to its slots (with
  PyTorch: ten kernels for the rotary embeddings and two index copies). One row per program.
* :func:`silu_mul_kernel`: silu(g) * u from one product's output [g | u] (a gated MLP's gate and
  up products done as one), for a block of one row per program (PyTorch: a split, silu, product).
* :func:`attention_part_kernel` and :func:`attention_join_kernel`: attention of a few query rows
  over every slot of a stage's cache under its mask, split as flash-decoding splits it. Program
  (b * H + h, row block, part) runs one query head (reading its key head in place: grouped-query
  attention needs no repeated keys) over the part's CHUNK slots, BLOCK_S at a time with a running
  softmax (max, sum, weighted values), and skips a block no row may see: a stage's cache has a
  few thousand slots, mostly unused, so the work follows the slots in use. The join kernel
  weighs each part's partial result by exp(its max - the overall max). A row that sees no slot
  gets zeros, as PyTorch's attention gives it.

models/tuning.py decides where each runs (measured against PyTorch's own kernels on the device),
and imports this module, so Triton, only then. Under ``TRITON_INTERPRET=1`` (set before Triton is
first imported) Triton's interpreter runs them on CPU tensors instead, slowly: how the CPU tests
check them.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])  # one compile for every row count
def skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows (columns of y)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K),
                    other=0.0)  # [BLOCK_M, BLOCK_K]
        # (a big model's LM head can hold more than 2**31 elements: offsets into it in int64)
        w = tl.load(w_ptr + rn[None, :].to(tl.int64) * K + k[:, None], mask=(rn[None, :] < N) & (k[:, None] < K),
                    other=0.0)  # [BLOCK_K, BLOCK_N]
        if IEEE:
            acc += tl.dot(x, w, input_precision="ieee")
        else:
            acc += tl.dot(x, w)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def matvec_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows (columns of y)
    m = tl.program_id(1).to(tl.int64)  # the row of x
    w_rows = w_ptr + rn[:, None].to(tl.int64) * K  # [BLOCK_N, 1] (int64: an LM head can exceed 2**31 elements)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):  # unrolled: no chunk's loads wait on another's
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m * K + k, mask=k < K, other=0.0).to(tl.float32)  # [BLOCK_K]
        w = tl.load(w_rows + k[None, :], mask=(rn[:, None] < N) & (k[None, :] < K), other=0.0)  # [BLOCK_N, BLOCK_K]
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)  # [BLOCK_N]
    if HAS_BIAS:
        y += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * N + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit(do_not_specialize=["eps"])
def rms_norm_kernel(x_ptr, delta_ptr, sum_ptr, w_ptr, y_ptr, eps, D: tl.constexpr, ADD: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)  # BLOCK: D rounded up to a power of two
    inside = i < D
    x = tl.load(x_ptr + row * D + i, mask=inside, other=0.0)
    if ADD:  # the residual add first: sum = x + delta, in x's dtype, kept for the next residual
        x = (x.to(tl.float32) + tl.load(delta_ptr + row * D + i, mask=inside, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * D + i, x, mask=inside)
    x = x.to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + i, mask=inside, other=0.0)
    y = w.to(tl.float32) * normed.to(y_ptr.dtype.element_ty).to(tl.float32)  # as weight * x.to(dtype)
    tl.store(y_ptr + row * D + i, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, H, T, sxb, sxh, sxt, scb, sct,
                  HALF: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # over B * H * T rows of y [B, H, T, 2 * HALF], contiguous
    t, h, b = row % T, (row // T) % H, row // (T * H)
    i = tl.arange(0, BLOCK)  # BLOCK: HALF rounded up to a power of two
    inside = i < HALF
    x = x_ptr + b.to(tl.int64) * sxb + h * sxh + t * sxt  # x [B, H, T, D] in any strides but the last
    x1, x2 = tl.load(x + i, mask=inside), tl.load(x + HALF + i, mask=inside)
    y1, y2 = turned(x1, x2, cos_ptr, sin_ptr, b.to(tl.int64) * scb + t * sct, i, inside, HALF)
    y = y_ptr + row.to(tl.int64) * 2 * HALF
    tl.store(y + i, y1, mask=inside)
    tl.store(y + HALF + i, y2, mask=inside)


@triton.jit
def turned(x1, x2, cos_ptr, sin_ptr, c, i, inside, HALF: tl.constexpr):
    """A row's halves (x1, x2) turned by the rotary embedding: x * cos + rotate_half(x) * sin,
    rotate_half(x) = [-x2, x1]; cos and sin [B or 1, 1, T, D], the row's at offset c."""
    c1, c2 = tl.load(cos_ptr + c + i, mask=inside), tl.load(cos_ptr + c + HALF + i, mask=inside)
    s1, s2 = tl.load(sin_ptr + c + i, mask=inside), tl.load(sin_ptr + c + HALF + i, mask=inside)
    return x1 * c1 - x2 * s1, x2 * c2 + x1 * s2


@triton.jit
def rotary_store_kernel(q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slots_ptr, out_ptr, kc_ptr, vc_ptr, H, KV, T,
                        sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, scb, sct, scb_, sch_, scs_,
                        HALF: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # over B * (H + 2 KV) * T rows: each batch row's q heads, k heads, v heads
    t, j, b = row % T, (row // T) % (H + 2 * KV), row // (T * (H + 2 * KV))
    i = tl.arange(0, BLOCK)  # BLOCK: HALF rounded up to a power of two
    inside = i < HALF
    slot = tl.load(slots_ptr + t)  # the cache slot of window row t
    if j < H:  # a q row, turned into out [B, H, T, D] (contiguous)
        x = q_ptr + b.to(tl.int64) * sqb + j * sqh + t * sqt
        y = out_ptr + ((b.to(tl.int64) * H + j) * T + t) * 2 * HALF
    elif j < H + KV:  # a k row, turned into its cache slot: caches [B, KV, S, D] (strides scb_, sch_, scs_)
        x = k_ptr + b.to(tl.int64) * skb + (j - H) * skh + t * skt
        y = kc_ptr + b.to(tl.int64) * scb_ + (j - H) * sch_ + slot * scs_
    else:  # a v row, copied into its cache slot
        x = v_ptr + b.to(tl.int64) * svb + (j - H - KV) * svh + t * svt
        y = vc_ptr + b.to(tl.int64) * scb_ + (j - H - KV) * sch_ + slot * scs_
    x1, x2 = tl.load(x + i, mask=inside), tl.load(x + HALF + i, mask=inside)
    if j < H + KV:  # q and k rows are turned, v rows copied
        x1, x2 = turned(x1, x2, cos_ptr, sin_ptr, b.to(tl.int64) * scb + t * sct, i, inside, HALF)
    tl.store(y + i, x1, mask=inside)
    tl.store(y + HALF + i, x2, mask=inside)


@triton.jit
def silu_mul_kernel(both_ptr, y_ptr, I: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # both [rows, 2I] = [gate | up], y [rows, I]
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = i < I
    g = tl.load(both_ptr + row * 2 * I + i, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(both_ptr + row * 2 * I + I + i, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * I + i, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def attention_part_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, m_ptr, l_ptr, acc_ptr, H, T, S, GROUP, scale,
                          sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, smb, smt, sms,
                          D: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr):
    bh, part = tl.program_id(0), tl.program_id(2)  # (batch row, query head), chunk of CHUNK slots
    b, h = bh // H, bh % H
    kv = h // GROUP  # the key head this query head shares with GROUP - 1 others
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T] window rows
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b.to(tl.int64) * sqb + h * sqh + t[:, None] * sqt + d[None, :],
                mask=(t[:, None] < T) & (d[None, :] < D), other=0.0)  # [BLOCK_T, BLOCK_D]
    k_base = k_ptr + b.to(tl.int64) * skb + kv * skh
    v_base = v_ptr + b.to(tl.int64) * svb + kv * svh
    best = tl.full((BLOCK_T,), float("-inf"), dtype=tl.float32)  # running max of each row's scores
    total = tl.zeros((BLOCK_T,), dtype=tl.float32)  # running sum of exp(score - best)
    acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)  # running sum of exp(score - best) * value
    for step in range(0, CHUNK, BLOCK_S):
        s = part * CHUNK + step + tl.arange(0, BLOCK_S)  # [BLOCK_S] slots
        seen = (t[:, None] < T) & (s[None, :] < S)  # [BLOCK_T, BLOCK_S]
        if CAUSAL:  # row t is slot S - T + t and sees the slots up to it
            seen &= s[None, :] <= (S - T + t)[:, None]
        if HAS_MASK:
            seen &= tl.load(mask_ptr + b.to(tl.int64) * smb + t[:, None] * smt + s[None, :] * sms,
                            mask=seen, other=0) != 0
        if tl.sum(seen.to(tl.int32)) > 0:  # a block no row may see (an unused slot) costs no reads of k, v
            inside = (s[:, None] < S) & (d[None, :] < D)
            k = tl.load(k_base + s[:, None] * sks + d[None, :], mask=inside, other=0.0)  # [BLOCK_S, BLOCK_D]
            if IEEE:
                score = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                score = tl.dot(q, tl.trans(k))
            score = tl.where(seen, score * scale, float("-inf"))  # [BLOCK_T, BLOCK_S]
            new_best = tl.maximum(best, tl.max(score, axis=1))
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # a row that saw nothing yet: exp(-inf) = 0
            p = tl.exp(score - shift[:, None])
            fade = tl.exp(best - shift)
            total = total * fade + tl.sum(p, axis=1)
            v = tl.load(v_base + s[:, None] * svs + d[None, :], mask=inside, other=0.0)
            if IEEE:
                acc = acc * fade[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * fade[:, None] + tl.dot(p.to(v.dtype), v)
            best = new_best
    row = (bh.to(tl.int64) * T + t) * tl.num_programs(2) + part  # partials [B * H * T, parts]
    tl.store(m_ptr + row, best, mask=t < T)
    tl.store(l_ptr + row, total, mask=t < T)
    tl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=(t[:, None] < T) & (d[None, :] < D))


@triton.jit
def attention_join_kernel(m_ptr, l_ptr, acc_ptr, y_ptr, H, T, PARTS, syb, syh, syt,
                          D: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)  # over B * H * T rows
    t, h, b = row % T, (row // T) % H, row // (T * H)
    p = tl.arange(0, BLOCK_P)
    d = tl.arange(0, BLOCK_D)
    best = tl.load(m_ptr + row.to(tl.int64) * PARTS + p, mask=p < PARTS, other=float("-inf"))  # [BLOCK_P]
    top = tl.max(best, axis=0)
    weight = tl.exp(best - tl.where(top == float("-inf"), 0.0, top))  # a part that saw nothing: 0
    total = tl.sum(weight * tl.load(l_ptr + row.to(tl.int64) * PARTS + p, mask=p < PARTS, other=0.0), axis=0)
    acc = tl.load(acc_ptr + (row.to(tl.int64) * PARTS + p[:, None]) * D + d[None, :],
                  mask=(p[:, None] < PARTS) & (d[None, :] < D), other=0.0)  # [BLOCK_P, BLOCK_D]
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)  # a row that saw nothing: 0
    tl.store(y_ptr + b.to(tl.int64) * syb + h * syh + t * syt + d, out.to(y_ptr.dtype.element_ty), mask=d < D)
