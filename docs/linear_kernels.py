"""Time one pass over SmolLM2-135M-sized fp32 weights (30 layers of linears and the LM head) with
PyTorch's F.linear and with oneDNN's prepacked product (what mirror_sd.models.linear uses for more
than one row, and for the LM head), for the row counts decoding uses.

    python docs/linear_kernels.py
"""
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mirror_sd.models.linear import prepacked_weight  # noqa: E402

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # q k v o gate up down


def prepacked(x, weight):
    return torch.ops.mkldnn._linear_pointwise(x, prepacked_weight(weight), None, "none", [], "")


def main(rows=(1, 2, 3, 5, 9, 16), repeats: int = 5):
    weights = [torch.randn(*shape) for shape in LAYER * 30] + [torch.randn(49152, 576)]
    print("rows  F.linear  prepacked  (ms per pass)")
    for n in rows:
        xs = {k: torch.randn(1, n, k) for k in (576, 1536)}
        times = []
        for fn in (F.linear, prepacked):
            with torch.inference_mode():
                one_pass = lambda: [fn(xs[w.shape[1]], w) for w in weights]  # noqa: E731
                one_pass()  # warm up (and pack)
                start = time.perf_counter()
                for _ in range(repeats):
                    one_pass()
            times.append((time.perf_counter() - start) / repeats * 1000)
        print(f"{n:4d}  {times[0]:8.1f}  {times[1]:9.1f}")


if __name__ == "__main__":
    main()
