"""The What if tab's answer to "when does Mirror-SD beat EAGLE?" (app/tuned.py) on the recorded tune
run (app/tuned/): the best-settings table, the verdict, the map and the controls all read one run and
say the same numbers; the step sentences' parts sum to the table's step time."""
import json
import os
import shutil
from pathlib import Path

import pytest

from test_app_live import CHROMIUM, app_url, open_app  # noqa: F401  (a fixture)

from app import tuned
from app import whatif as view
from app.replay import load_race, recorded_races
from mirror_sd.tools import whatif as W

RECORDED = tuned.load()
OWN = dict(alpha=None, hit_rate=None, window=None)


def test_the_recorded_tune_covers_every_shipped_profile_and_this_machine_with_the_paper_row():
    assert RECORDED is not None, "app/tuned/ ships the recorded tune run (python -m mirror_sd tune --out app/tuned)"
    best, searched = RECORDED.best, RECORDED.searched
    for profile in W.profile_names() + [tuned.THIS_MACHINE]:
        methods = set(best[best.profile == profile].method)
        assert {"vanilla", "sd", "eagle", "ss", "mirror", tuned.PAPER} <= methods, profile
    assert searched.equal_to_vanilla.all()  # every setting committed vanilla's tokens
    paper = json.loads(searched[searched.paper].options.iloc[0])
    assert paper["kappa"] == 8 and paper["exit_layer"] in (14, 15) and paper["streams"] == 1
    mirror = best[(best.profile == "paper-14b") & (best.method == "mirror")].iloc[0]
    row = searched[searched.setting == mirror.setting].iloc[0]
    assert row["speedup@paper-14b"] == pytest.approx(mirror.speedup)
    assert row["speedup@paper-14b"] == searched[searched.method == "mirror"]["speedup@paper-14b"].max()
    assert row.setting != "mirror"  # not the defaults chosen for the CPU: the search's


@pytest.mark.parametrize("name", ["paper-14b", "h200-embedded", view.FITTED])
def test_the_table_verdict_map_and_controls_agree_with_tuned_csv(name):
    profile = view.tuned_profile(name)
    rows = RECORDED.best[RECORDED.best.profile == profile].set_index("method")
    model = tuned.profile_for(RECORDED, profile, None if name == view.FITTED else W.load_profile(name).draft_speed)
    speed = None if name == view.FITTED else model.draft_speed
    verdict, table, chart, text = view.best_view(name, speed or 1.0, OWN)
    # the table: tuned.csv's rows, in words
    shown = table.set_index("method")
    for method, r in rows.iterrows():
        line = shown.loc[tuned.TITLES[method]]
        assert line[f"speedup on {profile} (MODELLED)"] == f"{r.speedup:.2f}×"
        assert line["ms per step (MODELLED)"] == round(r.step_ms, 2) and line["τ (RECORDED)"] == round(r.tau, 2)
    # the verdict quotes the same speedups
    assert f"{rows.loc['mirror'].speedup:.2f}×" in verdict
    rival = rows.drop(index=["vanilla", "mirror", tuned.PAPER]).speedup.max()
    assert f"{rival:.2f}×" in verdict
    # the map: EAGLE's and ss's levels are tuned.csv's; its sentence reads the drawn grid
    hit = tuned.hit_rate_of(RECORDED, profile)
    grid = tuned.lead_map(RECORDED, profile, model, hit)
    assert grid.eagle.iloc[0] == pytest.approx(rows.loc["eagle"].speedup)
    assert grid.ss.iloc[0] == pytest.approx(rows.loc["ss"].speedup)
    shipped = (tuned.draft_alpha(RECORDED), model.draft_ratio())
    assert text.startswith(tuned.map_sentence(RECORDED, profile, model, shipped, hit))
    passes = tuned.lead_threshold(RECORDED, profile, model, hit, shipped[1], against="eagle")
    if passes is not None:  # the model's own numbers: Mirror-SD 5% above EAGLE-2 from there, not below
        assert f"passes EAGLE-2 by 5% once the draft accepts {passes:.2f} per token" in text
        point = W.lead_map(model, [passes], [shipped[1]], tuned.forms(RECORDED, profile),
                           tuned.levels(RECORDED, profile), hit, tuned.typical_meta(RECORDED)).iloc[0]
        assert point.mirror >= 1.05 * point.eagle
    assert {"Mirror-SD leads by 5% or more", "EAGLE-2 leads by 5% or more"} <= {t.name for t in chart.data}
    # the controls at the best window give the map's value at the same point
    for alpha in (0.5, 0.8):
        point = W.lead_map(model, [alpha], [model.draft_ratio()], tuned.forms(RECORDED, profile),
                           tuned.levels(RECORDED, profile), hit, tuned.typical_meta(RECORDED)).iloc[0]
        for method in ("sd", "mirror"):
            controls = tuned.controls_speedup(RECORDED, profile, model, method, alpha, hit)
            assert controls["speedup"] == pytest.approx(point[method]) and controls["gamma"] == point[f"{method}_gamma"]


def test_the_controls_column_under_knobs_is_the_map_s_model():
    _, path = recorded_races()[0]
    _, _, current = load_race(path)
    knobs = dict(alpha=0.7, hit_rate=0.8, window=None)
    profile = W.load_profile("paper-14b")
    table = view.speedup_table(current, view.race_runs(current), profile, knobs, "paper-14b").set_index("method")
    s = tuned.controls_speedup(RECORDED, "paper-14b", profile, "mirror", 0.7, 0.8)
    assert table.loc["Mirror-SD", "MODELLED in the long run (controls)"].startswith(f"{s['speedup']:.2f}×")
    fixed = tuned.controls_speedup(RECORDED, "paper-14b", profile, "mirror", 0.7, 0.8, window=3)
    assert fixed["gamma"] == 3 and fixed["speedup"] <= s["speedup"] + 1e-9


@pytest.mark.parametrize("folder", ["cpu-best", "nvidia-h200"])
def test_every_step_sentence_names_parts_that_sum_to_the_table_s_step_time(folder):
    races = [(n, p) for n, p in recorded_races() if Path(p).parent.name == folder]
    _, _, current = load_race(races[0][1])
    runs = view.race_runs(current)
    for name in ("paper-14b", "h200-embedded"):
        profile = W.load_profile(name)
        table = view.speedup_table(current, runs, profile, OWN, name).set_index("method")
        for method, r in runs.items():
            parts = W.step_parts(r.trace, profile)
            assert "host" in parts
            assert sum(parts.values()) == pytest.approx(table.loc[r.title, "MODELLED step ms"], abs=0.006)
        why = view.why_text(runs, profile, OWN)
        for method in ("mirror", "eagle"):
            assert f"= **{table.loc[runs[method].title, 'MODELLED step ms']:.2f} ms**" in why
        assert "the host's turns" in why


@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not shutil.which("chromium"),
                    reason="Chromium is not installed here (CI installs Debian's chromium: see .ci/run)")
def test_browser_shows_the_best_settings_table_and_the_map(app_url):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser, page = open_app(p, app_url)
        page.get_by_role("tab", name="What if").click()
        expect(page.locator("#whatif-verdict")).to_contain_text("On paper-14b, Mirror-SD", timeout=60_000)
        rows = RECORDED.best[RECORDED.best.profile == "paper-14b"].set_index("method")
        best = page.locator("#whatif-best")
        expect(best).to_contain_text(tuned.in_words("mirror", rows.loc["mirror"].options, 30))
        expect(best).to_contain_text(f"{rows.loc['eagle'].speedup:.2f}×")
        expect(page.locator("#whatif-map .js-plotly-plot")).to_be_visible(timeout=30_000)
        expect(page.locator("#whatif-map")).to_contain_text("Mirror-SD leads by 5% or more")
        expect(page.locator("#whatif-map-text")).to_contain_text("the shipped draft accepts")
        browser.close()


def test_every_setting_the_table_names_has_a_glossary_entry():
    from app.intro import GLOSSARY

    assert set(tuned.WORDS) == set(tuned.GLOSSED)
    for option, term in tuned.GLOSSED.items():
        assert term in GLOSSARY, option
    for term in ("acceptance per token (α)", "draft cost", "profile", "best settings", "long run"):
        assert term in GLOSSARY
