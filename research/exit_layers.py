"""Mirror-SD at several exit layers, each read by a trained early-exit head of its own.

    python -m research.exit_layers --heads 22=mirror_sd/assets/exit-head-smollm2-135m 18=HEAD_18 \
        [--kappas 2,4,8] [--branch-budget 16] [--per-category 2] [--max-new-tokens 64] [--out CSV]

Several heads for one layer (``14=OLD 14=NEW``) compare the heads: one run each.

A head is trained for one exit layer (``python -m mirror_sd.train exit-head --exit-layer L``), and a
pair holds one head at a time, so a plain sweep of ``exit_layer`` would read every other layer with
the logit lens. Here each mirror run gets the head of its layer attached before it runs (the warm-up
too). Runs, interleaved prompt by prompt: vanilla (the reference), sd, then mirror at every (exit
layer, kappa) and ``--branch-budget``, the other options at their defaults. Every run must commit
vanilla's tokens. Writes docs/sweeps/exit_layers_head.csv (or --out): per run, τ, hit rate, speed
against vanilla, and the milliseconds per step of the target prefix, the rollouts, the suffix and
the fallback drafts.
"""
from __future__ import annotations

from pathlib import Path

from mirror_sd.models.exit_head import attach_exit_head, load_exit_head
from mirror_sd.models.pair import load_pair
from mirror_sd.tools.bench import run_interleaved

from .comparison import SWEEPS, add_ms_per_step, bench_prompts, comparison_parser, save_checked, summarise_runs


def parse_heads(specs: list[str]) -> list[tuple[int, Path]]:
    """["22=FOLDER", ...] -> [(22, FOLDER), ...], by layer."""
    heads = []
    for spec in specs:
        layer, sep, folder = spec.partition("=")
        if not sep or not layer.isdigit():
            raise SystemExit(f"--heads takes LAYER=FOLDER, got {spec!r}")
        heads.append((int(layer), Path(folder)))
    return sorted(heads, key=lambda head: head[0])


def main():
    parser = comparison_parser(__doc__)
    parser.add_argument("--heads", nargs="+", required=True, help="LAYER=FOLDER: a trained exit head per exit layer")
    parser.add_argument("--kappas", default="4", help="token channel widths (comma-separated; default 4)")
    parser.add_argument("--branch-budget", type=int, default=16, help="branches rolled out per step (default 16)")
    parser.add_argument("--out", default=str(SWEEPS / "exit_layers_head.csv"), help="the CSV to write")
    args = parser.parse_args()
    pair = load_pair()
    specs = parse_heads(args.heads)
    heads = [load_exit_head(folder, pair.target) for _, folder in specs]
    configs = [(i, int(k)) for i in range(len(specs)) for k in args.kappas.split(",")]
    runs = [("vanilla", {}), ("sd", {})] + [("mirror", dict(exit_layer=specs[i][0], kappa=k,
                                                           branch_budget=args.branch_budget)) for i, k in configs]
    same_layer = len({layer for layer, _ in specs}) < len(specs)  # then the labels name the heads
    labels = ["vanilla", "sd"] + [f"mirror exit {specs[i][0]}{f' ({specs[i][1].name})' if same_layer else ''}, "
                                  f"kappa {k}" for i, k in configs]

    def setup(index):
        if index >= 2:
            attach_exit_head(pair, heads[configs[index - 2][0]])

    table = run_interleaved(pair, bench_prompts(args.per_category), runs, args.max_new_tokens, setup=setup,
                            desc="exit layers")
    summary, per_step = summarise_runs(table, labels)
    add_ms_per_step(summary, per_step, ["target-prefix", "draft-rollout", "target-suffix", "fallback-draft"])
    save_checked(summary, Path(args.out), "the exit head only chooses branches")


if __name__ == "__main__":
    main()
