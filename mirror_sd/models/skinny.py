"""A Triton kernel for matrix products of few rows: y = x W^T (+ b), x [M, K] with M small.

Program (i, j) computes rows [BLOCK_M j, BLOCK_M j + BLOCK_M) of y over columns
[BLOCK_N i, BLOCK_N i + BLOCK_N): it streams that block of weight rows once, BLOCK_K inputs at a
time, and multiplies every row of its x block by it, accumulating in fp32 (IEEE products for fp32
inputs: no TF32). So a product of 1 to 16 rows reads each weight once, as a matrix-vector kernel
does, with no tile of rows left mostly empty. K is a compile-time constant (a model has a few).
models/products.py decides where it runs, and imports this module (so Triton) only then. Under
``TRITON_INTERPRET=1`` (set before Triton is first imported) Triton's interpreter runs the kernel
on CPU tensors instead, slowly: how the CPU tests check it.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])  # one compile for every row count
def skinny_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] weight rows (columns of y)
    # a big model's LM head can have more than 2**31 elements: its offsets in int64
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M] rows of x
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + k[None, :], mask=(rm[:, None] < M) & (k[None, :] < K),
                    other=0.0)  # [BLOCK_M, BLOCK_K]
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
