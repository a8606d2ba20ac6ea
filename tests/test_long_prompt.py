"""A long prompt on a machine slower than the one that measured it (issue 69): the limit still holds, the
warm-up reads the prompt's first tokens only and says which method warms, Stop acts within about a
second at any moment (the engine stops a prefill between layers), and a race that ends before any
method ran, or too short to time, says so. On a tiny pair whose layers sleep in proportion to the rows
they read: a prefill as slow as a real one, independent of this machine's load."""
import threading
import time

import pytest

from app import prompt_cost
from app.race import Refused, run_race
from mirror_sd import generate, load_pair

METHODS3 = ["vanilla", "sd", "mirror"]


def words(n: int) -> str:
    """A prompt of ``n`` tokens on the tiny pair's word-level tokenizer."""
    return " ".join(f"t{1 + i % 15}" for i in range(n))


def slow_down(pair, seconds_per_row: float) -> list:
    """Every layer of both models sleeps ``seconds_per_row`` per row it reads, before its work: a machine
    whose prefill slows in proportion to the prompt's length, as a real one does. Returns the hooks."""
    def sleep(module, args):
        time.sleep(seconds_per_row * args[0].shape[1])

    layers = [layer for model in (pair.target, pair.draft) for layer in model.model.layers]
    return [layer.register_forward_pre_hook(sleep) for layer in layers]


def undo(hooks: list):
    for hook in hooks:
        hook.remove()


@pytest.fixture
def own_pair(tiny_dirs):
    """A tiny pair of this test's own: its hooks and measured speeds reach no other test."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    yield pair
    prompt_cost._speeds.pop(id(pair), None)


def measured_with_limit(pair, monkeypatch, seconds_per_row: float, tokens: int, methods: int, max_new: int,
                        share: float = 0.8):
    """This pair's speeds measured on a machine of ``seconds_per_row``, and a limit set so that a prompt of
    ``tokens`` is expected to take ``share`` of it: a prompt that fits, on the machine that measured."""
    hooks = slow_down(pair, seconds_per_row)
    try:
        speeds = prompt_cost.measure(pair)
    finally:
        undo(hooks)
    monkeypatch.setattr(prompt_cost, "RACE_LIMIT_S", speeds.prompt_s(tokens, methods, max_new) / share)
    assert prompt_cost.too_long(tokens, 3 * tokens, speeds, methods, max_new) == ""
    return speeds


def test_a_stop_ends_a_long_prefill_within_a_layer_and_the_pair_runs_on(own_pair):
    """The engine checks a run's stop before each layer, so a stop set in the middle of a prefill ends the
    run within one layer's time, "stopped", with nothing committed; the next run decodes as before."""
    prompt = words(150)
    before = {m: generate(own_pair, prompt, method=m, max_new_tokens=6).token_ids for m in METHODS3}
    hooks = slow_down(own_pair, 0.004)  # 0.6 s a layer: a prefill of 2.4 s for the two-model methods
    try:
        for method in METHODS3:
            stop = threading.Event()
            threading.Timer(0.3, stop.set).start()
            start = time.perf_counter()
            out = generate(own_pair, prompt, method=method, max_new_tokens=6, stop=stop)
            assert out.finished == "stopped" and out.token_ids == [] and out.error is None
            assert time.perf_counter() - start < 0.3 + 0.6 + 0.5, method
    finally:
        undo(hooks)
    assert {m: generate(own_pair, prompt, method=m, max_new_tokens=6).token_ids for m in METHODS3} == before


def test_stop_during_the_warm_up_acts_within_a_second_and_says_no_method_ran(own_pair):
    """The warm-up says which method warms and for how long; Stop during it ends the race within about a
    second (a layer's time), every card not run, and the status says the race stopped before any
    method ran, not that a text was kept."""
    from app.handlers import STOPPED_BEFORE, race_status

    prompt_cost.measure(own_pair)
    hooks = slow_down(own_pair, 0.003)  # 0.45 s a layer
    stop, seen, stopped_at = threading.Event(), [], None
    try:
        for results in run_race(own_pair, words(150), METHODS3, stop, max_new_tokens=8):
            warming = [r for r in results.values() if r.finished == "warming"]
            if warming:
                seen.append((warming[0].method, race_status(results)))
            if len(seen) >= 3 and stopped_at is None:
                stop.set()
                stopped_at = time.perf_counter()
        took = time.perf_counter() - stopped_at
    finally:
        undo(hooks)
    assert seen[0][0] == "vanilla" and "**Warming up Vanilla** (1 of 3)" in seen[0][1] and "s so far" in seen[0][1]
    assert took < 1.2, took
    assert all(r.finished == "skipped" and not r.trace.steps for r in results.values())
    assert race_status(results, done=True) == STOPPED_BEFORE and "text so far is kept" not in STOPPED_BEFORE


def test_the_limit_holds_on_a_machine_slower_than_the_one_that_measured_it(own_pair, monkeypatch):
    """A prompt that fits the limit on the machine that measured the speeds is refused, before any method
    is timed, when the machine is four times slower by the race: the race's own warm-up reads the speed
    now. The speeds learn it, so the same prompt is then refused at the click, and the line under the
    prompt says how much slower the machine is."""
    import app.race as race_module
    from app.handlers import length_problem

    tokens, methods = 150, ["vanilla", "sd"]
    speeds = measured_with_limit(own_pair, monkeypatch, 0.002, tokens, len(methods), 8)
    timed = []
    real_stream = race_module.stream
    monkeypatch.setattr(race_module, "stream", lambda *a, **kw: timed.append(kw) or real_stream(*a, **kw))
    prompt = words(tokens)
    hooks = slow_down(own_pair, 4 * 0.002)
    try:
        with pytest.raises(Refused) as refused:
            for results in run_race(own_pair, prompt, methods, threading.Event(), max_new_tokens=8,
                                    check=lambda: length_problem(own_pair, prompt, methods, 8, 1)):
                pass
    finally:
        undo(hooks)
    assert len(timed) == len(methods)  # the warm-ups only: no method was timed
    assert all(r.finished == "refused" for r in results.values())
    assert 2 < speeds.slower < 8, speeds.slower
    assert "slower now than when it was measured" in str(refused.value)
    assert "Too long for a live race here" in length_problem(own_pair, prompt, methods, 8, 1)
    assert "slower now, from the last race's prefills" in prompt_cost.prompt_line(tokens, 3 * tokens, speeds, 2, 8)


def test_the_estimate_counts_the_drafts_prefill_and_one_reading_per_method(own_pair):
    """The measured speeds carry the draft's prefill as a share of the target's (sd and Mirror-SD read the
    prompt with both); each method reads a long prompt once, plus its warm-up's first tokens."""
    hooks = slow_down(own_pair, 0.002)
    try:
        speeds = prompt_cost.measure_speeds(own_pair)
    finally:
        undo(hooks)
    assert 0.5 < speeds.draft < 2  # both tiny models have two layers, each sleeping the same per row
    long = 4 * speeds.warm_tokens(10**6)
    per_method = speeds.read_s(long) + speeds.read_s(speeds.warm_tokens(long)) + 8 * speeds.c * long
    assert speeds.prompt_s(long, 3, 8) == pytest.approx(3 * per_method)
    warm = speeds.warm_tokens(long)
    assert speeds.read_s(warm) <= prompt_cost.WARM_PREFILL_S or warm == prompt_cost.WARM_MIN_TOKENS


def test_every_finished_race_names_its_winner_and_a_short_one_says_it_is_too_short(tiny_pair):
    """With no guess, a finished race still says which method was fastest and why (predict's ``fastest``
    and ``why``); a race too short to time says so on the status line (no τ against the recorded
    prompts) and in place of the zoomed step (no bare axes); a refused race marks every card."""
    from app.handlers import not_run, race_answer, race_status, views
    from app.predict import fastest, why

    *_, race = run_race(tiny_pair, "t1 t2 t3", METHODS3, threading.Event(), max_new_tokens=24)
    answer = race_answer(race, None)
    assert answer == f"**Fastest: {fastest(race).title}.** {why(fastest(race), race)}"
    *_, short = run_race(tiny_pair, "t1 t2 t3", METHODS3, threading.Event(), max_new_tokens=2)
    assert race_answer(short, None).startswith("**No winner this time:**")
    status = race_status(short, done=True)
    assert "**Too short to time:**" in status and "recorded example" not in status
    zoom = views(short).zoom
    assert "too short to time" in zoom.layout.annotations[0].text and not zoom.data
    given = {"methods": ["sd", "vanilla"]}
    page = not_run(given, "refused", "**Cannot run:** why")
    assert page.status == "**Cannot run:** why" and page.replay["interactive"] is False
    assert list(page.results) == ["vanilla", "sd"] and 'data-state="refused"' in page.cards["vanilla"] + page.cards["sd"]
    assert "not run (race refused)" in page.cards["sd"] and "mirror" not in page.cards  # mirror's card: not chosen


def test_browser_a_long_paste_on_a_slower_machine_shows_progress_stops_at_once_and_is_refused(tiny_dirs, monkeypatch):
    """The long-paste browser test, on a machine five times slower than the one that measured the limit
    (the pair's layers sleep per row: 2 ms while the page's warm-up measures, 10 ms after). The paste is
    sized from the measured limit, so it fits on the measuring machine. A race too short to time says
    so, and a finished one names its winner with no guess. Then: Run shows progress from the first
    second (which method warms, for how long); Stop during the warm-up acts within 2 s and says no
    method ran; run again, the race's own warm-up reads the machine's speed and refuses it before any
    method is timed, every card marked, with no toast over the Run and Stop buttons; a third Run is
    refused at the click, before anything on the page changes, the line under the prompt saying why."""
    import os
    import shutil

    from playwright.sync_api import expect, sync_playwright

    from test_app_classroom import expect_status, launch, pick_methods
    from test_app_live import CHROMIUM, open_app

    if not os.path.exists(CHROMIUM) and not shutil.which("chromium"):
        pytest.skip("Chromium is not installed here (CI installs Debian's chromium: see .ci/run)")
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    hooks = slow_down(pair, 0.002)  # the machine that measures, while the page's warm-up runs
    demo, url = launch(lambda **devices: pair)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url)
            expect(page.locator("#prompt-info")).to_contain_text("per method here (measured:", timeout=120_000)
            pick_methods(page)
            page.locator("#max-tokens input").fill("2")
            page.locator("#run").click()  # too short to time: no winner, no τ verdict, no bare zoom axes
            expect_status(page, "Too short to time")
            expect(page.locator("#zoomed-step")).to_contain_text("too short to time", timeout=30_000)
            expect(page.locator("#reveal")).to_contain_text("No winner this time", timeout=30_000)
            assert "recorded example" not in page.locator("#status").inner_text()
            page.locator("#max-tokens input").fill("8")
            page.locator("#run").click()  # no guess: the winner is named all the same
            expect(page.locator("#reveal")).to_contain_text("Fastest:", timeout=60_000)
            expect_status(page, "Done.")

            speeds = prompt_cost.speeds_of(pair)
            monkeypatch.setattr(prompt_cost, "RACE_LIMIT_S", speeds.prompt_s(170, 3, 8))  # 170 tokens fit
            limit = speeds.max_tokens(3, 8)
            assert 160 <= limit <= 170
            page.get_by_label("Prompt").fill(words(int(0.85 * limit)))
            expect(page.locator("#prompt-info")).not_to_contain_text("Too long", timeout=30_000)
            undo(hooks)
            hooks = slow_down(pair, 0.010)  # five times slower from here on

            page.locator("#run").click()
            clicked = time.perf_counter()
            expect(page.locator("#status")).to_contain_text("Warming up Vanilla", timeout=2_000)
            expect(page.locator("#card-vanilla .card")).to_have_attribute("data-state", "warming", timeout=1_000)
            assert time.perf_counter() - clicked < 2.0  # progress within the first second or so
            page.locator("#stop").click()
            stopped = time.perf_counter()
            expect_status(page, "Stopped before any method ran", timeout=2_000)
            assert time.perf_counter() - stopped < 2.0
            for name in ("vanilla", "sd", "mirror"):
                expect(page.locator(f"#card-{name} .card")).to_have_attribute("data-state", "skipped")

            page.locator("#run").click()  # the limit holds: the warm-up reads the speed now
            expect(page.locator("#status")).to_contain_text("Warming up", timeout=2_000)
            expect_status(page, "Cannot run:", timeout=60_000)
            expect_status(page, "slower now than when it was measured")
            for name in ("vanilla", "sd", "mirror"):
                expect(page.locator(f"#card-{name} .card")).to_have_attribute("data-state", "refused")
            expect(page.locator("#timeline")).to_contain_text("No method ran", timeout=30_000)
            expect(page.locator("#prompt-info")).to_contain_text("Too long for a live race here", timeout=30_000)

            before = page.locator("#status").inner_text(), page.locator("#cards").inner_html()
            page.locator("#run").click()  # refused at the click: nothing on the page changes
            page.wait_for_timeout(2000)
            assert (page.locator("#status").inner_text(), page.locator("#cards").inner_html()) == before
            expect(page.locator("#prompt-info")).to_contain_text("slower now, from the last race's prefills")
            for toast in page.locator(".toast-body").all():  # no message over the Run and Stop buttons
                box = toast.bounding_box()
                for button in ("#run", "#stop"):
                    other = page.locator(button).bounding_box()
                    assert (box["x"] + box["width"] <= other["x"] or other["x"] + other["width"] <= box["x"]
                            or box["y"] + box["height"] <= other["y"] or other["y"] + other["height"] <= box["y"])
            browser.close()
    finally:
        undo(hooks)
        demo.close()
        prompt_cost._speeds.pop(id(pair), None)
