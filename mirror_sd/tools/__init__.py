"""Tools around the engine, apart from its core: they run, measure and model the engine, and the
engine never imports them.

  bench.py       bench and sweep (``python -m mirror_sd bench|sweep``); spec_bench.py: Spec-Bench's report layout
  tradeoff.py    drafts of growing capacity, measured and re-timed (``python -m mirror_sd tradeoff``)
  whatif.py      the what-if latency model: a trace re-timed on a hardware profile (profiles/*.json)
  gpu_check.py   ``python -m mirror_sd gpu-check``: the one command to run first on a GPU
  kernels.py     why a stage's GPU time moves with its width: top kernels, TF32 and bf16 (gpu-check)
  host_ops.py    what a step costs the host around its stages: operations and milliseconds per step
                 (``python -m mirror_sd.tools.host_ops``); stage_ops.py: the operations inside each stage's
                 body; host_samples.py: the decoding thread's time, line by line (gpu-check's bundle)
"""
