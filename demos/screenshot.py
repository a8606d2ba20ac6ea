"""Retake the README's screenshots of the app from a real race: docs/app-how.png (the How it works
panel, on a 1280x720 projector-sized window), docs/app.png (the race, with a guess revealed) and
docs/app-steps.png (the step-through on Mirror-SD, with its hit question answered).

    python demos/screenshot.py ["prompt"]

Serves the app on the embedded default pair, drives Debian's Chromium with Playwright (no
`playwright install`), runs the race with every method on, and captures the race and the
step-through tabs. Every number in the pictures comes from that run on this machine.
"""
import sys

from app_browser import DOCS, app_page, wait_for_race


def main():
    from playwright.sync_api import expect

    prompt = sys.argv[1] if len(sys.argv) > 1 else "Why is the sky blue?"
    with app_page(1280, 720) as page:
        expect(page.locator("#notice")).to_contain_text("Target lane", timeout=600_000)
        page.locator("#how").screenshot(path=DOCS / "app-how.png")
        page.get_by_role("button", name="How it works").first.click()  # fold it away for the race
        page.set_viewport_size({"width": 1280, "height": 1000})
        page.get_by_label("Prompt").fill(prompt)
        page.locator("#guess").get_by_text("Mirror-SD", exact=True).click()
        page.locator("#run").click()
        wait_for_race(page)
        expect(page.locator("#timeline .js-plotly-plot")).to_be_visible(timeout=60_000)
        expect(page.locator("#reveal")).to_contain_text("fastest", timeout=60_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=DOCS / "app.png", full_page=True)
        page.get_by_role("tab", name="Step-through").click()
        expect(page.locator("#sentence")).to_contain_text("Step 0", timeout=60_000)
        page.locator("#next").click()
        expect(page.locator("#sentence")).to_contain_text("Step 1", timeout=60_000)
        page.locator("#hit-guess").get_by_text("Yes, a hit").click()
        expect(page.locator("#hit-reveal")).to_contain_text("The next step, step", timeout=60_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=DOCS / "app-steps.png", full_page=True)
    print(f"wrote {DOCS / 'app-how.png'}, {DOCS / 'app.png'} and {DOCS / 'app-steps.png'}")

if __name__ == "__main__":
    main()
