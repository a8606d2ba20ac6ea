"""A first walk through mirror-sd: the same prompt decoded by every method, compared.

    python demos/quickstart.py ["your prompt"] [--max-new-tokens N]

Warms every method up once (a short run, discarded: a process's first runs pay one-off costs that
would slow whichever method came first), then prints each method's text and measured numbers,
checks that every method committed the same tokens as vanilla (temperature 0), and writes one
Chrome trace per method into demos/out/ (open them at https://ui.perfetto.dev). One run per
method: for numbers to compare, `python -m mirror_sd bench` runs many prompts.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mirror_sd import METHODS, generate, load_pair  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompt", nargs="?", default="Why is the sky blue? Answer in two sentences.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    pair = load_pair()
    print(f"target: {pair.target_name} on {pair.target_lane.label}\ndraft:  {pair.draft_name} on {pair.draft_lane.label}\n")
    for name in METHODS:  # the warm-up, discarded
        generate(pair, "Hello", method=name, max_new_tokens=2)
    out_dir = Path(__file__).parent / "out"
    out_dir.mkdir(exist_ok=True)
    reference = None
    for name in METHODS:
        out = generate(pair, args.prompt, method=name, max_new_tokens=args.max_new_tokens)
        reference = reference or out
        m = out.metrics
        same = "same tokens as vanilla" if out.token_ids == reference.token_ids else "DIFFERS from vanilla"
        print(f"== {name}: {m['new_tokens']} tokens, {m['steps']} steps, mean accepted {m['mean_accepted']:.2f}, "
              f"{m['tokens_per_s']:.1f} tok/s ({m['tokens_per_s'] / reference.metrics['tokens_per_s']:.2f}x vanilla), {same}")
        print(out.text, "\n")
        (out_dir / f"{name}.trace.json").write_text(json.dumps(out.trace.to_chrome_trace()))
    print(f"Chrome traces written to {out_dir}/")


if __name__ == "__main__":
    main()
