"""Why CPU lanes share worker threads (mirror_sd/devices.py): two OpenMP pools slow each other down.

Each OS thread that runs one of torch's multi-threaded CPU kernels keeps a pool of OpenMP threads
for it. This script measures, in fresh processes, on a worker thread (as a lane runs work):

1. a small product chain shaped like the speculative streams' low-rank adapters
   ([4, 576] @ [576, 16] @ [16, 1536], microseconds per chain);
2. the embedded target decoding 3 prompts with ``ss`` and ``vanilla`` through the engine
   (mean span times in ms: the streams' pass, the tree verify, vanilla's one-token step),

once as mirror-sd runs them (the calling thread never runs a multi-threaded kernel) and once after
the calling thread ran one (``torch.zeros(1 << 24)``), which gives it a pool of its own.

    python -m research.cpu_workers
"""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Give me three tips for sleeping better.", "Why is the sky blue? Answer in two sentences.",
           "Translate to French: the cat sleeps on the warm windowsill."]

CHILD = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import torch
second_pool, what = sys.argv[1] == "1", sys.argv[2]

from mirror_sd.devices import cpu_cores

def chain():
    x, a, b = torch.randn(4, 576), torch.randn(16, 576), torch.randn(1536, 16)
    torch.set_num_threads(cpu_cores())
    with torch.inference_mode():
        for _ in range(200):
            (x @ a.T) @ b.T
        start = time.perf_counter()
        for _ in range(2000):
            (x @ a.T) @ b.T
    return (time.perf_counter() - start) / 2000 * 1e6

if what == "chain":
    worker = ThreadPoolExecutor(1)
    worker.submit(chain).result()  # the worker's pool exists first, as a lane's does after loading
    if second_pool:
        torch.zeros(1 << 24).add_(1)
    print(json.dumps(dict(chain_us=worker.submit(chain).result())))
else:
    from mirror_sd import generate, load_pair
    pair = load_pair()
    generate(pair, "Hello", method="ss", max_new_tokens=4)  # warm up
    if second_pool:
        torch.zeros(1 << 24).add_(1)
    spans = {}
    for prompt in PROMPTS:
        for method in ("vanilla", "ss"):
            for span in generate(pair, prompt, method=method, max_new_tokens=64).trace.spans:
                spans.setdefault(f"{method} {span.kind}", []).append(span.duration * 1000)
    print(json.dumps({k: sum(v) / len(v) for k, v in spans.items() if "prefill" not in k}))
"""


def measure(second_pool: bool, what: str) -> dict:
    code = CHILD.replace("PROMPTS", repr(PROMPTS))
    out = subprocess.run([sys.executable, "-c", code, str(int(second_pool)), what], capture_output=True,
                         text=True, check=True, cwd=ROOT)  # python -c imports from its working folder
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    for what in ("chain", "decode"):
        rows = {label: measure(second, what) for label, second in
                (("one pool (as mirror-sd runs)", False), ("caller ran a kernel too", True))}
        keys = list(next(iter(rows.values())))
        print(f"{'':32}" + "".join(f"{k:>16}" for k in keys))
        for label, row in rows.items():
            print(f"{label:32}" + "".join(f"{row[k]:16.1f}" for k in keys))
        print()


if __name__ == "__main__":
    main()
