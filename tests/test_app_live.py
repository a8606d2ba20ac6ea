"""The launched app on a tiny pair: driven through its API with gradio_client, and in Chromium with Playwright."""
import json
import os
import shutil
from pathlib import Path

import pytest

from mirror_sd import METHODS

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
TINY_METHODS = ("vanilla", "sd", "mirror")  # the methods a tiny target + draft pair can run
MIRROR_LANES = {"target, GPU role, cpu:0", "draft, NPU role, cpu:1"}


def open_app(playwright, url: str, prompt: str = "t1 t2 t3"):
    """Headless Chromium on the app, with the prompt typed in: (browser, page)."""
    browser = playwright.chromium.launch(headless=True, args=CHROMIUM_ARGS,
                                         executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.get_by_label("Prompt").fill(prompt)
    return browser, page


@pytest.fixture(scope="module")
def app_url(tiny_pair):
    from app.ui import build_demo

    demo = build_demo(pair_factory=lambda **devices: tiny_pair)
    _, url, _ = demo.queue(max_size=8).launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                                              quiet=True)
    yield url
    demo.close()


def test_api_run_returns_text_metrics_and_a_two_lane_timeline(app_url):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    status, *cards = client.predict(prompt_text="t1 t2 t3", max_new=12, api_name="/run")
    assert status.startswith("Done.")
    assert len(cards) == len(METHODS)
    for name, card in zip(METHODS, cards):
        if name in TINY_METHODS:
            assert 'data-state="length"' in card and "12 tokens" in card and "tok/s" in card and 'class="tok"' in card
        else:  # needs more than the tiny pair has: the card says why
            assert 'data-state="length"' in card or 'class="card-error"' in card
    timeline, utilisation, files, _, zoomed = client.predict(api_name="/views")  # same session: the race just run
    figure = json.loads(timeline["plot"])
    row = [a["text"] for a in figure["layout"]["annotations"]].index("Mirror-SD") + 1  # subplot titles, in order
    axis = "y" if row == 1 else f"y{row}"
    lanes = {y for d in figure["data"] if d["type"] == "bar" and d.get("yaxis", "y") == axis for y in d["y"]}
    assert lanes == MIRROR_LANES
    assert len(files) >= 4 * len(TINY_METHODS) and all(Path(f).exists() for f in files)
    steps = [a["text"] for a in json.loads(zoomed["plot"])["layout"]["annotations"]]  # one typical step each, zoomed
    assert any(t.startswith("Mirror-SD: after a hit") for t in steps) and any(t.startswith("Vanilla: ") for t in steps)


def test_api_reports_an_empty_prompt_without_a_traceback(app_url):
    from gradio_client import Client

    status, *cards = Client(app_url, verbose=False).predict(prompt_text="  ", api_name="/run")
    assert status == "**Cannot run:** the prompt is empty: type some text or pick an example."


def test_api_names_its_parameters_and_says_when_it_changes_a_setting(app_url):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    names = [p["parameter_name"] for p in client.view_api(return_format="dict", print_info=False)
             ["named_endpoints"]["/run"]["parameters"]]
    assert names[:10] == ["prompt_text", "methods", "max_new", "temperature", "top_p", "seed", "target_device",
                          "draft_device", "runs", "show_rejected"]
    assert "mirror_gamma" in names and not any(n.startswith("param_") for n in names)
    status, *cards = client.predict(prompt_text="t1 t2 t3", methods=["vanilla", "sd"], max_new=0, temperature=-1,
                                    runs=2, api_name="/run")
    assert "Max new tokens: 0 is out of range (1 to 512); using 1." in status and "Temperature: -1" in status
    assert "Done." in status
    vanilla, sd = cards[:2]
    assert ">1 token<" in vanilla and "median of 2 runs" in sd


@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not shutil.which("chromium"),
                    reason="Chromium is not installed here (CI installs Debian's chromium: see .ci/run)")
def test_browser_runs_the_race_and_steps_through_it(app_url, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, app_url)
        page.locator("#run").click()
        for name in TINY_METHODS:  # every card fills with text and the engine's numbers
            card = page.locator(f"#card-{name} .card")
            expect(card).to_have_attribute("data-state", "length", timeout=60_000)
            expect(card.locator(".tok").first).to_be_visible()
            expect(card.locator(".card-metrics")).to_contain_text("tok/s")
        expect(page.locator("#timeline .js-plotly-plot")).to_be_visible(timeout=30_000)
        expect(page.locator("#timeline .bars path").first).to_be_attached()
        page.screenshot(path=tmp_path / "race.png", full_page=True)
        page.get_by_role("tab", name="Step-through").click()
        expect(page.locator("#sentence")).to_contain_text("Step 0", timeout=30_000)
        page.locator("#next").click()
        expect(page.locator("#sentence")).to_contain_text("Step 1", timeout=30_000)
        page.locator("#next").click()
        expect(page.locator("#sentence")).to_contain_text("Step 2", timeout=30_000)
        page.locator("#prev").click()
        expect(page.locator("#sentence")).to_contain_text("Step 1", timeout=30_000)
        page.screenshot(path=tmp_path / "step.png", full_page=True)
        browser.close()
    assert (tmp_path / "race.png").stat().st_size > 10_000


@pytest.fixture(scope="module")
def slow_app_url(tiny_dirs):
    """The app on a tiny pair whose target sleeps 80 ms per forward: a race long enough to stop."""
    import time

    from app.ui import build_demo
    from mirror_sd import load_pair

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    pair.target.register_forward_pre_hook(lambda module, args: time.sleep(0.08))
    demo = build_demo(pair_factory=lambda **devices: pair)
    _, url, _ = demo.queue(max_size=8).launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                                              quiet=True)
    yield url
    demo.close()


@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not shutil.which("chromium"),
                    reason="Chromium is not installed here (CI installs Debian's chromium: see .ci/run)")
def test_browser_stop_ends_the_race_and_keeps_the_text(slow_app_url):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, slow_app_url)
        page.locator("#run").click()
        vanilla = page.locator("#card-vanilla .card")
        expect(vanilla.locator(".tok").nth(3)).to_be_attached(timeout=60_000)  # decoding, tokens on screen
        page.locator("#stop").click()
        expect(vanilla).to_have_attribute("data-state", "stopped", timeout=30_000)
        kept = vanilla.locator(".tok").count()
        assert 4 <= kept < 48  # stopped part-way (48 tokens is the default length), the committed text kept
        for name in [n for n in METHODS if n != "vanilla"]:  # the methods after it never ran
            expect(page.locator(f"#card-{name} .card")).to_have_attribute("data-state", "skipped", timeout=30_000)
        expect(page.get_by_text("Stopped: the text so far is kept.")).to_be_visible(timeout=30_000)
        browser.close()
