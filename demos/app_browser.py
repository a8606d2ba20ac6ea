"""What the screenshot demos share: the app served on the embedded default pair, a page of it in
Debian's Chromium driven by Playwright (headless, no `playwright install`), and the wait for a race
to end."""
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DOCS = ROOT / "docs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@contextmanager
def app_page(width: int, height: int):
    """A page of the freshly served app in a width x height window; browser and server close after."""
    from playwright.sync_api import sync_playwright

    from app.ui import build_demo, page_style

    demo = build_demo()
    _, url, _ = demo.queue().launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **page_style())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url)
            yield page
            browser.close()
    finally:
        demo.close()


def wait_for_race(page):
    """Until every method's card has finished: neither waiting for its turn nor running."""
    from playwright.sync_api import expect

    from mirror_sd import METHODS

    for name in METHODS:
        card = page.locator(f"#card-{name} .card")
        expect(card).not_to_have_attribute("data-state", "waiting", timeout=600_000)
        expect(card).not_to_have_attribute("data-state", "running", timeout=600_000)
