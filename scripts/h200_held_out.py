"""The what-if model on the app's six recorded H200 races: each method's speedup over vanilla as measured
in the race and as modelled on the ``h200-embedded`` profile.

    python -m scripts.h200_held_out [--profile h200-embedded] [--by-kind]

For each race (``app/recorded/nvidia-h200/*.json``) and method: the measured speedup, the method's
tokens/s over vanilla's in the same race (what the app's cards show: tokens over the recording's
``wall_s``), the modelled one (``whatif.summary``: vanilla modelled on the profile for the same prompt
and tokens, over the method's trace re-timed on it) and the model's relative error (modelled /
measured - 1); then per method pooled over the six races (summed tokens over summed seconds, both
sides). Prints a markdown table and writes ``docs/whatif-h200-held-out.csv``. ``--by-kind`` adds
each method's measured and modelled ms per span kind (``scripts.whatif_check.by_kind``).

The profile's stage costs come from gpu-check's replays, not from these runs; what it fitted (each
stage's ``context_ms``, EAGLE's ``eagle_head_eager``, the host's ``step_ms`` and ``phase_ms``:
``scripts.derive_h200_context``) it fitted on the graphs-on bench's ``-02`` prompts only, and these
races are that bench's ``-01`` prompts (``scripts.record_races --from-bench``): the whole profile is
held out here.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from app.held_out import held_out_table, runs
from mirror_sd.tools import whatif

CSV = Path(__file__).resolve().parents[1] / "docs" / "whatif-h200-held-out.csv"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-embedded", help="a shipped profile's name or a profile .json")
    parser.add_argument("--by-kind", action="store_true", help="also measured and modelled ms per span kind")
    args = parser.parse_args(argv)
    table = held_out_table(profile=args.profile)
    print(table.to_markdown(index=False, floatfmt=".3f"))
    if args.profile == "h200-embedded":
        table.to_csv(CSV, index=False, float_format="%.4f")
        print(f"\nwritten: {CSV}")
    if args.by_kind:
        from scripts.whatif_check import by_kind

        rows = [dict(method=r.method, traces=[r.trace]) for r in runs(profile=args.profile).itertuples()]
        kinds = by_kind(rows, whatif.load_profile(args.profile))
        kinds.index = [f"{method} {getattr(kind, 'value', kind)}" for method, kind in kinds.index]
        print()
        print(kinds.to_markdown(floatfmt=(".1f", ".1f", ".1f", ".3f")))


if __name__ == "__main__":
    main()
