"""Vanilla decoding speed on a CUDA GPU, in fp32 and bf16, with PyTorch's cuDNN attention on and off.

    python -m research.gpu_attention [--target MODEL]     (needs a CUDA GPU)

cuDNN builds an execution plan for each new sequence length, and PyTorch picks it for attention in
bf16; lanes on a CUDA device turn it off (``mirror_sd.devices.avoid_cudnn_attention``). Prints
tokens/s for three new prompts, and for one prompt decoded three times (lengths seen before), in
fp32, in bf16 with cuDNN attention on (as before the fix) and in bf16 with it off (as shipped).
The README's figures were taken on an H100 with a randomly initialised model of the embedded
target's shape (the GGUF had not reached that machine yet): the weights do not change the kernels.
"""
import argparse
import sys
import time

import torch

from mirror_sd import generate, load_pair


def tokens_per_s(pair, prompt: str, n: int = 64) -> str:
    start = time.perf_counter()
    generate(pair, prompt, method="vanilla", max_new_tokens=n, raw=True)
    return f"{n / (time.perf_counter() - start):.1f}"


def main():
    parser = argparse.ArgumentParser(prog="python -m research.gpu_attention", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="model name or folder (default: the embedded target)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this needs a CUDA GPU")
    for dtype, cudnn in (("float32", False), ("bfloat16", True), ("bfloat16", False)):
        pair = load_pair(target=args.target, draft=None, target_device="cuda", dtype=dtype)
        torch.backends.cuda.enable_cudnn_sdp(cudnn)  # after load_pair, whose lanes turn it off
        generate(pair, "Hello", method="vanilla", max_new_tokens=8, raw=True)  # warm up
        new = [tokens_per_s(pair, f"{word} " * (20 + 7 * i)) for i, word in enumerate(("x", "y", "z"))]
        seen = [tokens_per_s(pair, "Tell me about the moon.") for _ in range(3)]
        print(f"{dtype:9s} cuDNN attention {'on ' if cudnn else 'off'}: new prompts {new} tokens/s, "
              f"one prompt again and again {seen}", flush=True)
    torch.backends.cuda.enable_cudnn_sdp(False)


if __name__ == "__main__":
    main()
