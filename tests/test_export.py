"""The downloads a student hands in (a summary CSV, one zip, files named by race and method) and the
"paper form" settings (each method as its paper configures it, labelled on the cards)."""
import re
import shutil
import threading
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from app import presets
from app.cards import baseline, card_html
from app.export import export_race
from app.race import Result, run_race
from app.replay import RECORDED, load_race
from app.results_table import same_as_vanilla
from app.summary import equal_to_vanilla, stored_parameters
from mirror_sd import METHODS, generate
from mirror_sd.devices import cpu_cores
from mirror_sd.models.loading import cache_root
from mirror_sd.models.pair import EMBEDDED_DRAFT, own_parameters
from mirror_sd.tools.bench import cpu_model
from mirror_sd.trace import Trace

PROMPT = "t1 t2 t3"
TINY_METHODS = ["vanilla", "sd", "mirror"]  # what a tiny pair runs: no EAGLE head, no trained streams


def race(pair, options=None, temperature=0.0, methods=TINY_METHODS, max_new_tokens=24):
    results = None
    for results in run_race(pair, PROMPT, methods, threading.Event(), max_new_tokens=max_new_tokens,
                            temperature=temperature, options=options or {}):
        pass
    return results


def card_speedup(result, rate) -> str | None:
    found = re.search(r"([\d.]+)× vanilla", card_html(result, rate))
    return found.group(1) if found else None


def read_back(paths: list[str]):
    """(summary as pandas read it, the zip's names, the paths' names)."""
    names = [Path(p).name for p in paths]
    table = pd.read_csv(next(p for p in paths if p.endswith("-summary.csv")))
    with zipfile.ZipFile(next(p for p in paths if p.endswith(".zip"))) as z:
        assert z.testzip() is None
        zipped = z.namelist()
    return table.set_index("method"), zipped, names


def test_a_live_races_summary_names_its_prompt_models_provenance_and_every_methods_numbers(tiny_pair, tmp_path):
    results = race(tiny_pair)
    paths = export_race(results, tmp_path, stamp="race-1")
    table, zipped, names = read_back(paths)
    assert names[:2] == ["race-1.zip", "race-1-summary.csv"]
    assert sorted(zipped) == sorted(names[1:])  # everything but the zip itself
    for name in TINY_METHODS:  # per method: steps, spans, trace, Chrome trace
        assert {f"race-1-{name}-steps.csv", f"race-1-{name}-spans.csv", f"race-1-{name}.json",
                f"race-1-{name}.chrome.json"} <= set(zipped)
    assert list(table.index) == [results[m].title for m in TINY_METHODS]
    assert set(table.prompt) == {PROMPT} and set(table.target) == {tiny_pair.target_name}
    assert set(table.target_parameters) == {own_parameters(tiny_pair.target)}
    assert table.draft.isna()["Vanilla"] and table.draft["Mirror-SD"] == tiny_pair.draft_name
    assert table.draft_parameters["Speculative decoding"] == own_parameters(tiny_pair.draft, tiny_pair.target)
    assert set(table.provenance) == {f"LIVE on this server: {cpu_model()}, {cpu_cores()} CPU cores"}
    assert set(table.form) == {"defaults"} and set(table.temperature) == {0.0} and set(table.max_new_tokens) == {24}
    assert "gamma=2" in table.options["Mirror-SD"] and "lookup=8" in table.options["Mirror-SD"]
    rate = baseline(results)
    for name in TINY_METHODS:  # the card's own numbers
        r, row = results[name], table.loc[results[name].title]
        assert row.tokens_per_s == pytest.approx(r.metrics["tokens_per_s"], rel=1e-5)
        assert row.tau == pytest.approx(r.metrics["mean_accepted"], rel=1e-5) and row.new_tokens == 24
        if name != "vanilla":
            assert f"{row.speedup_over_vanilla:.2f}" == card_speedup(r, rate)
            assert row.acceptance_rate == pytest.approx(r.metrics["acceptance_rate"], rel=1e-5)
            assert row.equal_to_vanilla == "yes"
    assert table.hit_rate["Mirror-SD"] == pytest.approx(results["mirror"].metrics["hit_rate"], rel=1e-5)
    assert table.equal_to_vanilla["Vanilla"] == "is vanilla" and pd.isna(table.speedup_over_vanilla["Vanilla"])


def test_a_recorded_races_summary_names_its_machine_day_models_and_numbers(tmp_path):
    prompt, meta, results = load_race(RECORDED / "nvidia-h200" / "qa.json")
    paths = export_race(results, tmp_path)
    table, zipped, names = read_back(paths)
    stamp = "recorded-20261127-qa-nvidia-h200"
    assert names[:2] == [f"{stamp}.zip", f"{stamp}-summary.csv"] and all(n.startswith(stamp) for n in names)
    assert sorted(zipped) == sorted(names[1:]) and len(zipped) == 1 + 4 * len(results)
    assert set(table.prompt) == {prompt} and set(table.provenance) == {"RECORDED on NVIDIA H200, 2026-11-27"}
    assert set(table.target) == {"smollm2-135m-instruct"} and table.draft["Mirror-SD"] == "draft-smollm2-135m"
    assert table.draft_parameters["Mirror-SD"] == 18_879_552  # the 4-layer draft's own: it reads the target's embedding
    target_weights = cache_root() / "SmolLM2-135M-Instruct"
    if target_weights.exists():  # the embedded target, converted once on this machine
        assert set(table.target_parameters) == {stored_parameters(target_weights)} == {134_515_008}
    assert set(table.max_new_tokens) == {64}
    rate = baseline(results)
    for r in results.values():
        row = table.loc[r.title]
        assert row.tokens_per_s == pytest.approx(r.metrics["tokens_per_s"], rel=1e-5)
        assert row.tau == pytest.approx(r.metrics["mean_accepted"], rel=1e-5)
        if r.method != "vanilla":
            assert f"{row.speedup_over_vanilla:.2f}" == card_speedup(r, rate) and row.equal_to_vanilla == "yes"
    assert table.hit_rate["Mirror-SD"] == pytest.approx(results["mirror"].metrics["hit_rate"], rel=1e-5)
    assert stored_parameters(EMBEDDED_DRAFT) == 18_879_552
    assert set(table.form) == {"defaults"}
    _, _, best = load_race(RECORDED / "cpu-best" / "qa.json")  # sd and Mirror-SD at this CPU's best settings
    forms = read_back(export_race(best, tmp_path / "best"))[0].form
    assert forms.to_dict() == {"Vanilla": "defaults", "Speculative decoding": "own settings",
                               "Speculative Streaming": "defaults", "Mirror-SD": "own settings", "EAGLE-2": "defaults"}


def test_equal_to_vanilla_says_no_for_other_tokens_and_not_comparable_when_sampling(tiny_pair):
    """One rule (``vanilla_match``), worded by the export's summary and by the results table alike: a run
    cut short is compared on the tokens both wrote."""
    results = race(tiny_pair, methods=["vanilla", "sd"], max_new_tokens=12)
    changed = Result("sd", Trace.from_dict(results["sd"].trace.to_dict()))
    changed.trace.steps[-1].committed[-1] += 1
    cut = Result("sd", Trace.from_dict(results["sd"].trace.to_dict()))
    cut.trace.steps = cut.trace.steps[:2]  # stopped after its first decoding step
    n = sum(len(s.committed) for s in cut.trace.steps)
    words = lambda r: (equal_to_vanilla(r, results["vanilla"]), same_as_vanilla(r, results["vanilla"]))  # noqa: E731
    assert words(results["sd"]) == ("yes", "yes") and words(changed) == ("no", "no")
    assert words(cut) == (f"yes (the first {n} tokens)", f"yes (first {n} tokens)")
    assert words(results["vanilla"]) == ("is vanilla", "reference")
    assert words(Result("sd", Trace("sd"))) == ("no vanilla run to compare", "–")
    sampled = race(tiny_pair, methods=["vanilla", "sd"], temperature=0.8, max_new_tokens=12)
    assert equal_to_vanilla(sampled["sd"], sampled["vanilla"]).startswith("not comparable")
    assert same_as_vanilla(sampled["sd"], sampled["vanilla"]) == "sampled: not compared"


def test_the_paper_form_is_valid_on_the_embedded_pair(embedded_pair):
    """Every paper setting is within its option's range, the engine's own checks accept it on the pair the
    app serves (SS's single pass has its trained streams, Mirror-SD's window fits the draft's streams), and
    each method in paper form commits vanilla's tokens there."""
    paper = presets.paper_options(embedded_pair)
    assert paper["ss"] == {"one_forward": 1, "lookup": 0}
    assert paper["mirror"] == dict(lookup=0, gamma=5, kappa=8, exit_layer=14, streams=1)  # 30 layers; 4 streams
    assert paper["eagle"] == dict(depth=6, top_k=10, total_tokens=60, lookup=0)
    for method, values in paper.items():
        options = {o.name: o for o in METHODS[method].options}
        for name, value in values.items():
            assert options[name].low <= value <= options[name].high, (method, name)
        METHODS[method].check(embedded_pair, METHODS[method].resolve_options(values))
    prompt = "Summarize: The library opens at nine and closes at five, except on Sundays."
    vanilla = generate(embedded_pair, prompt, method="vanilla", max_new_tokens=16).token_ids
    for method, values in paper.items():  # and each commits vanilla's tokens in paper form
        assert generate(embedded_pair, prompt, method=method, max_new_tokens=16, **values).token_ids == vanilla, method


def test_the_settings_radio_sets_every_option_box(tiny_pair):
    specs = [(m, opt, None) for m, spec in METHODS.items() for opt in spec.options]
    set_form = presets.make_set_form(lambda *devices: tiny_pair, specs)
    *paper, note = set_form(presets.PAPER, 0, "auto", "auto")
    values = {(m, opt.name): v for (m, opt, _), v in zip(specs, paper)}
    assert values[("ss", "one_forward")] == 1 and values[("mirror", "streams")] == 0  # the tiny draft has no streams
    assert values[("mirror", "exit_layer")] == tiny_pair.target.num_layers // 2
    assert all(values[(m, "lookup")] == 0 for m in ("ss", "mirror", "eagle")) and values[("sd", "gamma")] == 2
    assert "single pass" in note and "tune" in note
    *hot, note = set_form(presets.PAPER, 0.7, "auto", "auto")
    hot = {(m, opt.name): v for (m, opt, _), v in zip(specs, hot)}
    assert hot[("mirror", "lookup")] == 8 and hot[("eagle", "total_tokens")] == 8 and hot[("ss", "one_forward")] == 1
    assert "temperature 0.7" in note
    *back, _ = set_form(presets.DEFAULTS, 0, "auto", "auto")
    assert back == [opt.default for _, opt, _ in specs]
    follow = presets.make_follow_temperature(lambda *devices: tiny_pair, specs)
    assert follow(presets.PAPER, 0.7, "auto", "auto") == set_form(presets.PAPER, 0.7, "auto", "auto")
    assert all(u == {"__type__": "update"} for u in follow(presets.DEFAULTS, 0.7, "auto", "auto"))  # own settings stay


def test_a_paper_form_race_on_the_tiny_pair_is_labelled_and_commits_vanillas_tokens(tiny_pair, tmp_path):
    """Mirror-SD in paper form on the tiny pair (gamma 7, kappa 8, the exit at half its layers; its draft has
    no trained streams, so it drafts token by token). SS and EAGLE-2 need add-ons the tiny pair lacks."""
    options = presets.paper_options(tiny_pair)
    results = race(tiny_pair, options=options)
    presets.mark(results, tiny_pair, 0.0)
    assert results["mirror"].trace.meta["options"]["gamma"] == 7
    assert "paper form" in card_html(results["mirror"]) and "paper form" not in card_html(results["sd"])
    tokens = {m: [t for s in r.trace.steps for t in s.committed] for m, r in results.items()}
    assert tokens["mirror"] == tokens["vanilla"] and len(tokens["vanilla"]) == 24
    table, _, _ = read_back(export_race(results, tmp_path, stamp="race-2"))
    assert table.form["Mirror-SD"] == "paper form" and table.form["Vanilla"] == "defaults"
    assert table.equal_to_vanilla["Mirror-SD"] == "yes"


def test_browser_paper_form_labels_the_cards_and_the_export_tab_offers_the_summary_and_zip(tiny_pair):
    """In Chromium: one click on "paper form" sets the option boxes (the race runs with them: Mirror-SD's card
    says "paper form", speculative decoding's, which has no paper form, does not), and the Export tab lists
    the zip and the summary named by the race, and each method's files named by race and method."""
    from playwright.sync_api import expect, sync_playwright

    from test_app_classroom import CHROMIUM, launch, open_app, pick_methods

    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("Chromium is not installed here (CI installs Debian's chromium: see .ci/run)")
    demo, url = launch(lambda **devices: tiny_pair)
    try:
        with sync_playwright() as p:
            browser, page = open_app(p, url)
            pick_methods(page)
            page.locator("#max-tokens input").fill("12")
            page.locator("#form").get_by_text("paper form", exact=True).click()
            page.get_by_role("button", name="Advanced").click()
            page.get_by_role("tab", name="Mirror-SD", exact=True).click()
            expect(page.get_by_label("lookup", exact=True)).to_have_value("0", timeout=30_000)  # was 8
            expect(page.get_by_label("gamma", exact=True)).to_have_value("7")  # was 2
            expect(page.get_by_label("streams", exact=True)).to_have_value("0")  # the tiny draft has no streams
            page.locator("#run").click()
            expect(page.locator("#status")).to_contain_text("Done.", timeout=90_000)
            expect(page.locator("#card-mirror .card-form")).to_have_text("paper form", timeout=30_000)
            assert page.locator("#card-sd .card-form").count() == 0
            page.get_by_role("tab", name="Export").click()
            links = page.locator("#export a")
            expect(links.first).to_have_attribute("href", re.compile(r"race-\d{8}-\d{6}\.zip$"), timeout=30_000)
            names = [Path(link.get_attribute("href")).name for link in links.all()]
            stamp = names[0].removesuffix(".zip")
            assert names[1] == f"{stamp}-summary.csv" and len(names) == 2 + 4 * 3
            assert {f"{stamp}-{m}-steps.csv" for m in TINY_METHODS} <= set(names)
            browser.close()
    finally:
        demo.close()
