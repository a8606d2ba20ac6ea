"""Where a stage's time goes as its width grows: what gpu-check runs to explain the stage table.

On an H200 the target's forward, captured as a CUDA graph, cost more than twice as much at width 8
as at width 1, and less at width 32 than at 8 (docs/devices.md), so verifying a window cost more
than the decoding steps it saves. Two measurements say why, and what would change it:

* :func:`top_kernels`: the kernels of one eager run of a stage (the same kernels its graph
  replays), by self GPU time per forward (torch.profiler; on the CPU, the operators' self CPU
  time), at a few widths: which operation grows with the width;
* :func:`format_times`: the target's full forward replayed at every width under other number
  formats than the engine's fp32: fp32 with TF32 products (tensor-core kernels for the matrix
  products; not what the engine runs) and bf16 (``--dtype bf16``), on a GPU only.
"""
from __future__ import annotations

import copy
from contextlib import contextmanager, nullcontext

import torch

from ..models.stages import BUCKETS, Stages

PROFILED_WIDTHS = (1, 8, 32)
TOP = 8  # kernels per width kept in the table
EVERY = "every kernel"  # the row of all of a forward's kernels together: how many, and their time


def top_kernels(stage, repeats: int = 3, top: int = TOP) -> list[dict]:
    """[{kernel, calls, us}] per forward: every kernel together (EVERY: how many a forward launches,
    and their summed time), then the ``top`` kernels (CPU: operators) of ``stage``'s eager body by
    self time, run on padding (scratch slots only), averaged over ``repeats`` runs."""
    from torch.profiler import ProfilerActivity, profile

    cuda = stage.x.device.type == "cuda"
    with torch.inference_mode(), stage.planned() if cuda else nullcontext():  # the kernels its graph records
        stage.load_padding()
        stage.body()  # warm: kernels chosen, memory allocated
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(repeats):
                stage.body()
            if cuda:
                torch.cuda.synchronize(stage.x.device)
    rows = []
    for event in prof.key_averages():
        us = (_device_us(event) if cuda else event.self_cpu_time_total) / repeats
        if us > 0:
            rows.append(dict(kernel=event.key, calls=event.count / repeats, us=us))
    every = dict(kernel=EVERY, calls=sum(r["calls"] for r in rows), us=sum(r["us"] for r in rows))
    return [every] + sorted(rows, key=lambda r: -r["us"])[:top]


def _device_us(event) -> float:
    """An event's self GPU microseconds (the attribute's name changed across PyTorch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return getattr(event, name)
    return 0.0


def kernel_table(stages: Stages, name: str = "full", widths=PROFILED_WIDTHS) -> list[dict]:
    """Rows {kernel, calls at the first width, us at each width}: the union of each width's top
    kernels for stage ``name``, largest first at the widest width."""
    per_width = {w: {r["kernel"]: r for r in top_kernels(stages.stage(name, w))} for w in widths}
    kernels = {k for rows in per_width.values() for k in rows}
    table = [dict(kernel=k, calls=next((per_width[w][k]["calls"] for w in widths if k in per_width[w]), 0.0),
                  **{f"us_w{w}": per_width[w][k]["us"] if k in per_width[w] else None for w in widths})
             for k in kernels]
    return sorted(table, key=lambda r: -max(v or 0.0 for key, v in r.items() if key.startswith("us_w")))


@contextmanager
def tf32_products():
    """fp32 matrix products on TF32 tensor cores while inside (PyTorch's default is off)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def format_times(target, slots: int, timer) -> dict[str, dict[int, float]]:
    """{format: {width: ms}}: the target's full forward, made (captured, on a GPU) afresh under each
    number format and timed with ``timer(stage)`` at every bucket. bf16 runs on a GPU only (bf16
    products crash some CPUs)."""
    def times(model):
        stages = Stages(model, slots)
        with torch.inference_mode():
            return {w: timer(stages.stage("full", w)) for w in BUCKETS}

    out = {}
    with tf32_products():  # kernels are chosen when a graph is captured, so inside the switch
        out["fp32, TF32 products"] = times(target)
    if target.device.type == "cuda":
        bf16 = copy.deepcopy(target).to(torch.bfloat16)
        bf16.inv_freq = target.inv_freq.clone()  # the rotary frequencies stay fp32, as load_model keeps them
        out["bf16"] = times(bf16)
    return out
