"""Recorded races (app/recorded): they ship with the repo, open with no model, and step through."""
import json
import threading

import pytest

import app.race
from app import handlers
from app.race import run_race
from app.replay import RECORDED, load_race, open_recorded, recorded_races, save_race
from mirror_sd import METHODS
from mirror_sd.tools.bench import DEFAULT_PROMPTS, first_per_category, read_prompts

NAMES = list(METHODS)


@pytest.fixture
def no_model(monkeypatch):
    """Anything that would decode or load a model fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a recorded race must not load or run a model")

    for name in ("stream", "generate"):
        monkeypatch.setattr(app.race, name, refuse)
    monkeypatch.setattr("mirror_sd.load_pair", refuse)
    monkeypatch.setattr("mirror_sd.models.pair.load_pair", refuse)


BEST_ON_CPU = {"sd": {"gamma": 3}, "mirror": {"exit_layer": 14, "branch_budget": 4}}  # docs/app/race.md: from which sweeps


def test_every_example_prompt_has_a_small_recorded_race_on_the_cpu_at_defaults_and_best_settings_and_on_a_gpu():
    races = recorded_races()
    examples = {item["turns"][0] for item in first_per_category(read_prompts(DEFAULT_PROMPTS), 1)}
    on_gpu = [path for label, path in races if label.endswith("(on NVIDIA H200, 2026-11-27)")]
    best = [path for label, path in races
            if "(on AMD EPYC, 2 CPU cores, " in label
            and label.endswith(", at best settings: sd gamma 3; mirror exit layer 14, branch budget 4)")]
    on_cpu = [path for label, path in races if path not in on_gpu + best]
    assert len(on_cpu) == len(best) == len(on_gpu) == len(examples)
    assert ({load_race(path)[0] for path in on_cpu} == {load_race(path)[0] for path in on_gpu}
            == {load_race(path)[0] for path in best} == examples)
    for path in on_cpu + best:  # each CPU race names the dtype its target ran in
        assert load_race(path)[1]["dtype"].startswith(("fp32", "bf16"))
    for path in best:  # recorded on this CPU with those settings, every other option at its default
        prompt, meta, results = load_race(path)
        assert meta["options"] == BEST_ON_CPU and "(on " not in meta["settings"]
        for method, chosen in BEST_ON_CPU.items():
            assert {k: results[method].trace.meta["options"][k] for k in chosen} == chosen
    assert sum(p.stat().st_size for p in RECORDED.glob("**/*.json")) < 2_000_000  # the repo stays small
    for label, path in races:  # each names the machine and the day it ran on, none "this CPU"
        prompt, meta, results = load_race(path)
        assert meta["hardware"] and meta["date"] and f"(on {meta['hardware']}, {meta['date']}" in label
        # the app races a prompt's first turn: a multi-turn prompt's race says so
        assert label.startswith(("multi-turn, first turn" if meta["category"] == "multi-turn" else meta["category"])
                                + ": ")
        assert list(results) == NAMES and all(r.finished in ("eos", "length") for r in results.values())
        reference = results["vanilla"].trace.steps
        for r in results.values():  # recorded at temperature 0: every method commits vanilla's tokens
            assert [t for s in r.trace.steps for t in s.committed] == [t for s in reference for t in s.committed]


def test_the_gpu_races_show_the_draft_on_a_second_stream_under_the_target_suffix():
    """Recorded from gpu-check's bench on an H200: spans from CUDA events, the draft lane a second stream
    of the target's GPU, and Mirror-SD's rollouts running while the target suffix runs."""
    for label, path in recorded_races():
        if "(on NVIDIA H200" not in label:
            continue
        prompt, meta, results = load_race(path)
        assert meta["graphs"] == "on" and "NVIDIA H200" in meta["hardware"] and meta["note"]
        mirror = results["mirror"].trace
        assert mirror.meta["span_clocks"] == {"target": "CUDA events", "draft": "CUDA events"}
        assert mirror.meta["draft_lane"].endswith("cuda:0, 2nd stream")
        assert results["mirror"].metrics["overlap"] > 0.1  # a share of the draft's work hidden under the target's
        suffix = [s for s in mirror.spans if s.kind == "target-suffix"]
        rollouts = [s for s in mirror.spans if s.kind == "draft-rollout"]
        assert any(r.start < s.end and s.start < r.end for r in rollouts for s in suffix)
        assert "every forward a CUDA graph" in open_recorded(path).status


def test_a_recorded_race_opens_and_steps_through_with_no_model(no_model):
    (label, path), *_ = recorded_races()
    page = open_recorded(path)
    assert page.status.startswith("Recorded on ") and page.prompt == load_race(path)[0]
    current = page.results
    assert all('class="card"' in card for card in page.cards.values()) and set(current) == set(NAMES) == set(page.cards)
    views = handlers.views(current)
    assert views.timeline is not None and views.utilisation is not None and views.files
    assert views.step_method["value"] == "mirror"
    steps = current["mirror"].trace.steps
    for step in (steps[0], steps[1], steps[-1]):
        sentence, text, step_timeline, tree = handlers.show_step(current, "mirror", step.index)
        assert sentence.startswith(f"Step {step.index} ") and 'class="tokens"' in text
    assert handlers.move(current, "mirror", steps[-1].index, 1) == steps[-1].index


def test_a_race_saved_and_loaded_draws_the_same_cards(tiny_pair, tmp_path):
    for results in run_race(tiny_pair, "t1 t2 t3", ["vanilla", "sd", "mirror"], threading.Event(), max_new_tokens=8):
        pass
    path = save_race(tmp_path / "tiny.json", "t1 t2 t3", results, dict(category="tiny", hardware="here", date="today"))
    prompt, meta, loaded = load_race(path)
    assert prompt == "t1 t2 t3" and meta["hardware"] == "here" and list(loaded) == list(results)
    for name, r in results.items():
        assert loaded[name].trace.to_dict()["steps"] == json.loads(json.dumps(r.trace.to_dict()["steps"]))
        assert loaded[name].pieces == r.pieces
        assert loaded[name].metrics == r.metrics
    assert recorded_races(tmp_path) == [("tiny: t1 t2 t3 (on here, today)", str(path))]
