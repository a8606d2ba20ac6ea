"""Time one pass over SmolLM2-135M-sized fp32 weights (30 layers of linears and the LM head) with
PyTorch's F.linear and with oneDNN's prepacked product (what mirror_sd.models.linear uses at
inference), for the row counts decoding uses. With --forward: the embedded
target's whole forward for windows of 1-25 tokens after a 150-token prefix, on the CPU lanes'
shared worker thread (the only thread that runs torch work here, as in decoding: see
mirror_sd/devices.py), window lengths interleaved (medians), and the one-token forward with
``F.linear`` for one-row products with matrices under 4M elements, every one but the LM head
(what models/linear.py did before), and windows of 1 and 3 tokens on one core instead of all
(as Mirror-SD's target lane runs beside its draft lane).

    python -m research.linear_kernels
    python -m research.linear_kernels --forward
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import mirror_sd.models.linear as linear_module
from mirror_sd.devices import cpu_cores, on_cpu_worker
from mirror_sd.models.linear import prepacked_weight

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


def forward(windows=(1, 3, 5, 9, 17, 25), rounds: int = 6, per_round: int = 6):
    from mirror_sd import load_pair

    target = load_pair(draft=None).target
    ids = torch.randint(0, 1000, (1, 150 + max(windows)))

    def prefill():
        cache = target.new_cache(ids.shape[1])
        with torch.inference_mode():
            target(ids[:, :150], cache)
        return cache

    cache = on_cpu_worker(prefill)

    def timed(T: int, threads: int) -> list[float]:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            target(ids[:, 150:150 + T], cache, commit=False)  # warm up (and pack)
            out = []
            for _ in range(per_round):
                start = time.perf_counter()
                target(ids[:, 150:150 + T], cache, commit=False)
                out.append((time.perf_counter() - start) * 1000)
        return out

    cases = [(T, "prepacked") for T in windows] + [(1, "F.linear"), (1, "one core"), (3, "one core")]
    times: dict = {case: [] for case in cases}
    prepacked_policy = linear_module.uses_prepacked
    def one_row_plain(x, weight, bias=None):  # the policy before: one row through F.linear but the LM head's
        return prepacked_policy(x, weight, bias) and (x.numel() > x.shape[-1] or weight.numel() >= 1 << 22)

    for _ in range(rounds):
        for T, policy in cases:
            linear_module.uses_prepacked = one_row_plain if policy == "F.linear" else prepacked_policy
            times[(T, policy)] += on_cpu_worker(timed, T, 1 if policy == "one core" else cpu_cores())
    linear_module.uses_prepacked = prepacked_policy
    one = statistics.median(times[(1, "prepacked")])
    print("window  policy         ms (median)  x one-token forward")
    for (T, policy), values in times.items():
        ms = statistics.median(values)
        print(f"{T:6d}  {policy:13s}  {ms:11.1f}  {ms / one:6.2f}")


if __name__ == "__main__":
    forward() if "--forward" in sys.argv else main()
