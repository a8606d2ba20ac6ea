"""Issue 70, the lecture: every card and results row says where its numbers come from and which models
ran; a link holds the view (race, tab, method, step) and reopens it; the presenter view is readable on a
1280x720 projector with the results in sight; homework mode marks which numbers depend on the load.
The browser tests open recorded races with no model (nothing is decoded)."""
import os
import re
import shutil
from types import SimpleNamespace

import pytest

from app import handlers, links
from app.cards import baseline, card_html
from app.provenance import badge, models
from app.replay import RECORDED, load_race
from app.results_table import FREE, LOAD, table_html

H200_QA = RECORDED / "nvidia-h200" / "qa.json"
H200_LABEL = "qa: Why is the sky blue? (on NVIDIA H200"
NAMES = ("Vanilla", "Speculative decoding", "Speculative Streaming", "Mirror-SD", "EAGLE-2")


def test_cards_and_table_name_the_models_and_the_recording_and_agree_on_every_number():
    _, _, results = load_race(H200_QA)
    rate = baseline(results)
    table = table_html(results)
    assert "target smollm2-135m-instruct (30 layers) + draft draft-smollm2-135m (4 layers)" in table
    assert table.count('data-badge="RECORDED"') == 5 and table.count("NVIDIA H200, 2026-11-27") == 5
    for name, r in results.items():
        card = card_html(r, rate)
        assert 'data-badge="RECORDED"' in card and "NVIDIA H200, 2026-11-27" in card
        assert "smollm2-135m-instruct (30 layers)" in card
        assert ("draft-smollm2-135m" in card) == (name in ("sd", "mirror"))  # only the methods that use it
        assert "Measured live" not in card and "not on this server" in card
        row = re.search(f'<tr data-method="{name}">(.*?)</tr>', table).group(1)
        speed = re.search(r"([\d.]+) tok/s", card).group(1)
        assert f"<td>{speed}</td>" in row  # the table's numbers are the card's
        if name != "vanilla":
            speedup = re.search(r"([\d.]+)× vanilla", card).group(1)
            assert f"<td>{speedup}×</td>" in row


def test_homework_marks_what_depends_on_the_load_and_checks_the_tokens_against_vanilla():
    _, _, results = load_race(H200_QA)
    table = table_html(results, homework=True)
    marks = dict(re.findall(r'<th scope="col" data-load="\w+">([^<]+)<div class="load-mark">([^<]+)</div>', table))
    assert marks == {"tok/s": LOAD, "τ": FREE, "acceptance": FREE, "hit rate": FREE, "speedup": LOAD,
                     "same tokens as vanilla": FREE}
    assert re.findall(r"<td>(reference|yes|no)</td>", table) == ["reference"] + ["yes"] * 4
    bad = dict(results)  # one token changed: that method is caught
    bad["sd"].trace.steps[3].committed = [bad["sd"].trace.steps[3].committed[0] + 1]
    caught = re.findall(r"<td>(reference|yes|no)</td>", table_html(bad, homework=True))
    assert caught == ["reference", "no"] + ["yes"] * 3
    assert "load-mark" not in table_html(results)  # only in homework mode


def test_a_live_run_is_badged_with_this_servers_processor():
    meta = {"target": "t", "target_layers": 2, "draft": "d", "draft_layers": 1,
            "live": {"hardware": "Some CPU, 2 CPU cores", "date": "2026-12-05"}}
    assert badge(meta) == ("LIVE", "this server, Some CPU, 2 CPU cores")
    assert models(meta, "vanilla") == "target t (2 layers)"
    assert models(meta, "mirror") == "target t (2 layers) + draft d (1 layers)"


def test_a_live_race_is_badged_with_this_servers_processor_and_its_models(tiny_pair):
    import threading

    from app.provenance import cpu_name
    from app.race import run_race

    *_, results = run_race(tiny_pair, "t1 t2 t3", ["vanilla", "sd"], threading.Event(), max_new_tokens=8)
    rate = baseline(results)
    for name, r in results.items():
        assert r.trace.meta["live"]["hardware"] == cpu_name()  # the tiny pair runs on this CPU
        card = card_html(r, rate)
        assert 'data-badge="LIVE"' in card and f"this server, {cpu_name()}" in card
        assert f"target {r.trace.meta['target']} (2 layers)" in card
        assert "Measured live on this server" in card and "not on this server" not in card
    assert table_html(results).count('data-badge="LIVE"') == 2


def test_a_link_names_only_the_recorded_races_and_restores_their_view():
    for label, path in links.replay.recorded_races():
        assert links.race_path(links.race_key(path)) == path
    assert links.race_key(H200_QA) == "nvidia-h200/qa"
    assert links.race_path("../../../etc/passwd") is None and links.race_path(None) is None
    request = SimpleNamespace(query_params={"race": "nvidia-h200/qa", "tab": "steps", "method": "eagle",
                                            "step": "30", "present": "1"})
    path, tabs, method, slider, present, homework, linked = links.restore(request)
    assert path["value"] == str(H200_QA) == linked and tabs.selected == "steps"
    assert method["value"] == "eagle" and slider["value"] == 30 and present and not homework
    _, tabs, method, slider, *_, linked = links.restore(SimpleNamespace(query_params={"tab": "nowhere"}))
    assert tabs == method == {"__type__": "update"} and linked == ""


def test_switching_the_method_keeps_the_step_and_a_new_race_keeps_the_method():
    _, _, results = load_race(H200_QA)
    last = results["vanilla"].trace.steps[-1].index
    assert handlers.pick_method(results, "eagle", 30)["value"] == 30
    assert handlers.pick_method(results, "vanilla", 10_000)["value"] == last  # past its end: its last step
    assert handlers.views(results, "eagle").step_method["value"] == "eagle"
    assert handlers.views(results, None).step_method["value"] == "mirror"


# --- in Chromium, on a 1280x720 projector ---------------------------------------------------------------

from test_app_live import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

browser_only = pytest.mark.skipif(not os.path.exists(CHROMIUM) and not shutil.which("chromium"),
                                  reason="Chromium is not installed here (CI installs Debian's chromium)")


@pytest.fixture(scope="module")
def no_model_url():
    """The app as served (its theme, style sheet and scripts), with no model: only recordings open."""
    from app.ui import build_demo, page_style

    def no_model(**devices):
        raise RuntimeError("no model in this test")

    demo = build_demo(pair_factory=no_model)
    _, url, _ = demo.queue(max_size=8).launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                                              quiet=True, **page_style())
    yield url
    demo.close()


def projector(p):
    """Headless Chromium at 1280x720 with the clipboard allowed: (browser, context)."""
    browser = p.chromium.launch(headless=True, args=CHROMIUM_ARGS,
                                executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"))
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    return browser, context


def font_px(page, selector: str) -> float:
    return page.evaluate(f"parseFloat(getComputedStyle(document.querySelector({selector!r})).fontSize)")


def faces(page, selector: str) -> list[str]:
    """The font faces Chromium drew the element's text with."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    return [f["familyName"] for f in cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]]


def expect_view(page, method: str, step: int):
    """The Step-through tab shown at ``method`` and ``step``, on the H200 qa recording, presenter view on."""
    from playwright.sync_api import expect

    expect(page.locator("#sentence")).to_contain_text(f"Step {step} (", timeout=60_000)
    expect(page.get_by_role("tab", name="Step-through")).to_have_attribute("aria-selected", "true")
    expect(page.get_by_label("Method")).to_have_value(method)
    expect(page.locator("#step input[type=number]")).to_have_value(str(step))
    expect(page.locator("#recorded input")).to_have_value(re.compile(re.escape(H200_LABEL)))
    expect(page.locator("body")).to_have_class(re.compile("presenter"))


@browser_only
def test_browser_presenter_view_names_models_and_badges_and_a_copied_link_reopens_the_step(no_model_url):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, context = projector(p)
        page = context.new_page()
        page.goto(no_model_url + "?present=1")
        expect(page.locator("body")).to_have_class(re.compile("presenter"), timeout=60_000)
        page.locator("#recorded input").click()
        page.locator("#recorded input").fill(H200_LABEL)
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        expect(page.locator("#status")).to_contain_text("Recorded on NVIDIA H200", timeout=60_000)
        page.get_by_role("tab", name="Race").click()
        page.evaluate("window.scrollTo(0, 0)")
        table = page.locator("#results-table table.results")
        expect(table).to_be_visible(timeout=30_000)  # the results in sight at scroll 0: not under the explainer
        top = table.bounding_box()["y"]
        assert 0 < top < 720 - 150, top
        expect(page.locator("#how-it-works")).not_to_be_visible()
        expect(page.locator("#small-target-race")).to_contain_text("Why a small target gains little")  # under it
        expect(page.locator("#small-target")).not_to_be_visible()
        expect(page.locator("#results-table .results-models")).to_contain_text(
            "target smollm2-135m-instruct (30 layers) + draft draft-smollm2-135m (4 layers)")
        for title in NAMES:  # every row badged with the recording's machine and day
            row = table.locator("tbody tr", has_text=title)
            expect(row.locator('.badge[data-badge="RECORDED"]')).to_have_text("RECORDED · NVIDIA H200, 2026-11-27")
        for method in ("vanilla", "sd", "ss", "mirror", "eagle"):  # and every card, with its models
            card = page.locator(f"#card-{method}")
            expect(card.locator('.badge[data-badge="RECORDED"]')).to_contain_text("NVIDIA H200, 2026-11-27")
            expect(card.locator(".card-models")).to_contain_text("smollm2-135m-instruct")
        for selector in ("table.results td", "#card-mirror .card-metrics", "#card-mirror .tokens", "#status p"):
            assert font_px(page, selector) >= 20, selector  # a projector's sizes
        assert len(faces(page, "#card-eagle .card-head b")) == 1  # "EAGLE-2" in one face: no odd "A"
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280

        page.get_by_role("tab", name="Step-through").click()
        expect(page.locator("#sentence")).to_contain_text("Step 0 (", timeout=60_000)  # the race's views drawn first
        page.get_by_label("Method").click()
        page.get_by_role("option", name="EAGLE-2", exact=True).click()
        box = page.locator("#step input[type=number]")
        box.fill("30")
        box.press("Enter")
        expect(page.locator("#sentence")).to_contain_text("Step 30 (", timeout=30_000)
        page.get_by_label("Method").click()
        page.get_by_role("option", name="Mirror-SD", exact=True).click()  # another method: the same step
        expect(page.locator("#sentence")).to_contain_text("Step 30 (", timeout=30_000)
        expect(page.locator("#sentence")).to_contain_text("early-exit guesses", timeout=30_000)  # Mirror-SD's
        page.wait_for_function("() => { const el = document.querySelector('#tree .js-plotly-plot');"  # its labels
                               " return el && el._fullLayout.font.size === 18; }", timeout=30_000)  # enlarged
        tabs = page.locator("#tabs > .tab-wrapper")
        page.mouse.wheel(0, 900)  # the tabs stay at the top while the step's charts scroll by
        page.wait_for_timeout(500)
        assert -1 <= tabs.bounding_box()["y"] <= 1

        page.locator("#copy-link").click()
        link = page.locator("#view-link textarea, #view-link input").first
        expect(link).to_have_value(re.compile("race=nvidia-h200%2Fqa"), timeout=30_000)
        url = link.input_value()
        assert page.evaluate("navigator.clipboard.readText()") == url
        for part in ("tab=steps", "method=mirror", "step=30", "present=1"):
            assert part in url, url

        student = context.new_page()  # the link, opened elsewhere: the same race, tab, method and step
        student.goto(url)
        expect_view(student, "Mirror-SD", 30)
        student.reload()  # and a reload keeps it
        expect_view(student, "Mirror-SD", 30)
        browser.close()


@browser_only
def test_browser_homework_mode_marks_the_load_in_the_normal_view(no_model_url):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, context = projector(p)
        page = context.new_page()
        page.set_viewport_size({"width": 1600, "height": 900})
        page.goto(no_model_url + "?homework=1&race=nvidia-h200/qa")
        table = page.locator("#results-table table.results")
        expect(table).to_be_visible(timeout=60_000)
        expect(table.locator('th[data-load="yes"]', has_text="tok/s")).to_contain_text(LOAD)
        expect(table.locator('th[data-load="no"]', has_text="τ")).to_contain_text(FREE)
        expect(table.locator("tbody tr", has_text="EAGLE-2")).to_contain_text("yes")
        expect(page.locator("body")).not_to_have_class(re.compile("presenter"))
        expect(page.locator("#card-eagle .card-metrics")).to_contain_text("tok/s")  # the cards are still there
        page.locator("#homework input").uncheck()  # off: the table goes, the link forgets it
        expect(table).not_to_be_visible(timeout=30_000)
        assert "homework" not in page.evaluate("location.search")
        browser.close()
