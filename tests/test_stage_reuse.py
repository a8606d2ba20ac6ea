"""A pair keeps every setting's stages: alternating settings never makes (on a GPU: captures) one again.

A stage set names each forward (models/forwards.py: ``range_name``), and two forwards may share a
name: ss's two kinds of streams (one_forward 0 and 1) are both "streams a-b". A sweep over such an
option runs its settings in turn on one pair, so if a set kept only the stages of the forward that
last held the name, every run would capture them again, inside its timed span (seen on an H100: a
sweep of ss's one_forward at 0.2x vanilla where the bench ran ss at 0.64x). On the CPU the stages
run eagerly but are made through the same code, so counting the stages made shows it. Tiny models.
"""
import pytest
import torch

import mirror_sd.tools.bench as bench
from mirror_sd import generate, load_pair
from mirror_sd.devices import on_cpu_worker, single_threaded
from mirror_sd.models.stages import LayerRange, Stages, bucket
from test_graphs import random_streams


@pytest.fixture(scope="module")
def pair(tiny_dirs):
    """The tiny pair with graphs on and ss's two kinds of streams, as two objects (as the embedded
    target ships them): both name their stages "streams 1-2"."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")

    def add_ons():  # on the CPU worker: torch work on this thread would start an OpenMP pool here
        pair.streams = random_streams(pair.target, seed=1)
        pair.one_forward_streams = random_streams(pair.target, seed=2)
        pair.attached_streams = True
    on_cpu_worker(add_ons)
    return pair


@pytest.fixture
def made(monkeypatch) -> list[tuple[int, str, int]]:
    """(model layers, stage name, bucket) of every stage made from now on, in order."""
    made, stage = [], Stages.stage

    def counted(self, name, width):
        if (name, bucket(width)) not in self._stages:
            made.append((self.model.num_layers, name, bucket(width)))
        return stage(self, name, width)
    monkeypatch.setattr(Stages, "stage", counted)
    return made


def test_a_name_given_back_to_a_forward_takes_back_its_stages_and_timings(tiny_dirs):
    from mirror_sd.models.loading import load_model

    target = load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)[0]
    first, second = (random_streams(target, seed) for seed in (1, 2))
    with torch.inference_mode(), single_threaded():
        stages = Stages(target, 160)
        stages.add("streams", LayerRange(1, 2, streams=first))
        stages.capture_all(["streams"])
        made_first = {w: stages.stage("streams", w) for w in (1, 8)}
        stages.replay_ms["streams"] = {1: 1.0}  # as if timed on a GPU
        stages.add("streams", LayerRange(1, 2, streams=second))  # another forward under the name: none of its stages yet
        assert stages.missing(["streams"]) and "streams" not in stages.replay_ms
        stages.capture_all(["streams"])
        assert stages.stage("streams", 1).streams is second
        stages.add("streams", LayerRange(1, 2, streams=first))  # back: the first forward's stages and timings return
        assert stages.missing(["streams"]) == [] and stages.replay_ms["streams"] == {1: 1.0}
        assert all(stages.stage("streams", w) is stage for w, stage in made_first.items())


@pytest.mark.parametrize("method,option,values", [("ss", "one_forward", [0, 1]), ("sd", "tree", [0, 6])])
def test_alternating_settings_makes_each_settings_stages_once(pair, made, method, option, values):
    for round_ in range(2):
        for value in values:
            made.clear()
            out = generate(pair, "t1 t2 t3", method=method, max_new_tokens=6, raw=True, gamma=3, **{option: value})
            assert out.error is None
            if round_:  # every setting ran once already
                assert made == [], f"{method} {option}={value} made stages again: {sorted(set(made))}"


def test_a_sweeps_timed_runs_make_no_stage(pair, made, monkeypatch):
    """run_interleaved, as ``sweep`` calls it: its warm-up runs each setting once, so that the
    timed runs after it (prompt by prompt, each setting in turn) make no stage."""
    monkeypatch.setattr(pair, "stage_sets", {})  # no stage made yet, whatever ran before
    calls, run_prompt = [], bench.run_prompt

    def noted(*args, **kwargs):
        calls.append(len(made))
        return run_prompt(*args, **kwargs)
    monkeypatch.setattr(bench, "run_prompt", noted)
    runs = [("vanilla", {}), ("ss", dict(gamma=3, one_forward=0)), ("ss", dict(gamma=3, one_forward=1))]
    prompts = [dict(id=str(i), category="qa", turns=[text]) for i, text in enumerate(["t1 t2 t3", "t4 t5"])]
    bench.run_interleaved(pair, prompts, runs, max_new_tokens=6)
    assert len(calls) == len(runs) * (1 + len(prompts))  # the warm-up, then each prompt
    warm_up = calls[len(runs)]  # stages made before the first timed run
    assert {name for _, name, _ in made[:warm_up]} >= {"full", "streams 1-2"}
    assert made[warm_up:] == []
