"""What one draft forward costs against one target forward on this machine's CPU.

    python -m research.draft_cost [DRAFT ...] [--context 200] [--repeats 40]

For the target and each draft (a folder; default: the shipped draft), the median time of
``--repeats`` forwards of one token after ``--context`` cached ones (the cache is rolled back after
each), on the calling thread with torch's default thread count; drafts are timed twice, with fp32
products and with the int8 weight copies that drafting uses on the CPU by default
(models/linear.py). Prints milliseconds and the ratio to the target's forward: the draft issue's
bound is 0.1.
"""
from mirror_sd import load_pair
from mirror_sd.tools.tradeoff import forward_ms


def main():
    import argparse

    parser = argparse.ArgumentParser(prog="python -m research.draft_cost", description=__doc__.splitlines()[0])
    parser.add_argument("drafts", nargs="*", default=["default"])
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    pair = load_pair()
    target_ms = forward_ms(pair.target, args.context, args.repeats)
    print(f"target: {target_ms:.2f} ms")
    for draft in args.drafts:
        if draft != "default":
            pair.use_draft(draft)
        for int8 in (False, True):
            pair.int8_drafting = int8  # the draft converted to int8 products, or back to fp32
            ms = forward_ms(pair.draft, args.context, args.repeats)
            print(f"{pair.draft_name}, {'int8' if int8 else 'fp32'}: {ms:.2f} ms, {ms / target_ms:.3f}x the target")


if __name__ == "__main__":
    main()
