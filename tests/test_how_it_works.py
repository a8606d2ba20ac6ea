"""Issue 70, items 1, 2 and 9: the header names the models and says why a small target gains little, in
the H200 recordings' own numbers; How it works says what an expert would sign (sd's rule and expected
tokens, EAGLE's shifted token, Mirror-SD's step cost and hit rule, SS's single pass against this project's
default); short step times are written to 0.1 ms. The browser test reads all of it from the served page."""
import os
import re
import shutil
import statistics

import pytest

from test_app_live import CHROMIUM, open_app

HOW_IT_WORKS = (  # the corrected sentences, as the served panel must show them
    "min(1, p/q)", "norm(max(0, p − q))", "(1 − α^(γ+1)) / (1 − α)",  # sd's rule and expected tokens
    "embedding of the next token",  # EAGLE's shifted token
    "prefix + channel + max(suffix, rollouts) + rendezvous", "plus the whole target's",  # Mirror-SD against sd
    "top-κ candidates at every window row", "hit needs both the accepted length and the correction to match a branch",
    "dual strategy", "streams 0: the draft drafts token by token",  # the draft's own streams, off by default
    "fine-tuned", "one forward", "By default (one_forward 0)", "keeps the target frozen",  # SS
)


def test_step_times_are_written_to_a_tenth_of_a_ms_when_short():
    from app.figures import ms_text

    assert [ms_text(x) for x in (0.04, 1.44, 2.04, 9.94, 37.2, 120.6)] == \
        ["0.0 ms", "1.4 ms", "2.0 ms", "9.9 ms", "37 ms", "121 ms"]


def test_the_reveal_on_an_h200_recording_tells_short_steps_apart():
    """On the H200 recordings every step takes 1 to 3 ms: the reveal's ms are tenths, not '2 ms against 2 ms'."""
    from app.predict import why
    from app.replay import RECORDED, load_race

    _, _, results = load_race(RECORDED / "nvidia-h200" / "qa.json")
    winner = max(results.values(), key=lambda r: r.metrics["tokens_per_s"])
    times = re.findall(r"(\d+(?:\.\d+)?) ms", why(winner, results))
    assert times and all(re.fullmatch(r"\d\.\d", t) for t in times), times


def test_the_header_names_the_shipped_pair_and_the_note_computes_from_the_recordings():
    """The models' names and sizes come from the shipped draft's files and the recordings' meta; the note's
    target and draft ms are the medians of the H200 traces, computed here independently from Trace objects."""
    from app import models_note
    from app.replay import load_race
    from mirror_sd.trace import SpanKind

    words = models_note.pair_words()
    assert "SmolLM2-135M-Instruct" in words and "30 layers" in words and "4 decoder layers" in words
    assert "18.9M trained parameters" in words
    decodes, drafts = [], []
    for path in sorted(models_note.H200.glob("*.json")):
        _, _, results = load_race(path)
        decodes += [1000 * (s.end - s.start) for s in results["vanilla"].trace.spans if s.kind == SpanKind.DECODE]
        forwards = {st.index: st.draft.forwards for st in results["sd"].trace.steps if st.draft}
        drafts += [1000 * (s.end - s.start) / forwards[s.step] for s in results["sd"].trace.spans
                   if s.kind == SpanKind.DRAFT and s.step in forwards]
    note = models_note.small_target_note()
    assert note.startswith("**Why a small target gains little** (RECORDED on NVIDIA H200")
    assert f"target's forward takes only {statistics.median(decodes):.2f} ms" in note
    assert f"One draft forward costs {statistics.median(drafts):.2f} ms" in note
    assert "REPORTED" in note and "speculative decoding 0." in note


@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not shutil.which("chromium"), reason="no Chromium here")
def test_browser_reads_the_models_the_small_target_note_and_the_corrected_explanations(tiny_pair):
    from playwright.sync_api import expect, sync_playwright

    from app.ui import build_demo

    demo = build_demo(pair_factory=lambda **devices: tiny_pair)
    _, url, _ = demo.queue(max_size=8).launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                                              quiet=True)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url)
            intro = page.locator("#intro")
            for text in ("SmolLM2-135M-Instruct", "4 decoder layers", "LIVE, a race you run", "MODELLED", "REPORTED"):
                expect(intro).to_contain_text(text)
            for text in ("Why a small target gains little", "RECORDED on NVIDIA H200"):
                expect(page.locator("#small-target")).to_contain_text(text)
            expect(intro).not_to_contain_text("every number")
            panel = page.locator("#how-it-works")
            expect(panel).to_be_visible()
            shown = panel.inner_text()
            missing = [t for t in HOW_IT_WORKS if t not in shown]
            assert not missing, missing
            assert "max(target suffix, draft)" not in shown and "small trained streams" not in shown
            assert panel.locator("svg").count() == 4
            if os.environ.get("HOW_IT_WORKS_PNG"):  # a picture to look at: HOW_IT_WORKS_PNG=path.png
                page.set_viewport_size({"width": 1600, "height": 900})
                page.evaluate("window.scrollTo(0, 0)")
                page.screenshot(path=os.environ["HOW_IT_WORKS_PNG"].replace(".png", "-top.png"))  # the header
                page.locator("#how").screenshot(path=os.environ["HOW_IT_WORKS_PNG"])
            browser.close()
    finally:
        demo.close()
