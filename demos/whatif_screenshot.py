"""Retake docs/whatif.png (the app's What if tab after a real race, on the paper-scale profile),
docs/whatif-map.png (its answer: each method at its best settings and the map of who leads) and
docs/whatif-capacity.png (its draft-capacity view and the paper's Table 1).

    python demos/whatif_screenshot.py ["prompt"] [max new tokens]
    python demos/whatif_screenshot.py --recorded qa     # a recorded race of app/recorded instead: no model runs

Serves the app on the embedded default pair, drives Debian's Chromium with Playwright, runs the
race with every method on (or opens the recorded race whose label starts with the given text),
opens the What if tab (profile paper-14b) and captures it. The race is measured; everything on
the tab is MODELLED from its steps, as the tab says.
"""
import sys

from app_browser import DOCS, app_page, wait_for_race


def main():
    from playwright.sync_api import expect

    recorded = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--recorded" else None
    prompt = sys.argv[1] if len(sys.argv) > 1 and not recorded else "Why is the sky blue?"
    max_new = sys.argv[2] if len(sys.argv) > 2 and not recorded else "48"
    with app_page(1280, 1000) as page:
        if recorded:
            page.locator("#recorded input").click()
            page.locator("#recorded input").fill(recorded)
            page.keyboard.press("ArrowDown")
            page.keyboard.press("Enter")
        else:
            expect(page.locator("#notice")).to_contain_text("Target lane", timeout=600_000)
            page.get_by_label("Prompt").fill(prompt)
            page.get_by_label("Max new tokens").fill(max_new)
            page.locator("#run").click()
        wait_for_race(page)
        page.get_by_role("tab", name="What if").click()
        expect(page.locator("#whatif-timeline .js-plotly-plot")).to_be_visible(timeout=60_000)
        expect(page.locator("#whatif-curve .js-plotly-plot")).to_be_visible(timeout=60_000)
        expect(page.locator("#whatif-map .js-plotly-plot")).to_be_visible(timeout=60_000)
        page.wait_for_timeout(1500)
        top = page.locator("#whatif-banner").bounding_box()["y"] - 12  # the tab, from its banner down
        height = page.evaluate("document.documentElement.scrollHeight") - top
        page.screenshot(path=DOCS / "whatif.png", full_page=True, clip=dict(x=0, y=top, width=1280, height=height))
        between(page, "#whatif-verdict", "#whatif-map-text", DOCS / "whatif-map.png")
        between(page, "#whatif-curve", "#whatif-reported", DOCS / "whatif-capacity.png")
    print(f"wrote {DOCS / 'whatif.png'}, {DOCS / 'whatif-map.png'} and {DOCS / 'whatif-capacity.png'}")


def between(page, first: str, last: str, path):
    """Capture the page from element ``first``'s top to element ``last``'s bottom, full width."""
    page.locator(first).scroll_into_view_if_needed()
    top = page.locator(first).bounding_box()["y"] + page.evaluate("window.scrollY") - 12
    box = page.locator(last).bounding_box()
    bottom = box["y"] + box["height"] + page.evaluate("window.scrollY") + 12
    page.screenshot(path=path, full_page=True, clip=dict(x=0, y=top, width=1280, height=bottom - top))


if __name__ == "__main__":
    main()
