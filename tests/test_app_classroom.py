"""The classroom page (issue 35) in Chromium on a tiny pair: the How-it-works panel, a tooltip, predict
then reveal, settings brought into range with a message, the 800 px and 1280x720 layouts, the
loading message, the place in line, and a closed tab ending its race."""
import os
import shutil
import threading
import time

import pytest

from test_app_live import CHROMIUM, open_app, slow_app_url  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM) and not shutil.which("chromium"),
                                reason="Chromium is not installed here (CI installs Debian's chromium: see .ci/run)")
RACED = ("Vanilla", "Speculative decoding", "Mirror-SD")  # what a tiny pair can run


def launch(factory):
    """The app as served (its theme, style sheet and scripts) on the pair ``factory`` loads: (demo, url)."""
    from app.ui import build_demo, page_style

    demo = build_demo(pair_factory=factory)
    _, url, _ = demo.queue(max_size=8).launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                                              quiet=True, **page_style())
    return demo, url


def pick_methods(page, titles=RACED):
    """Untick every method but ``titles`` (the race's Methods box)."""
    for title in ("Vanilla", "Speculative decoding", "Speculative Streaming", "Mirror-SD", "EAGLE-2"):
        if title not in titles:
            page.get_by_role("checkbox", name=title, exact=True).uncheck()


@pytest.fixture(scope="module")
def class_url(tiny_pair):
    demo, url = launch(lambda **devices: tiny_pair)
    yield url
    demo.close()


def test_browser_teaches_predicts_reveals_and_fits_800px(class_url):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        page.set_viewport_size({"width": 800, "height": 900})
        panel = page.locator("#how-it-works")  # open on a first visit: a picture per idea, the Mirror-SD cost
        expect(panel).to_be_visible()
        assert panel.locator("svg").count() == 4
        expect(panel).to_contain_text("Speculative Streaming: the target drafts for itself")
        expect(panel).to_contain_text("prefix + channel + max(suffix, rollouts) + rendezvous")
        expect(panel).to_contain_text("acceptance and speed are different things")

        pick_methods(page)
        page.locator("#max-tokens input").fill("0")  # out of range: brought into range, with a message
        page.locator("#temperature input").fill("-1")
        page.locator("#guess").get_by_text("Mirror-SD", exact=True).click()  # predict before any number is in
        expect(page.locator("#reveal")).to_contain_text("Your guess: Mirror-SD. The answer comes when the race ends.")
        page.locator("#run").click()
        expect(page.locator("#settings-note")).to_contain_text("Max new tokens: 0 is out of range (1 to 512); using 1.")
        expect(page.locator("#settings-note")).to_contain_text("Temperature: -1 is out of range")
        expect(page.locator("#max-tokens input")).to_have_value("1")
        expect(page.locator("#temperature input")).to_have_value("0")
        # one token is all prefill: no speedup on a card, no winner (issue 63)
        expect(page.locator("#reveal")).to_contain_text("too few to time", timeout=60_000)
        expect(page.locator("#status")).to_contain_text("Done.")
        expect(page.locator("#card-sd .card-metrics")).to_contain_text("too short to time")
        expect(page.locator("#card-sd .card-metrics")).not_to_contain_text("× vanilla")

        page.locator("#max-tokens input").fill("12")
        page.locator("#guess").get_by_text("Mirror-SD", exact=True).click()
        page.locator("#run").click()
        expect(page.locator("#reveal")).to_contain_text("was fastest", timeout=60_000)  # the reveal, with why
        expect(page.locator("#reveal")).to_contain_text("tokens per step")
        expect(page.locator("#card-sd .card")).to_have_attribute("data-state", "length", timeout=60_000)
        expect(page.locator("#card-sd .card-metrics")).to_contain_text("12 tokens", timeout=60_000)
        expect(page.locator("#status")).to_contain_text("Done.", timeout=60_000)
        accepted = page.locator('#card-sd .metric[data-metric="accepted"]')  # a tooltip in plain words
        assert "It is not speed" in accepted.get_attribute("title")
        assert page.locator('#card-sd .metric[data-metric="overlap"]').count() == 0  # sd's lanes take turns
        assert page.locator('#card-mirror .metric[data-metric="overlap"]').count() == 1
        assert page.locator("#card-sd .tok.rejected").count() == 0  # the answer reads as text ...
        page.locator("#show-rejected input").check()  # ... rejected draft tokens on request
        expect(page.locator("#card-sd .tok.rejected").first).to_be_attached(timeout=30_000)

        assert page.evaluate("document.documentElement.scrollWidth") <= 800  # 800 px: no sideways scrolling
        assert page.locator("#card-sd").bounding_box()["width"] >= 300  # and cards wide enough to read

        page.get_by_role("tab", name="Step-through").click()  # opens on Mirror-SD, with its hit question
        expect(page.locator("#sentence")).to_contain_text("Step 0", timeout=30_000)
        expect(page.get_by_label("Method")).to_have_value("Mirror-SD")
        page.locator("#hit-guess").get_by_text("Yes, a hit").click()
        expect(page.locator("#hit-reveal")).to_contain_text("The next step, step 1, was a", timeout=30_000)
        expect(page.locator("#hit-reveal")).to_contain_text("Step 1")

        page.reload()  # a second visit: the panel starts closed
        expect(page.locator("#notice")).to_contain_text("Target lane", timeout=30_000)
        expect(page.locator("#how-it-works")).not_to_be_visible()
        browser.close()


def test_browser_says_the_models_are_loading(tiny_pair):
    from playwright.sync_api import expect, sync_playwright

    def slow(**devices):
        time.sleep(15)  # a first load on a fresh machine
        return tiny_pair

    demo, url = launch(slow)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url)
            second = browser.new_page(viewport={"width": 1280, "height": 720})  # a second visitor, on a projector,
            second.goto(url)  # arriving during the load, sees it too
            for visitor in (page, second):
                expect(visitor.locator("#notice")).to_contain_text("Loading the models", timeout=15_000)
            for visitor in (page, second):
                expect(visitor.locator("#notice")).to_contain_text("Target lane", timeout=30_000)
            assert second.evaluate("document.documentElement.scrollWidth") <= 1280  # 1280x720: no sideways scroll
            browser.close()
    finally:
        demo.close()


def test_browser_closing_the_tab_ends_the_race(tiny_dirs):
    """A second visitor sees their place in line while the first races; each leaves (the waiting one
    first): the server's lanes stop within a few seconds."""
    from playwright.sync_api import expect, sync_playwright

    from mirror_sd import load_pair

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    forwards = []

    def slow_forward(module, args):  # 80 ms a target forward: a race long enough to leave
        forwards.append(time.perf_counter())
        time.sleep(0.08)

    pair.target.register_forward_pre_hook(slow_forward)
    demo, url = launch(lambda **devices: pair)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url)
            page.locator("#max-tokens input").fill("180")  # within the tiny context of 256
            page.locator("#run").click()
            expect(page.locator("#card-vanilla .card .tok").nth(5)).to_be_attached(timeout=60_000)
            second = browser.new_page(viewport={"width": 1280, "height": 900})
            second.goto(url)
            second.get_by_label("Prompt").fill("t1 t2")
            second.locator("#run").click()
            expect(second.locator("#wait")).to_contain_text("Waiting your turn: 1 race is ahead of yours",
                                                            timeout=30_000)
            second.close()  # the waiting visitor leaves: their race never starts
            page.close()  # the racing one leaves mid-race
            closed = time.perf_counter()
            time.sleep(6)
            browser.close()
        late = [t for t in forwards if t > closed + 3]
        assert not late, f"{len(late)} target forwards more than 3 s after the tab closed"
        assert not any(t.name == "mirror-sd-load" for t in threading.enumerate())
    finally:
        demo.close()


def test_browser_answers_a_guess_on_a_recorded_race_and_clears_it_for_a_live_one(class_url):
    """A guess on a recorded H200 race is answered at once (its numbers are on the page); a live race
    then clears the recording's name from the dropdown and its timeline, and draws its own (issue 63)."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        page.locator("#recorded input").click()
        page.locator("#recorded input").fill("NVIDIA H200")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("Enter")
        expect(page.locator("#status")).to_contain_text("Recorded on NVIDIA H200", timeout=60_000)
        expect(page.locator("#timeline")).to_contain_text("stream", timeout=60_000)  # the GPU's two streams
        page.locator("#guess").get_by_text("Mirror-SD", exact=True).click()
        expect(page.locator("#reveal")).not_to_contain_text("The answer comes when the race ends")
        expect(page.locator("#reveal")).to_contain_text("fastest", timeout=30_000)
        pick_methods(page)
        page.get_by_label("Prompt").fill("t1 t2 t3")
        page.locator("#max-tokens input").fill("12")
        page.locator("#run").click()
        expect(page.locator("#recorded input")).to_have_value("", timeout=30_000)
        expect(page.locator("#status")).to_contain_text("Done.", timeout=60_000)
        expect(page.locator("#timeline")).not_to_contain_text("stream", timeout=30_000)
        expect(page.locator("#timeline")).to_contain_text("cpu")
        browser.close()


def test_browser_steps_through_a_recorded_race_with_no_model():
    """While no model can load, a recorded race opens from the dropdown and steps through."""
    from playwright.sync_api import expect, sync_playwright

    def no_model(**devices):
        raise RuntimeError("no model in this test")

    demo, url = launch(no_model)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url)
            expect(page.locator("#notice")).to_contain_text("could not be loaded", timeout=60_000)  # no traceback
            page.locator("#recorded input").click()
            page.locator("#recorded input").fill("qa")
            page.keyboard.press("ArrowDown")
            page.keyboard.press("Enter")
            expect(page.locator("#status")).to_contain_text("Recorded on", timeout=60_000)
            expect(page.locator("#card-mirror")).to_contain_text("tok/s")
            page.get_by_role("tab", name="Step-through").click()
            expect(page.locator("#sentence")).to_contain_text("Step 0", timeout=30_000)
            page.locator("#next").click()
            expect(page.locator("#sentence")).to_contain_text("Step 1", timeout=30_000)
            browser.close()
    finally:
        demo.close()



def open_recorded(page, label: str):
    """Open the recorded race whose dropdown label holds ``label``."""
    page.locator("#recorded input").click()
    page.locator("#recorded input").fill(label)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    expect_status(page, "Recorded on")


def expect_status(page, text: str, timeout: int = 60_000):
    from playwright.sync_api import expect

    expect(page.locator("#status")).to_contain_text(text, timeout=timeout)


def drag_timeline(page, start=0.2, end=0.5):
    """Drag across the middle of the race timeline's first row, from ``start`` to ``end`` of its width."""
    area = page.locator("#timeline .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + start * box["width"], y)
    page.mouse.down()
    for i in range(1, 11):
        page.mouse.move(box["x"] + (start + (end - start) * i / 10) * box["width"], y + 1)
    page.mouse.up()


TIMELINE_RANGE = "() => document.querySelector('#timeline .js-plotly-plot')._fullLayout.xaxis.range"
CURSORS = "() => (document.querySelector('#timeline .js-plotly-plot').layout.shapes || []).map(s => s.x0)"


def test_browser_zooms_the_timeline_and_keeps_the_zoom_through_a_replay(class_url):
    """A drag on a live race's timeline zooms its time axis, and the zoom stays: after the race's views,
    and through a replay, whose cursor moves on the chart without redrawing it (issue 63)."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        pick_methods(page)
        page.locator("#max-tokens input").fill("24")
        page.locator("#run").click()
        expect_status(page, "Done.")
        expect(page.locator("#timeline")).to_contain_text("cpu", timeout=30_000)
        page.wait_for_timeout(1000)
        whole = page.evaluate(TIMELINE_RANGE)
        drag_timeline(page)
        page.wait_for_timeout(500)
        zoomed = page.evaluate(TIMELINE_RANGE)
        assert whole[0] < zoomed[0] < zoomed[1] < whole[1] and zoomed[1] - zoomed[0] < 0.5 * (whole[1] - whole[0])
        page.wait_for_timeout(2000)
        assert page.evaluate(TIMELINE_RANGE) == zoomed  # it stays
        page.get_by_role("button", name="Replay the race").click()
        page.wait_for_function("() => (document.querySelector('#timeline .js-plotly-plot').layout.shapes || [])"
                               ".length > 0", timeout=30_000)  # the replay's cursor, on the chart shown
        assert page.evaluate(TIMELINE_RANGE) == zoomed
        page.wait_for_function(CURSORS.replace("map(s => s.x0)", "length === 0"), timeout=60_000)  # replay over
        assert page.evaluate(TIMELINE_RANGE) == zoomed
        browser.close()


def test_browser_replays_a_recorded_race_smoothly_with_no_overlay_and_no_early_done(class_url):
    """Replay of a recorded race: the cards move many times a second, say "replaying" (not "done") until
    their run's end on the replay clock, carry no progress overlay, and end with their numbers; an H200
    race, a tenth of a second long, replays slowed down and says so (issue 63)."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        open_recorded(page, "qa: ")  # this CPU's: 2.3 s on its own clock
        expect(page.locator("#card-mirror .card")).to_have_attribute("data-state", "length")
        expect(page.locator("#timeline")).to_contain_text("cpu", timeout=30_000)
        page.wait_for_timeout(1500)  # the timeline drawn (a second of this CPU's time), before the replay
        page.evaluate("""() => { window.__seen = [];
            new MutationObserver(() => window.__seen.push([performance.now(),
                [...document.querySelectorAll('#cards .card')].map(c => c.dataset.state).join(),
                [...document.querySelectorAll('#cards .wrap')].some(w => !w.classList.contains('hide')
                                                                         && w.textContent.includes('processing'))]))
              .observe(document.querySelector('#cards'), {subtree: true, childList: true, characterData: true}); }""")
        page.get_by_role("button", name="Replay the race").click()
        expect(page.locator("#card-vanilla .card")).to_have_attribute("data-state", "replaying", timeout=30_000)
        expect(page.locator("#card-vanilla .card-state")).to_have_text("replaying…")
        expect(page.locator("#card-vanilla .card-metrics")).to_have_text("")
        expect(page.locator("#card-vanilla .card")).to_have_attribute("data-state", "length", timeout=30_000)
        expect(page.locator("#card-vanilla .card-metrics")).to_contain_text("tok/s")
        seen = page.evaluate("window.__seen")
        assert not any(overlay for _, _, overlay in seen)  # no "processing | 0.5/7.4s" over the titles
        replaying = [t for t, states, _ in seen if "replaying" in states]
        assert len(replaying) >= 15 and replaying[-1] - replaying[0] > 1500  # smooth: many frames a second

        open_recorded(page, "qa: Why is the sky blue? (on NVIDIA H200")
        page.get_by_role("button", name="Replay the race").click()
        expect(page.locator("#card-mirror .card-state")).to_contain_text("slower than measured", timeout=30_000)
        expect(page.locator("#card-mirror .card")).to_have_attribute("data-state", "length", timeout=30_000)
        browser.close()


def test_browser_names_a_recordings_devices_then_the_live_ones(class_url):
    """The device line above the tabs names an H200 recording's devices while it is open (from the
    recording), and this server's lanes again when a live race starts (issue 63)."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        notice = page.locator("#notice")
        expect(notice).to_contain_text("Target lane: cpu:0", timeout=30_000)  # this server's, on page open
        open_recorded(page, "qa: Why is the sky blue? (on NVIDIA H200")
        expect(notice).to_contain_text("Recorded on NVIDIA H200", timeout=30_000)
        expect(notice).to_contain_text("Target lane: cuda:0, playing the GPU; draft lane: cuda:0, 2nd stream")
        expect(notice).not_to_contain_text("cpu:")
        pick_methods(page)
        page.get_by_label("Prompt").fill("t1 t2 t3")
        page.locator("#max-tokens input").fill("8")
        page.locator("#run").click()
        expect(notice).to_contain_text("Target lane: cpu:0", timeout=30_000)
        expect(notice).not_to_contain_text("cuda")
        expect_status(page, "Done.")
        expect(notice).not_to_contain_text("Recorded on")
        browser.close()


CARD_CHANGES = """() => { window.__changes = [];
    let last = '';
    new MutationObserver(() => {
        const now = [...document.querySelectorAll('#cards .card')].map(c => c.outerHTML).join('');
        if (now !== last) { last = now; window.__changes.push(performance.now()); }
    }).observe(document.querySelector('#cards'), {subtree: true, childList: true, characterData: true}); }"""


def test_browser_live_race_updates_the_cards_at_a_bounded_rate_and_draws_figures_after(slow_app_url):
    """During a live race (80 ms a target forward: about 12 steps a second) the cards change at most about
    four times a second, besides each method's start and end, and the timeline is drawn once, after the
    race, so the page's drawing stays off the cores the race is timed on (issue 63)."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, slow_app_url)
        pick_methods(page)
        page.locator("#max-tokens input").fill("30")
        page.evaluate(CARD_CHANGES)
        page.locator("#run").click()
        expect(page.locator("#card-vanilla .card")).to_have_attribute("data-state", "running", timeout=60_000)
        expect(page.locator("#card-vanilla .card .tok").nth(3)).to_be_attached(timeout=60_000)
        expect(page.locator("#timeline")).to_contain_text("Racing")  # no timeline while the race runs
        expect_status(page, "Done.")
        changes = page.evaluate("window.__changes")
        seconds = (changes[-1] - changes[0]) / 1000
        assert seconds > 2
        assert len(changes) <= 4 * seconds + 2 * len(RACED) + 4, (len(changes), seconds)
        expect(page.locator("#timeline")).to_contain_text("cpu", timeout=30_000)  # drawn after the race
        browser.close()


def test_browser_shows_a_prompts_cost_and_refuses_a_paste_that_would_take_minutes(embedded_pair):
    """On the embedded pair: the line under the prompt gives its tokens and expected prefill, measured
    on this machine at warm-up; a paste about a third longer than this machine's limit (about 20,000
    characters on a 2-core CPU) is refused with one message before anything changes, and the race
    already on the page stays (issue 63)."""
    from pathlib import Path

    from playwright.sync_api import expect, sync_playwright

    from app.prompt_cost import speeds_of

    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", root / "docs" / "app.md", *sorted((root / "docs" / "app").glob("*.md"))]
    text = "".join(page.read_text() for page in pages)
    chars_per_token = len(text) / len(embedded_pair.encode(text, raw=True))
    demo, url = launch(lambda **devices: embedded_pair)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url, prompt="Why is the sky blue?")
            info = page.locator("#prompt-info")
            expect(info).to_contain_text("per method here (measured:", timeout=600_000)  # after the warm-up
            expect(info).to_contain_text("tokens")
            pick_methods(page, ("Vanilla", "Speculative decoding"))
            page.locator("#max-tokens input").fill("8")
            page.locator("#run").click()
            expect_status(page, "Done.", timeout=300_000)
            expect(page.locator("#timeline")).to_contain_text("cpu", timeout=60_000)
            kept = page.locator("#card-sd .card").inner_html()
            for title in ("Speculative Streaming", "Mirror-SD", "EAGLE-2"):
                page.get_by_role("checkbox", name=title, exact=True).check()
            limit = speeds_of(embedded_pair).max_tokens(methods=5, max_new=8)  # measured at the warm-up
            if limit * 4 // 3 >= embedded_pair.context_length:
                pytest.skip(f"this machine races {limit:,} prompt tokens within the limit: no paste within the "
                            f"context of {embedded_pair.context_length:,} tokens is too long")
            chars = int(limit * 4 // 3 * chars_per_token)
            paste = (text * (1 + chars // len(text)))[:chars]
            page.get_by_label("Prompt").fill(paste)
            expect(info).to_contain_text("Too long for a live race here", timeout=60_000)
            page.wait_for_timeout(2000)  # every change's line drawn: the last one stays
            expect(info).to_contain_text("Too long for a live race here")
            tokens = int(info.locator("strong").first.inner_text().split()[0].replace(",", ""))
            assert tokens > limit
            page.locator("#run").click()
            expect(page.get_by_text("Too long for a live race here").last).to_be_visible(timeout=30_000)  # the toast
            page.wait_for_timeout(2000)
            expect(page.locator("#status")).to_contain_text("Done.")  # nothing of the last race is lost
            assert page.locator("#card-sd .card").inner_html() == kept
            expect(page.locator("#timeline")).to_contain_text("cpu")
            browser.close()
    finally:
        demo.close()


def test_browser_opens_a_race_recorded_at_each_methods_best_settings(class_url):
    """Beside the defaults' races, the dropdown offers this CPU's races at each method's best measured
    settings, labelled with them; opened, the status line says them (issue 63)."""
    from playwright.sync_api import expect, sync_playwright

    from app.replay import recorded_races

    label = next(label for label, _ in recorded_races()
                 if label.startswith("qa: Why is the sky blue? (on AMD EPYC, 2 CPU cores, ") and "at best settings" in label)
    assert label.endswith(", at best settings: sd gamma 3; mirror exit layer 14, branch budget 4)")
    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        open_recorded(page, label)
        expect(page.locator("#recorded input")).to_have_value(label)
        expect(page.locator("#status")).to_contain_text(
            "at best settings: sd gamma 3; mirror exit layer 14, branch budget 4 (every other option at its default)")
        expect(page.locator("#card-mirror")).to_contain_text("tok/s")
        browser.close()


LABEL_BOXES = """() => [...document.querySelectorAll('#tree .textpoint text')].map(t => {
    const r = t.getBoundingClientRect(); return [t.textContent, r.left, r.top, r.right, r.bottom]; })"""


def test_browser_steps_through_the_deepest_tree_with_clear_labels_and_a_plain_hit_question(class_url):
    """Issue 69, in Chromium: the page header says where each kind of number was measured, How it works
    explains windows copied from the context, a recording is named by its machine and day; on the
    recordings' deepest tree no two labels overlap, the step's sentence names the steps its window
    and its outcome belong to, and the hit question and its answer name the step they mean."""
    from playwright.sync_api import expect, sync_playwright

    from app.trees import step_tree
    from test_app import overlapping, recorded_deepest_tree

    label, result, step = recorded_deepest_tree()
    where = result.trace.meta["recording"]
    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        intro = page.locator("#intro")
        expect(intro).to_contain_text("LIVE, a race you run (Run), timed on the server showing this page")
        expect(intro).to_contain_text("AMD EPYC, 2 CPU cores or NVIDIA H200")
        expect(intro).to_contain_text("MODELLED")
        expect(page.locator("#copied-note")).to_contain_text("Copied from the context")
        expect(page.locator("#copied-note")).to_contain_text("After a miss, Mirror-SD copies its next window")
        open_recorded(page, label)
        expect(page.locator("#recorded input")).to_have_value(label)
        assert f"(on {where['hardware']}, {where['date']}" in label
        page.get_by_role("tab", name="Step-through").click()
        page.get_by_label("Method").click()
        page.get_by_role("option", name=result.title, exact=True).click()
        box = page.locator("#step input[type=number]")
        box.fill(str(step.index))
        box.press("Enter")
        sentence = page.locator("#sentence")
        expect(sentence).to_contain_text(f"Step {step.index} (", timeout=30_000)
        expect(sentence).to_contain_text(f"step {step.index - 1} was a")
        page.wait_for_function(f"() => document.querySelectorAll('#tree .textpoint text').length >= "
                               f"{len([n for n in step_tree(step) if n.kind != 'candidate'])}", timeout=30_000)
        page.wait_for_timeout(500)
        boxes = [(b[0], *b[1:]) for b in page.evaluate(LABEL_BOXES)]
        assert len(boxes) > 40 and overlapping(boxes) == []
        page.locator("#prev").click()  # the question asks of the next step: the step before the tree's
        expect(sentence).to_contain_text(f"so step {step.index}", timeout=30_000)
        question = page.locator("#hit-guess")
        expect(question).to_contain_text("will the next step be a hit? A step is a hit when", timeout=30_000)
        question.get_by_text("Yes, a hit").click()
        expect(page.locator("#hit-reveal")).to_contain_text(f"The next step, step {step.index}, was a",
                                                            timeout=30_000)
        browser.close()


def test_browser_names_a_recordings_machine_and_day_its_nvml_gaps_and_its_files(class_url):
    """Issue 69, in Chromium, on the H200 summarization recording: the cards' timed numbers say where and
    when they were measured, the reveal quotes the card's ms/step, the utilisation legend keeps clear of
    the chart's toolbar and the chart says which runs had one NVML reading, and the Export tab's files
    carry the recording's day, not today's."""
    import re

    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, class_url)
        open_recorded(page, "summarization: Summarize in one sentence: The public library in the town… "
                            "(on NVIDIA H200")
        speed = page.locator('#card-mirror .metric[data-metric="tok/s"]')
        expect(speed).to_have_attribute("title", re.compile("Recorded on NVIDIA H200, 2026-11-27, not on this server"))
        page.locator("#guess").get_by_text("Vanilla", exact=True).click()
        expect(page.locator("#reveal")).to_contain_text("fastest", timeout=30_000)
        said = page.locator("#reveal").inner_text()
        winner = next(m for m in ("vanilla", "sd", "ss", "mirror", "eagle")
                      if page.locator(f"#card-{m} .card-head b").inner_text() in said.split(" was fastest")[0])
        ms = re.search(r"([\d.]+) ms/step", page.locator(f"#card-{winner} .card-metrics").inner_text()).group(1)
        assert f"{ms} ms" in said and "reading the prompt included" in said

        page.get_by_role("tab", name="Utilisation").click()
        chart = page.locator("#utilisation .js-plotly-plot")
        expect(chart).to_contain_text("one NVML reading only", timeout=30_000)
        assert chart.locator("text", has_text="one NVML reading only").count() == 2  # ss and mirror
        chart.hover()
        legend = chart.locator(".legend").bounding_box()
        toolbar = chart.locator(".modebar").bounding_box()
        assert legend and toolbar
        apart = (legend["x"] + legend["width"] <= toolbar["x"] or toolbar["x"] + toolbar["width"] <= legend["x"]
                 or legend["y"] + legend["height"] <= toolbar["y"] or toolbar["y"] + toolbar["height"] <= legend["y"])
        assert apart, (legend, toolbar)

        page.get_by_role("tab", name="Export").click()
        files = page.locator("#export")
        expect(files).to_contain_text("recorded-20261127-summarization-nvidia-h200-mirror-spans", timeout=30_000)
        expect(files).not_to_contain_text("race-2")
        browser.close()
