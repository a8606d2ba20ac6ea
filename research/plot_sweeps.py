"""Draw the sweeps in docs/sweeps (CSV files written by `python -m mirror_sd sweep`) as one PNG.

    python -m research.plot_sweeps   # writes docs/sweeps/sweeps.png (needs matplotlib)
"""
from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parents[1] / "docs" / "sweeps"
OLD = " [F.linear]"  # measured before models/linear.py (prepacked linears)
WORKERS = " [workers only]"  # with the shared CPU workers, before prepacked one-row products
SWEEPS = [("sd_gamma_prepacked.csv", "gamma", "sd: gamma"), ("sd_streams.csv", "streams", "sd: streams" + OLD),
          ("mirror_gamma_prepacked.csv", "gamma", "mirror: gamma"),
          ("mirror_branch_budget.csv", "branch_budget", "mirror: branch budget" + OLD),
          ("mirror_streams.csv", "streams", "mirror: streams" + OLD),
          ("mirror_kappa.csv", "kappa", "mirror: kappa (exit 22)" + OLD),
          ("mirror_exit_layer.csv", "exit_layer", "mirror: exit layer (kappa 8)" + OLD),
          ("eagle_workers_depth.csv", "depth", "eagle: depth (8 nodes)" + WORKERS),
          ("eagle_total_tokens_depth3.csv", "total_tokens", "eagle: total tokens (depth 3)"),
          ("ss_total_tokens_top2_prepacked.csv", "total_tokens", "ss: total tokens (top-k 2)"),
          ("eagle_lookup.csv", "lookup", "eagle: tokens copied from context"),
          ("ss_lookup.csv", "lookup", "ss: tokens copied from context"),
          ("mirror_lookup.csv", "lookup", "mirror: copied window after a miss"),
          ("mirror_gamma_lookup.csv", "gamma", "mirror: gamma (lookup 8)")]


def main():
    fig, axes = plt.subplots(2, 7, figsize=(25, 6.5))
    for ax, (file, option, title) in zip(axes.flat, SWEEPS):
        table = pd.read_csv(HERE / file)
        if file == "mirror_kappa.csv":  # two sweeps: keep the one at the default exit layer
            table = table[table.exit_layer == 22]
        ax.plot(table[option], table["speedup"], "o-", label="speedup over vanilla")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(option)
        ax.set_xticks(table[option].tolist())
        ax.set_ylim(0, max(1.2, table["speedup"].max() * 1.1))
        twin = ax.twinx()
        twin.plot(table[option], table["mean_accepted"], "s--", color="tab:green", label="mean accepted (τ)")
        twin.set_ylim(1, max(2.0, table["mean_accepted"].max() * 1.1))
    axes.flat[0].legend(loc="lower left", fontsize=8)
    fig.suptitle("Measured sweeps on 2 CPU cores (speedup: left axis, τ: right axis, dashed; [F.linear]: before the "
                 "prepacked linears; [workers only]: with the shared CPU workers, before prepacked "
                 "one-row products; see README)", fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "sweeps.png", dpi=90)


if __name__ == "__main__":
    main()
