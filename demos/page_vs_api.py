"""Does the page slow the race it shows? The README's example prompt raced with every method, a few
times, interleaved: with the page open in headless Chromium (its Run button, the cards drawn live) and
through the Gradio API with no page open; per mode, each method's tokens/s, its speedup over vanilla
and the ranking. Best run alone on a quiet machine: other work on the cores moves the numbers.

    python demos/page_vs_api.py --rounds 3              # the measurement (all methods, 48 new tokens)
    python demos/page_vs_api.py --rounds 1 --max-new 8  # a quick check that it runs

Rounds alternate which mode goes first (page, api; api, page; ...), so neither always runs on a machine
the other has just warmed. A first race through the API, discarded, loads and warms the models.
"""
import argparse
import re
import statistics
import time

from app_browser import CHROMIUM

from mirror_sd import METHODS

PROMPT = "Why is the sky blue?"  # the README's example prompt
TOKS = re.compile(r'data-metric="tok/s"[^>]*>([0-9.]+)')


def tokens_per_s(cards: list[str]) -> dict[str, float]:
    """{method: tokens/s} from the cards' HTML (one card per registered method, in registry order)."""
    out = {}
    for name, card in zip(METHODS, cards):
        found = TOKS.search(card or "")
        if found and 'data-state="length"' in card or found and 'data-state="eos"' in card:
            out[name] = float(found.group(1))
    return out


def race_api(url: str, max_new: int) -> dict[str, float]:
    from gradio_client import Client

    status, *cards = Client(url, verbose=False).predict(prompt_text=PROMPT, max_new=max_new, api_name="/run")
    if not status.startswith("Done."):
        raise SystemExit(f"the race did not finish: {status}")
    return tokens_per_s(cards[:len(METHODS)])


def race_page(playwright, url: str, max_new: int) -> dict[str, float]:
    from playwright.sync_api import expect

    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu"])
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        expect(page.locator("#notice")).to_contain_text("Target lane", timeout=600_000)  # the models loaded
        page.get_by_label("Prompt").fill(PROMPT)
        page.locator("#max-tokens input").fill(str(max_new))
        page.wait_for_timeout(1000)  # the page idle before the race, as a visitor's would be
        page.locator("#run").click()
        expect(page.locator("#status")).to_contain_text("Done.", timeout=600_000)
        return tokens_per_s([page.locator(f"#card-{n}").inner_html() for n in METHODS])
    finally:
        browser.close()


def summary(races: list[dict[str, float]]) -> tuple[dict, dict, list[str]]:
    """Per method: median tokens/s, median speedup over vanilla (race by race); the ranking by speedup."""
    rates = {m: statistics.median([r[m] for r in races if m in r]) for m in METHODS if any(m in r for r in races)}
    speedups = {m: statistics.median([r[m] / r["vanilla"] for r in races if m in r and r.get("vanilla")])
                for m in rates}
    return rates, speedups, sorted(speedups, key=speedups.get, reverse=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="races per mode")
    parser.add_argument("--max-new", type=int, default=48, help="new tokens per method (the app's default: 48)")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from app.ui import build_demo, page_style

    demo = build_demo()
    _, url, _ = demo.queue().launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **page_style())
    races: dict[str, list] = {"page": [], "api": []}
    try:
        began = time.perf_counter()
        race_api(url, args.max_new)  # discarded: loads the models and runs the one-off warm-up
        print(f"models loaded and warmed in {time.perf_counter() - began:.0f} s; prompt {PROMPT!r}, "
              f"{args.max_new} new tokens, {args.rounds} round(s)")
        with sync_playwright() as p:
            for k in range(args.rounds):
                for mode in ("page", "api") if k % 2 == 0 else ("api", "page"):
                    rates = race_page(p, url, args.max_new) if mode == "page" else race_api(url, args.max_new)
                    races[mode].append(rates)
                    print(f"round {k + 1}, {mode:4}: " + ", ".join(f"{m} {v:.1f}" for m, v in rates.items())
                          + " tokens/s")
    finally:
        demo.close()
    ranks = {}
    for mode, done in races.items():
        rates, speedups, ranks[mode] = summary(done)
        print(f"\n{mode} ({'page open in Chromium' if mode == 'page' else 'Gradio API, no page open'}), "
              f"median of {len(done)}:")
        for m in rates:
            print(f"  {m:8} {rates[m]:6.1f} tokens/s  {speedups[m]:.2f}x vanilla")
        print("  ranking: " + " > ".join(ranks[mode]))
    print("\nsame ranking in both modes" if ranks["page"] == ranks["api"] else "\nthe rankings differ")


if __name__ == "__main__":
    main()
