"""Retake docs/zoomed-step-cpu.png and docs/zoomed-step-h200.png: the Race tab's view of one typical
step of each method, zoomed on one millisecond axis, for the recorded qa race on this CPU and on an H200.

    python demos/zoomed_step_screenshot.py

Opens each recorded race (no model runs) in Debian's Chromium and captures the zoomed view.
"""
from app_browser import DOCS, app_page, wait_for_race

RACES = (("qa: Why is the sky blue?", "zoomed-step-cpu.png", lambda label: "(on " not in label),
         ("NVIDIA H200", "zoomed-step-h200.png", lambda label: "qa:" in label))


def main():
    from playwright.sync_api import expect

    with app_page(1280, 1000) as page:
        for typed, name, _ in RACES:
            page.locator("#recorded input").click()
            page.locator("#recorded input").fill("qa")
            options = page.get_by_role("option")
            expect(options.first).to_be_visible(timeout=30_000)
            labels = options.all_inner_texts()
            index = next(i for i, label in enumerate(labels) if ("(on" in label) == (typed == "NVIDIA H200"))
            options.nth(index).click()
            wait_for_race(page)
            zoomed = page.locator("#zoomed-step")
            expect(zoomed).to_contain_text("after a hit", timeout=60_000)
            page.wait_for_timeout(1500)
            zoomed.screenshot(path=DOCS / name)
            print(f"wrote {DOCS / name}")


if __name__ == "__main__":
    main()
