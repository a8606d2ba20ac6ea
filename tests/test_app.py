"""The app's builders on real runs of a tiny pair: race, cards, token HTML, sentences, figures, trees, export."""
import inspect
import json
import sys
import threading
import time
import types
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from app import figures
from app.cards import baseline, card_html
from app.explain import explain
from app.handlers import check_prompt, hardware_notice
from app.export import export_files
from app.lanes import row_label
from app.race import run_race
from app.replay import commit_times, last_step_at
from app.tokens import ORIGIN_COLOURS, legend_html, text_html
from app.trees import ACCEPTED, REJECTED, ROOT, TARGET_MISS, USED, step_tree
from mirror_sd import METHODS
from mirror_sd.devices import Lane
from mirror_sd.trace import DraftTree, Step, Trace

PROMPT = "t1 t2 t3"
MIRROR = dict(gamma=3, kappa=2, branch_budget=3)
TINY_METHODS = ("vanilla", "sd", "mirror")  # need nothing beyond a target and a draft


@pytest.fixture(scope="module")
def race(tiny_pair):
    """One finished race of every registered method on the tiny pair."""
    results = None
    for results in run_race(tiny_pair, PROMPT, list(METHODS), threading.Event(), max_new_tokens=24,
                            options={"mirror": MIRROR}):
        pass
    return results


def test_race_runs_every_method_in_turn_vanilla_first(race):
    assert list(race)[0] == "vanilla" and set(race) == set(METHODS)
    for name in TINY_METHODS:
        r = race[name]
        assert r.error is None and r.finished == "length" and r.metrics["new_tokens"] == 24
        assert all(piece_id in r.pieces for s in r.trace.steps for piece_id in s.committed)
    for r in race.values():  # a method the tiny pair cannot run (e.g. needs trained add-ons) says why
        assert r.finished == "length" or (r.finished == "error" and r.error)


def test_timeline_has_one_row_per_lane_and_one_bar_per_span(race):
    mirror = race["mirror"].trace
    fig = figures.timeline({"Mirror-SD": mirror})
    bars = [d for d in fig.data if d.type == "bar"]
    assert sum(len(d.x) for d in bars) == len(mirror.spans)
    assert {y for d in bars for y in d.y} == {"target, GPU role, cpu:0", "draft, NPU role, cpu:1"}
    for d in bars:  # one bar trace per span kind, in that kind's colour, on a ms axis
        kind = d.legendgroup
        spans = [s for s in mirror.spans if s.kind == kind]
        assert d.marker.color == figures.kind_style(kind)[0]
        assert list(d.base) == pytest.approx([1000 * s.start for s in spans])
        assert list(d.x) == pytest.approx([1000 * s.duration for s in spans])
    assert {"target-prefix", "target-suffix", "draft-rollout", "rendezvous"} <= {d.legendgroup for d in bars}


def test_spans_too_brief_to_see_get_a_tick_mark_each():
    from mirror_sd.trace import Span, Trace

    lane = "target, GPU role, cpu:0"
    trace = Trace("mirror")
    trace.lanes = {lane: "target"}
    trace.spans = [Span(lane, "target-suffix", "", 0.0, 1.0, 1), Span(lane, "rendezvous", "", 1.0, 1.0005, 1),
                   Span(lane, "target-suffix", "", 1.0005, 2.0, 2), Span(lane, "rendezvous", "", 2.0, 2.0005, 2)]
    ticks = [d for d in figures.timeline({"Mirror-SD": trace}).data if d.type == "scatter"]
    assert [d.legendgroup for d in ticks] == ["rendezvous"] and list(ticks[0].x) == pytest.approx([1000, 2000])


def test_timelines_share_one_x_range_and_highlight_a_step(race):
    traces = {race[n].title: race[n].trace for n in TINY_METHODS}
    fig = figures.timeline(traces, step=2)
    end = max(s.end for t in traces.values() for s in t.spans)
    axes = [fig.layout.xaxis] + [getattr(fig.layout, f"xaxis{i}") for i in range(2, len(traces) + 1)]
    assert all(axis.range[1] == pytest.approx(1.02 * 1000 * end) for axis in axes)
    assert all(axis.matches == f"x{len(traces)}" for axis in axes[:-1])  # zooming one zooms all
    for d in fig.data:
        steps = [c[0] for c in d.customdata]
        assert list(d.marker.opacity) == [1.0 if s == 2 else 0.25 for s in steps]


def test_utilisation_matches_busy_time_from_spans(race):
    trace = race["sd"].trace
    fig = figures.utilisation({"sd": trace})
    end = max(s.end for s in trace.spans)
    shares = {d.y[0]: d.x[0] for d in fig.data if d.type == "bar"}
    for lane, busy in trace.busy_seconds().items():
        assert shares[lane] == pytest.approx(100 * busy / end)
        times, pct = figures.busy_over_time(trace, lane, end, bins=50)
        assert sum(p / 100 * end / 50 for p in pct) == pytest.approx(busy)  # the bins add back to the busy time


def test_the_utilisation_tab_redraws_its_chart_when_shown(race):
    from app.handlers import redraw_utilisation

    first, again = redraw_utilisation(race), redraw_utilisation(race)
    assert [d.name for d in first.data] == [d.name for d in again.data] and first.layout.meta != again.layout.meta
    assert redraw_utilisation({}) == {"__type__": "update"}  # nothing to draw before a race


def test_token_html_colours_origins_and_strikes_rejected_drafts(race):
    r = race["sd"]
    page = text_html(r.trace, r.pieces)
    for origin in {o for s in r.trace.steps for o in s.origins}:
        assert ORIGIN_COLOURS[origin] in page
    rejected = sum(len(s.rejected) for s in r.trace.steps if s.origins and s.origins[-1] == "correction")
    assert rejected > 0 and page.count("line-through") == rejected
    assert "rejected draft token" in legend_html() and all(c in legend_html() for c in ORIGIN_COLOURS.values())
    upto = text_html(r.trace, r.pieces, upto=2, current=2)
    assert upto.count('title="step 3') == 0 and "outline" in upto


def test_card_shows_measured_numbers_and_speedup_over_vanilla(race):
    rate = baseline(race)
    assert rate == race["vanilla"].metrics["tokens_per_s"]
    card = card_html(race["sd"], rate)
    speedup = race["sd"].metrics["tokens_per_s"] / rate
    assert f"{speedup:.2f}× vanilla" in card and "τ" in card and 'data-state="length"' in card


def test_a_run_too_short_to_time_claims_no_speedup_and_no_winner(tiny_pair):
    """With max new tokens 1 every method's time is the prompt's prefill: no card claims a speedup
    (each says it is too short to time) and a guess gets no winner."""
    from app.predict import reveal
    from app.race import TIMED_TOKENS, run_race

    *_, short = run_race(tiny_pair, PROMPT, ["vanilla", "sd", "mirror"], threading.Event(), max_new_tokens=1)
    rate = baseline(short)
    for method in ("sd", "mirror"):
        card = card_html(short[method], rate)
        assert "× vanilla" not in card and "too short to time" in card
    assert "too few to time" in reveal(short, "sd") and "Right!" not in reveal(short, "sd")
    *_, long = run_race(tiny_pair, PROMPT, ["vanilla", "sd"], threading.Event(), max_new_tokens=TIMED_TOKENS)
    assert "× vanilla" in card_html(long["sd"], baseline(long))


def test_a_race_above_temperature_zero_says_what_lossless_means_there(tiny_pair, race):
    from app.handlers import race_status

    *_, sampled = run_race(tiny_pair, PROMPT, ["vanilla", "sd"], threading.Event(), max_new_tokens=8, temperature=1.5)
    assert "Lossless at temperature 1.5" in race_status(sampled, done=True)
    assert "Lossless at" not in race_status(race, done=True)  # temperature 0: the same tokens, said elsewhere


def test_a_guess_on_a_race_already_over_is_answered_at_once(race):
    """A recorded race opened, or a race that has ended: picking a guess reveals the answer from the numbers
    on the page; a guess during a race waits for its end."""
    from app.predict import guess_made
    from app.replay import load_race, recorded_races

    titles = {m: r.title for m, r in race.items()}
    assert guess_made(race, "sd", titles).startswith(("**Right!**", "**Not this time**"))
    _, _, recorded = load_race(recorded_races()[0][1])
    assert guess_made(recorded, "mirror", titles).startswith(("**Right!**", "**Not this time**"))
    running = {**race, "sd": replace(race["sd"], finished="running")}
    assert "The answer comes when the race ends" in guess_made(running, "sd", titles)


def inspect_metrics(card: str) -> list[tuple[str, str]]:
    """(data-metric, title) of every number on a card."""
    import html as html_lib
    import re

    return [(k, html_lib.unescape(t)) for k, t in re.findall(r'data-metric="([^"]+)" title="([^"]*)"', card)]


def test_the_glossary_names_every_term_of_the_page_once_and_cards_say_what_a_step_costs(race):
    """Issue 63's jargon, each with one meaning in the visible glossary; 'prefix' means the target's first
    layers only (the text so far is the committed text); each card gives its ms per step beside τ."""
    from app.intro import GLOSSARY, glossary_markdown

    for term in ("window", "early exit", "rendezvous", "token channel", "rollout", "fallback draft", "bonus token",
                 "int8 / fp32", "NPU role", "CUDA graphs", "NVML", "l_e", "T_rv", "prefix layers", "τ (tau)",
                 "lossless", "LIVE / RECORDED / MODELLED / REPORTED", "residual"):
        assert term in GLOSSARY and f"**{term}**" in glossary_markdown()
    assert "committed text" in GLOSSARY["prefix layers"]
    for method in ("sd", "mirror"):  # (the tiny pair has no EAGLE head)
        m = race[method].metrics
        assert f"{figures.ms_text(1000 * m['wall_s'] / m['steps'])}/step" in card_html(race[method], baseline(race))
    sd_steps = [len(s.committed) for s in race["sd"].trace.steps[1:]]
    tau = next(m for m in inspect_metrics(card_html(race["sd"], baseline(race))) if m[0] == "τ")[1]
    ones = f"1: {100 * sd_steps.count(1) / len(sd_steps):.0f}%"
    assert "steps by tokens committed" in tau and (ones in tau or 1 not in sd_steps)  # the histogram behind τ
    from app.trees import step_tree

    assert step_tree(race["mirror"].trace.steps[1])[0].note == "committed text"  # a tree's root


def test_the_page_starts_on_a_typical_prompt_and_says_how_a_prompt_compares(race):
    """The default prompt is the recorded example whose drafts accept the middle amount (mean τ of the
    speculative methods), and a finished race says where its prompt's τ falls among the examples'."""
    from app.handlers import race_status
    from app.prompt_kinds import race_tau, recorded_taus, typical_prompt

    rows = recorded_taus()
    taus = [t for *_, t in rows]
    assert len(rows) == 6 and taus == sorted(taus)
    middle = typical_prompt("")
    assert middle in {p for _, p, _ in rows} and [t for _, p, t in rows if p == middle][0] == taus[2]
    status = race_status(race, done=True)
    assert f"τ {race_tau(race):.2f} averaged over the speculative methods" in status
    assert f"from {taus[0]:.2f}" in status and f"to {taus[-1]:.2f}" in status


def test_one_typical_step_of_each_method_is_drawn_on_one_millisecond_axis(race):
    """The race's zoomed view: per method the step of median duration (Mirror-SD: after a hit and after a
    miss, the latter starting with its fallback draft), its spans from the step's start, one x axis."""
    ran = [r for r in race.values() if len(r.trace.steps) > 1]  # (the tiny pair has no EAGLE head)
    fig = figures.zoomed_steps({r.title: r.trace for r in ran})
    titles = [a.text for a in fig.layout.annotations]
    for r in ran:
        assert any(t.startswith(f"{r.title}: ") and " ms, " in t for t in titles)
    mirror = [t for t in titles if t.startswith("Mirror-SD: ")]
    assert any("after a hit" in t for t in mirror) and any("fallback draft first" in t for t in mirror)
    (what, k), *_ = figures.typical_steps(race["sd"].trace)
    durations = sorted(max(s.end for s in figures.step_spans(race["sd"].trace, i))
                       - min(s.start for s in figures.step_spans(race["sd"].trace, i))
                       for i in range(1, len(race["sd"].trace.steps)) if figures.step_spans(race["sd"].trace, i))
    spans = figures.step_spans(race["sd"].trace, k)
    assert max(s.end for s in spans) - min(s.start for s in spans) == durations[(len(durations) - 1) // 2]
    assert {"draft", "verify"} <= {s.kind for s in spans}  # sd: the draft, then the verification
    bars = [b for b in fig.data if b.type == "bar"]
    assert min(b.base[0] for b in bars) == 0.0 and all(b.base[0] >= 0 for b in bars)


def test_sentences_follow_the_trace(race):
    sd = race["sd"]
    assert "3-token prompt" in explain(sd.trace, 0, sd.pieces)
    for step in sd.trace.steps[1:]:
        assert f"accepted {step.accepted} of {len(step.proposed)} draft tokens" in explain(sd.trace, step.index, sd.pieces)
    mirror = race["mirror"]
    steps = mirror.trace.steps[1:]
    assert {s.rendezvous.hit for s in steps} == {True, False}
    for before, step in zip([None, *steps], steps):  # each step's outcome and its window's source, by number
        sentence = explain(mirror.trace, step.index, mirror.pieces)
        k, outcome = step.index, "hit" if step.rendezvous.hit else "miss"
        assert f"This step was a {outcome}" in sentence
        assert (f"so step {k + 1}" in sentence) == (step is not steps[-1])  # the last: "the run ended here"
        if before is not None:
            assert f"step {k - 1} was a {'hit' if before.rendezvous.hit else 'miss'}" in sentence
    assert "one forward pass" in explain(race["vanilla"].trace, 3, race["vanilla"].pieces)


def test_a_tree_step_says_which_path_was_accepted_not_the_whole_tree(tiny_dirs):
    from mirror_sd import generate, load_pair

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["target"]))  # a draft that agrees: leaves
    out = generate(pair, PROMPT, method="sd", max_new_tokens=12, raw=True, tree=8, gamma=3)
    pieces = {t: f"t{t}" for t in out.token_ids}
    steps = out.trace.steps[1:]
    assert any(s.accepted < len(s.proposed) and s.origins[-1] == "bonus" for s in steps)  # a leaf, not all 8
    for step in steps:
        sentence = explain(out.trace, step.index, pieces)
        assert f"accepted a path of {step.accepted} of the tree's {len(step.proposed)} draft tokens" in sentence
        assert "accepted all" not in sentence


def test_sentences_say_when_the_streams_rode_in_the_verify_forward(tiny_dirs):
    from mirror_sd import generate, load_pair
    from test_ss import random_streams

    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    pair.one_forward_streams = random_streams(pair.target, layers=1, G=3)  # no next-token input
    out = generate(pair, PROMPT, method="ss", max_new_tokens=8, raw=True, gamma=2, top_k=2, total_tokens=3,
                   lookup=0, one_forward=1)
    pieces = {t: f"t{t}" for t in out.token_ids}
    for step in out.trace.steps[1:]:  # 3 tree nodes + the root, 2 streams each
        assert "8 speculative stream rows" in explain(out.trace, step.index, pieces)


def test_mirror_tree_marks_the_window_candidates_and_the_branch_used(race):
    steps = race["mirror"].trace.steps[1:]
    for step in steps:
        nodes = step_tree(step)
        assert nodes[0].kind == ROOT
        chain = nodes[1:1 + len(step.proposed)]
        assert [n.kind for n in chain] == [ACCEPTED] * step.accepted + [REJECTED] * (len(chain) - step.accepted)
        marked = [n for n in nodes if n.kind in (USED, TARGET_MISS) and nodes[n.parent].kind in (ROOT, ACCEPTED, REJECTED)]
        assert [n.token for n in marked] == [step.committed[-1]]  # the target's token, at the accepted depth
        assert (marked[0].kind == USED) == step.rendezvous.hit
    fig = figures.tree(steps[0], race["mirror"].pieces)
    assert {d.name for d in fig.data if d.name} >= {"root", "rolled out"}


def test_generic_draft_tree_from_tokens_and_parents():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[-1, 0, 0, 1], depths=[1, 2, 2, 3], scores=[0.9, 0.5, 0.3, 0.4],
                     path=[0, 1])
    nodes = step_tree(Step(1, [5, 6], ["accepted", "accepted"], tree=tree))
    assert [n.parent for n in nodes] == [None, 0, 1, 1, 2]
    assert [n.kind for n in nodes[1:]] == [ACCEPTED, ACCEPTED, "draft node", "draft node"]
    fig = figures.tree(Step(1, [5, 6], ["accepted", "accepted"], tree=tree), {5: "a", 6: "b", 7: "c", 8: "d"})
    assert sum(len(d.x) for d in fig.data if d.mode != "lines") == 5


def test_export_files_parse_back(race, tmp_path):
    traces = {name: race[name].trace for name in TINY_METHODS}
    paths = export_files(traces, tmp_path, pieces={name: race[name].pieces for name in TINY_METHODS}, stamp="race-1")
    assert len(paths) == 4 * len(traces) and all(Path(p).name.startswith("race-1-") for p in paths)
    for name, trace in traces.items():
        back = Trace.from_json((tmp_path / f"race-1-{name}.json").read_text())
        assert back.spans == trace.spans and [s.committed for s in back.steps] == [s.committed for s in trace.steps]
        assert len(pd.read_csv(tmp_path / f"race-1-{name}-spans.csv")) == len(trace.spans)
        steps = pd.read_csv(tmp_path / f"race-1-{name}-steps.csv", keep_default_na=False)
        assert list(steps.text) == ["".join(race[name].pieces[t] for t in s.committed) for s in trace.steps]
        events = json.loads((tmp_path / f"race-1-{name}.chrome.json").read_text())["traceEvents"]
        assert sum(e["ph"] == "X" for e in events) == len(trace.spans)


def test_replay_follows_measured_commit_times(race):
    trace = race["mirror"].trace
    times = commit_times(trace)
    assert last_step_at(trace, -1.0) == -1 and last_step_at(trace, max(times.values())) == trace.steps[-1].index
    for step in trace.steps:
        assert last_step_at(trace, times[step.index]) >= step.index


def test_stop_keeps_the_text_so_far_and_skips_the_rest(tiny_pair):
    stop, seen = threading.Event(), []
    for results in run_race(tiny_pair, PROMPT, ["vanilla", "sd"], stop, max_new_tokens=150):
        seen.append(results["vanilla"].metrics.get("new_tokens", 0))
        if seen[-1] >= 5:
            stop.set()
    assert results["vanilla"].finished == "stopped" and 5 <= results["vanilla"].metrics["new_tokens"] < 150
    assert results["sd"].finished == "skipped" and not results["sd"].trace.steps


def test_bad_options_and_prompts_become_messages(tiny_pair):
    results = None
    for results in run_race(tiny_pair, PROMPT, ["vanilla", "sd"], threading.Event(), max_new_tokens=4,
                            options={"sd": {"gamma": 0}}):
        pass
    assert "gamma must be between" in results["sd"].error and results["sd"].finished == "error"
    assert results["vanilla"].error is None
    for results in run_race(tiny_pair, "   ", ["vanilla"], threading.Event(), max_new_tokens=4):
        pass
    assert "prompt is empty" in results["vanilla"].error
    for results in run_race(tiny_pair, "t1 " * 300, ["vanilla"], threading.Event(), max_new_tokens=4):
        pass
    assert "does not fit the target's context" in results["vanilla"].error


def test_page_says_when_both_lanes_are_one_kind_of_hardware(tiny_pair):
    notice = hardware_notice(tiny_pair)
    assert notice.startswith(f"Models: target **{tiny_pair.target_name}**, draft **{tiny_pair.draft_name}**. ")
    assert "Target lane: **cpu:0**, playing the GPU; draft lane: **cpu:1**, playing the NPU." in notice
    assert "stand in for the two separate devices" in notice
    assert ("int8" in notice) == tiny_pair.int8_drafting  # the app says when drafting runs in int8
    assert "Weights: **fp32: no native bf16**." in notice  # and which dtype runs, and why
    assert check_prompt("", ["sd"]).startswith("the prompt is empty") and check_prompt("hi", []) is not None
    one_gpu = types.SimpleNamespace(target_lane=Lane("target", torch.device("cuda", 0)),
                                    draft_lane=Lane("draft", torch.device("cuda", 0)))  # as make_lanes, one GPU
    assert "two CUDA streams of one GPU (cuda:0)" in hardware_notice(one_gpu)
    two_gpus = types.SimpleNamespace(target_lane=one_gpu.target_lane, draft_lane=Lane("draft", torch.device("cuda", 1)))
    notice = hardware_notice(two_gpus)
    assert "stand in for the two separate devices" in notice and "streams" not in notice


def test_the_app_races_the_models_it_is_started_with(tiny_dirs):
    from app.__main__ import pair_factory

    assert pair_factory(None, None, []) is None  # the embedded pair (build_demo's default)
    load = pair_factory(str(tiny_dirs["target"]), "self:1", [])
    pair = load(target_device="cpu", draft_device="cpu")
    assert pair.target_name == str(tiny_dirs["target"]) and pair.draft_name == "self:1"
    assert pair.target_lane.device.type == "cpu"


def test_the_race_asks_for_a_gpu_only_where_spaces_is_installed(tiny_pair, monkeypatch):
    """On a ZeroGPU Space, ``spaces.GPU`` wraps the Run handler; elsewhere nothing is wrapped."""
    from app import ui

    wrapped = []
    fake = types.ModuleType("spaces")
    fake.GPU = lambda fn: wrapped.append(fn) or fn
    monkeypatch.setitem(sys.modules, "spaces", fake)
    ui.build_demo(lambda **devices: tiny_pair)
    assert [fn.__name__ for fn in wrapped] == ["race"] and inspect.isgeneratorfunction(wrapped[0])

    monkeypatch.setitem(sys.modules, "spaces", None)  # import spaces -> ImportError
    runner = lambda: None  # noqa: E731
    assert ui._on_gpu(runner) is runner


def test_settings_out_of_range_are_brought_in_with_a_message():
    from app.handlers import settle_boxes
    from app.inputs import settle

    assert settle("max_new", 0) == (1, "Max new tokens: 0 is out of range (1 to 512); using 1.")
    assert settle("max_new", -5)[0] == 1 and settle("max_new", 100000)[0] == 512
    assert settle("temperature", -1) == (0.0, "Temperature: -1 is out of range (0 to 2); using 0.")
    assert settle("max_new", 48) == (48, None) and settle("runs", 3) == (3, None)
    assert settle("max_new", "abc")[1].endswith("'abc' is not a number; using the default 48.")
    assert settle("max_new", None)[1] == "Max new tokens: the box is empty; using the default 48."
    *boxes, note = settle_boxes(100000, -1, 1.0, 0, 1)
    assert boxes == [512, 0.0, 1.0, 0, 1] and "100000 is out of range" in note and "-1 is out of range" in note


def test_status_says_done_only_when_the_race_is_over(race):
    from app.handlers import race_status

    between = {name: types.SimpleNamespace(**vars(r)) for name, r in race.items()}
    for i, r in enumerate(between.values()):  # the first method done, the others still to come
        r.finished, r.title, r.error = ("length" if i == 0 else "waiting"), race[r.method].title, None
    assert race_status(between).startswith("Running **")
    assert race_status(race, done=True).startswith("Done.")
    waiting = {n: types.SimpleNamespace(finished="waiting", title=n) for n in race}
    assert "once per server" in race_status(waiting, cold=True) and "once per server" not in race_status(waiting)
    assert "Warming up… 12 s" in race_status(waiting, cold=True, waited_s=12.3)
    assert "(run 2 of 3)" in race_status(waiting, run=1, runs=3)


def test_status_explains_a_text_that_ends_in_a_loop(embedded_pair):
    from app.handlers import LOOP_TOKENS, race_status

    def finished(tokens, temperature=0.0):
        steps = [types.SimpleNamespace(committed=[t]) for t in tokens]
        trace = types.SimpleNamespace(steps=steps, meta=dict(temperature=temperature))
        return {"vanilla": types.SimpleNamespace(finished="length", title="Vanilla", error=None, trace=trace,
                                                 timed=True)}
    stuck = [3, 9, 4] + [7, 8] * (LOOP_TOKENS // 2)
    assert "temperature above 0 gives varied text" in race_status(finished(stuck), done=True)
    sampled = race_status(finished(stuck, 0.7), done=True)
    assert "a model this small can repeat itself. **Lossless at temperature 0.7" in sampled
    assert "temperature above 0 gives varied text" not in sampled
    assert "loop" not in race_status(finished([3, 9, 4] + [7, 8, 9] * LOOP_TOKENS), done=True)
    results = None  # a prompt the embedded model answers "1. **1011111..." at temperature 0
    for results in run_race(embedded_pair, "Give me three tips for learning to cook.", ["vanilla"], threading.Event(),
                            max_new_tokens=40):
        pass
    assert "The text ends in a loop" in race_status(results, done=True)


def test_cards_explain_every_number_and_read_as_text(race):
    import re

    from app.intro import METRIC_HELP

    rate = baseline(race)
    sd, mirror = card_html(race["sd"], rate), card_html(race["mirror"], rate)
    keys = set(re.findall(r'data-metric="([^"]+)"', sd + mirror))
    assert {"tok/s", "τ", "accepted", "speedup", "hits", "overlap"} <= keys and keys <= set(METRIC_HELP)
    assert 'data-metric="overlap"' not in sd  # sd's lanes take turns: an overlap would mean nothing
    assert "rejected" not in sd and "line-through" in card_html(race["sd"], rate, rejected=True)
    assert "∅" in legend_html() and "↵" in legend_html()


def test_repeated_runs_show_the_median_and_the_range(race):
    from app.repeat import busy_note, record

    runs = {}
    for _ in range(3):
        record(runs, race)
    runs["sd"][0]["tokens_per_s"] *= 2  # one run twice as fast: a wide spread
    runs["sd"][0]["wall_s"] /= 2
    sd = race["sd"]
    sd.runs = runs["sd"]
    try:
        card = card_html(sd, baseline(race))
    finally:
        sd.runs = []
    tps, wall = sd.metrics["tokens_per_s"], sd.metrics["wall_s"]
    assert f"{tps:.1f} ({tps:.1f}–{2 * tps:.1f}) tok/s" in card and "median of 3 runs" in card, card[:1500]
    assert f"{wall:.2f} s" in card  # every number the median run's, not the last run's
    assert f"{tps / baseline(race):.2f}× vanilla" in card  # the ratio of the medians, as the reveal says
    assert "disagree" in busy_note(runs, False, {"sd": "Speculative decoding"})
    assert "other visitors" in busy_note({}, True, {}) and busy_note({}, False, {}) == ""
    assert "load average 6.0 on 2 cores" in busy_note({}, False, {}, (6.0, 2)) and not busy_note({}, False, {}, (2.5, 2))


def test_a_busy_or_stopped_run_shows_no_bold_speedup(race):
    from dataclasses import replace

    rate = baseline(race)
    quiet = card_html(race["sd"], rate)
    busy = card_html(replace(race["sd"], busy="Note: the machine was busy."), rate)
    assert "<b>" in quiet and "machine busy" not in quiet
    assert "machine busy" in busy and "<b>" not in busy.split('data-metric="speedup"')[1].split("</span>")[0]
    assert 'data-metric="speedup"' not in card_html(replace(race["sd"], finished="stopped"), rate)


def test_option_help_cites_no_repository_paths():
    from app.ui import plain_help

    helps = [plain_help(opt.help) for method in METHODS.values() for opt in method.options]
    assert helps and not any(".py" in h or "()" in h for h in helps)


def test_a_visitor_who_left_never_starts_the_race_they_queued():
    from app.handlers import Stops

    stops = Stops()
    assert not stops.fresh("a").is_set()
    stops.leave("b")  # b's tab closed while b's race waited in the queue
    assert stops.gone("b") and stops.fresh("b").is_set() and not stops.gone("a")


def test_the_line_says_where_a_visitor_stands():
    from app.waiting import Line

    line = Line()
    assert line.join("a") == 0 and line.join("b") == 1 and line.join("c") == 2
    assert line.message("a") == "" and "no estimate yet" in line.message("c")
    line.start("a")
    line.leave("a")  # stopped early: nothing learnt from it
    assert "no estimate yet" in line.message("c")
    line.join("a")
    line._since["a"] = time.perf_counter() - 30  # a race of 30 s that ran to the end
    line.leave("a", finished=True)
    assert line.ahead("c") == 1 and "1 race is ahead of yours" in line.message("c")
    assert line.estimate_s("c") == pytest.approx(30, abs=1)  # b has not begun: a whole race (the median here)
    line._since["b"] = time.perf_counter() - 20  # b has run 20 s of its 30
    assert line.estimate_s("c") == pytest.approx(10, abs=1)
    line._since["b"] = time.perf_counter() - 45  # b overruns: c is next, any moment
    assert "any moment now" in line.message("c")
    assert line.behind("b") == 1
    line.leave("b")
    assert line.message("c") == ""


def test_the_wait_sums_each_queued_races_own_estimate_and_one_race_each():
    """A queued race brings its own expected time (the calibrated estimate), so the wait is the sum of the
    races ahead, the running one less what it has run; a race with none counts as the median race here,
    and with neither the line says it has no estimate. A visitor already in line gets no second race,
    and a race that begins drops those ahead of it that never began (they left Gradio's queue)."""
    from app.waiting import Line

    line = Line()
    assert line.enter("a", 12.0) and line.enter("b", 5.0) and line.enter("c", None) and line.enter("d", 7.0)
    assert not line.enter("b", 99.0) and line.ahead("b") == 1  # a second click: refused, nothing changed
    assert "You pressed Run again" in line.message("b") and "pressed Run again" not in line.message("c")
    line.click("d")
    assert "pressed Run again" not in line.message("d")
    line.click("d")  # the page's second click while d waits: the page says so
    assert "You pressed Run again" in line.message("d")
    line.start("a")
    line._since["a"] = time.perf_counter() - 2  # a has run 2 s of its 12
    assert line.estimate_s("b") == pytest.approx(10, abs=0.5) and line.estimate_s("c") == pytest.approx(15, abs=0.5)
    assert line.estimate_s("d") is None and "no estimate yet" in line.message("d")  # c has none, nor a median
    line.leave("a", finished=True)  # 2 s: now the median race here, for c
    assert line.estimate_s("d") == pytest.approx(5 + 2, abs=0.5) and "about 7 s" in line.message("d")
    assert line.enter("a", 3.0) and line.ahead("a") == 3  # a may race again, at the back
    line.start("c")  # b never began before c did: b left the queue
    assert line.ahead("b") is None and line.ahead("d") == 1 and line.behind("c") == 2


def test_a_race_with_others_waiting_is_cut_to_a_fair_share_and_a_lone_one_is_not():
    from app.fair import FAIR_MAX_NEW, FAIR_MIN_NEW, FAIR_RACE_S, fair_share

    assert fair_share(512, 5, 0) == (512, 5, "")  # alone in line: as asked
    max_new, runs, note = fair_share(512, 5, 3)
    assert (max_new, runs) == (FAIR_MAX_NEW, 1)
    assert "3 other visitors are waiting" in note and f"1 run of {FAIR_MAX_NEW} new tokens" in note
    assert "5 runs of 512 new tokens" in note
    assert fair_share(24, 1, 3) == (24, 1, "")  # within the share: nothing said
    slow = fair_share(512, 1, 1, expected_s=lambda n: 2.0 * n)  # 2 s a token: the estimate cuts further
    assert FAIR_MIN_NEW <= slow[0] < FAIR_MAX_NEW and (2.0 * slow[0] <= FAIR_RACE_S or slow[0] == FAIR_MIN_NEW)
    assert fair_share(512, 1, 1, expected_s=lambda n: None)[0] == FAIR_MAX_NEW  # no estimate: the fixed share


def test_reveals_say_why_from_the_run(race):
    from app.predict import fastest, next_step, noted, reveal, reveal_hit

    winner = fastest(race)
    assert reveal(race, None) == "" and reveal(race, "skip") == "" and noted("skip", {}) == ""
    assert noted("sd", {"sd": "Speculative decoding"}).startswith("Your guess: **Speculative decoding**.")
    assert reveal(race, winner.method).startswith("**Right!**") and "tokens per step" in reveal(race, winner.method)
    other = next(n for n in TINY_METHODS if n != winner.method)
    assert reveal(race, other).startswith("**Not this time**")
    assert "busy" not in reveal(race, other)
    winner.busy = "Note: the machine was busy."
    try:
        assert "read these speeds as rough" in reveal(race, other)
    finally:
        winner.busy = ""
    mirror = race["mirror"]
    step = next_step(mirror.trace, 1)
    answer = "hit" if step.rendezvous.hit else "miss"
    assert reveal_hit(mirror, 1, answer).startswith("**Right!**")
    assert reveal_hit(mirror, 1, "miss" if answer == "hit" else "hit").startswith("**Not this time.**")
    assert next_step(race["sd"].trace, 1) is None  # the question is asked on Mirror-SD steps only


def test_lane_labels_say_the_device_the_role_and_a_shared_processor(race):
    fig = figures.timeline({"Mirror-SD": race["mirror"].trace})
    ticks = list(fig.layout.yaxis.ticktext)
    assert "target on cpu:0<br>plays the GPU (same CPU as the other lane)" in ticks
    assert row_label("draft, NPU role, cuda:1", ["target, GPU role, cuda:0", "draft, NPU role, cuda:1"]) == \
        "draft on cuda:1<br>plays the NPU"
    assert row_label("draft, NPU role, cuda:0, 2nd stream",  # one GPU, the draft on its second stream
                     ["target, GPU role, cuda:0", "draft, NPU role, cuda:0, 2nd stream"]) == \
        "draft on cuda:0, 2nd stream<br>plays the NPU (same GPU as the other lane)"
    assert not any("CUDA events" in tick for tick in ticks)  # CPU lanes: the host's readings
    assert row_label("a lane named by hand", []) == "a lane named by hand"


def test_a_gpu_lane_says_its_bars_are_the_gpus_own_time():
    from mirror_sd.trace import Span, Trace

    trace = Trace("vanilla", dict(span_clocks={"target": "CUDA events"}))
    trace.lanes = {"target, GPU role, cuda:0": "target"}
    trace.spans = [Span("target, GPU role, cuda:0", "decode", "", 0.0, 0.002, 1)]
    ticks = list(figures.timeline({"vanilla": trace}).layout.yaxis.ticktext)
    assert ticks == ["target on cuda:0<br>plays the GPU<br>bars: when the GPU itself worked (CUDA events)"]


def _run_of(method: str, lanes: dict, steps: list, step_ms: float, tokens_per_s: float):
    """A finished Result whose decoding steps each took ``step_ms`` on the target lane."""
    from app.race import Result
    from mirror_sd.trace import Span, Trace

    trace = Trace(method)
    trace.lanes = lanes
    target = next(label for label, name in lanes.items() if name == "target")
    trace.spans = [Span(target, "verify", "", i * step_ms / 1000, (i + 1) * step_ms / 1000, step.index)
                   for i, step in enumerate(steps)]
    trace.steps = steps
    metrics = dict(tokens_per_s=tokens_per_s, mean_accepted=2.0, wall_s=len(steps) * step_ms / 1000, steps=len(steps))
    return Result(method, trace, metrics=metrics, finished="length")


def test_a_mirror_guess_behind_sd_hears_why_from_both_runs():
    from app.predict import mirror_behind_sd, reveal
    from mirror_sd.trace import Rendezvous, Step

    one_cpu = {"target, GPU role, cpu:0": "target", "draft, NPU role, cpu:1": "draft"}

    def step(i, fallback, hit):
        return Step(i, [1, 2], ["draft", "correction"], proposed=[1, 5], accepted=1,
                    rendezvous=Rendezvous([[1], [2]], [(1, 2, [3, 4])], 0 if hit else None, fallback, False))

    mirror = _run_of("mirror", one_cpu, [step(1, True, True), step(2, False, True), step(3, False, False),
                                         step(4, True, False)], 160.0, tokens_per_s=9.0)
    sd = _run_of("sd", one_cpu, [Step(i, [7, 8], ["draft", "correction"], [7, 9], 1) for i in (1, 2, 3)], 140.0,
                 tokens_per_s=10.0)
    race = {"sd": sd, "mirror": mirror}
    why = mirror_behind_sd(race)
    assert "took 160 ms on average for 2.00 tokens, against 140 ms for 2.00" in why  # hit's-window steps vs sd
    assert "splitting the target" in why and "same processor" in why
    assert why in reveal(race, "mirror") and why not in reveal(race, "sd")
    faster = dict(race, mirror=_run_of("mirror", one_cpu, mirror.trace.steps, 160.0, tokens_per_s=11.0))
    assert mirror_behind_sd(faster) == ""  # only when it did fall behind
    two_devices = {"target, GPU role, cuda:0": "target", "draft, NPU role, cuda:1": "draft"}
    cheap = _run_of("mirror", two_devices, mirror.trace.steps, 120.0, tokens_per_s=9.0)
    why = mirror_behind_sd(dict(race, mirror=cheap))
    assert "50% of its steps came after a miss" in why and "120 ms each" in why and "same processor" not in why


def test_every_method_of_a_race_warms_up_on_its_prompt_before_any_is_timed(tiny_pair, monkeypatch):
    """No method pays a cold start the others skip (issue 63): before the first timed run, every method
    of the race ran discarded on this very prompt, with the race's options and caches of the race's
    size, and each model (target, draft) had already run a forward of the prompt's length, the first
    timed forward's shape."""
    import app.race as race_module

    events, forwards = [], []
    real_stream = race_module.stream

    def stream(pair, prompt, method, **kw):
        events.append((method, prompt, kw.get("gamma"), kw["max_new_tokens"]))
        return real_stream(pair, prompt, method=method, **kw)

    monkeypatch.setattr(race_module, "stream", stream)
    hooks = [model.model.embed_tokens.register_forward_hook(
        lambda module, args, out, who=who: forwards.append((len(events), who, args[0].shape[-1])))
        for who, model in (("target", tiny_pair.target), ("draft", tiny_pair.draft))]
    prompt = "t4 t5 t6 t7 t8 t9 t10 t11 t12"  # a length no other test's race used
    try:
        for _ in run_race(tiny_pair, prompt, list(TINY_METHODS), threading.Event(), max_new_tokens=12,
                          options={"sd": {"gamma": 3}}):
            pass
    finally:
        for hook in hooks:
            hook.remove()
    first_timed = len(TINY_METHODS)  # the warm-ups, then the timed runs
    warmed, timed = events[:first_timed], events[first_timed:]
    assert [e[0] for e in timed] == list(TINY_METHODS) and len(warmed) == len(TINY_METHODS)
    assert {(m, gamma) for m, p, gamma, _ in warmed if p == prompt} == {("vanilla", None), ("sd", 3), ("mirror", None)}
    assert all(new == 12 for *_, new in events)  # the warm-ups' caches are the race's size
    for who in ("target", "draft"):
        timed = [n for at, w, n in forwards if w == who and at > first_timed]
        assert timed and timed[0] in {n for at, w, n in forwards if w == who and at <= first_timed}


def test_a_long_prompt_is_warmed_up_on_its_first_tokens_with_the_races_cache_size(tiny_pair, monkeypatch):
    """A prompt whose prefill would take longer than the warm-up's budget is not read once more per method
    (issue 69): each warm-up reads its first tokens (as many as ``WARM_PREFILL_S`` of prefill), with max
    new tokens that give its caches the race's own size, so a GPU's stage set is still made untimed."""
    import app.race as race_module
    from app import prompt_cost

    slow = prompt_cost.Speeds(a=0.004, b=0.0, step_s=0.01, c=0.0, rate=250.0, rate_at=64)  # 0.5 s: 125 tokens
    monkeypatch.setitem(prompt_cost._speeds, id(tiny_pair), slow)
    events, real_stream = [], race_module.stream

    def stream(pair, prompt, method, **kw):
        events.append((len(pair.encode(prompt)), kw["max_new_tokens"]))
        return real_stream(pair, prompt, method=method, **kw)

    monkeypatch.setattr(race_module, "stream", stream)
    prompt = " ".join(f"t{i % 16}" for i in range(170))
    tokens = len(tiny_pair.encode(prompt))
    *_, results = run_race(tiny_pair, prompt, ["vanilla", "sd"], threading.Event(), max_new_tokens=8)
    assert all(r.finished == "length" for r in results.values())
    (w1, n1), (w2, n2), *timed = events
    assert timed == [(tokens, 8), (tokens, 8)]
    assert w1 == w2 == slow.warm_tokens(tokens) < tokens and slow.read_s(w1) <= prompt_cost.WARM_PREFILL_S
    assert w1 + n1 == tokens + 8 == w2 + n2


def test_a_prompts_cost_comes_from_measured_speeds_and_only_a_long_prompt_is_refused(tiny_pair):
    """The prompt's expected prefill and race time come from speeds measured on this machine (the engine's
    spans); the limit is on the prompt's own part of the race, so a short prompt is never refused, and
    the longest allowed prompt adds at most the limit (issue 63)."""
    from app.prompt_cost import RACE_LIMIT_S, Speeds, measure_speeds, prompt_line, too_long

    speeds = measure_speeds(tiny_pair)
    assert speeds.a > 0 and speeds.b >= 0 and speeds.c >= 0 and speeds.step_s >= 0 and speeds.rate > 0
    assert speeds.rate_at == tiny_pair.context_length // 4  # a quarter of the tiny context
    slow = Speeds(a=0.001, b=1e-7, step_s=5.0, c=1e-4, rate=900.0, rate_at=1024)  # decoding alone takes minutes
    assert too_long(40, 160, slow, 5, 48) == ""
    limit = slow.max_tokens(5, 48)
    assert slow.prompt_s(limit, 5, 48) <= RACE_LIMIT_S < slow.prompt_s(limit + 1, 5, 48)
    assert slow.max_tokens(2, 48) > limit  # fewer methods read it fewer times
    message = too_long(limit + 1, 4 * (limit + 1), slow, 5, 48)
    assert "Too long for a live race here" in message and f"under about {limit:,} tokens" in message
    line = prompt_line(12, 50, slow, 5, 48)
    assert "**12 tokens**" in line and "per method here" in line and "900 tokens/s at 1,024 tokens" in line
    assert "shows once the models have loaded" in prompt_line(None, 50, None, 5, 48)


def test_every_span_kind_has_its_own_colour_and_legend():
    """The timeline colours spans by trace.SpanKind, the one list of kinds the methods record: every
    kind has an entry, and no two share a colour."""
    from mirror_sd.trace import SpanKind

    styles = [figures.kind_style(kind) for kind in SpanKind]
    assert len({colour for colour, _ in styles}) == len(SpanKind) and all(legend for _, legend in styles)


def test_the_reveal_quotes_the_cards_ms_per_step_and_says_it_is_a_mean(race):
    """The card's ms/step (a mean over the run, prompt included) is the figure the reveal's why quotes,
    also over repeated runs (the medians), and each says which statistic it is (issue 69)."""
    import re

    from app.predict import fastest, reveal

    runs = {n: [dict(r.metrics), dict(r.metrics, wall_s=2 * r.metrics["wall_s"]),
                dict(r.metrics, wall_s=3 * r.metrics["wall_s"])] for n, r in race.items() if r.metrics}
    for current in (race, {n: replace(r, runs=runs.get(n, [])) for n, r in race.items()}):
        winner, rate = fastest(current), baseline(current)
        said = reveal(current, winner.method)
        for method in {winner.method, "vanilla"}:
            card = card_html(current[method], rate)
            ms = re.search(r"([\d.]+) ms/step", card).group(1)
            assert f"{ms} ms" in said
            title = dict(inspect_metrics(card))["ms/step"]
            assert "the mean" in title and "median" in title  # the zoomed step is the median one
        assert "each run's wall time over its steps, reading the prompt included" in said


def recorded_deepest_tree():
    """(dropdown label, result, step) of the recorded races' deepest draft tree."""
    from app.replay import load_race, recorded_races

    def depth(nodes):
        levels = [0] * len(nodes)
        for i, n in enumerate(nodes):
            levels[i] = 0 if n.parent is None else levels[n.parent] + 1
        return max(levels)

    found = []
    for label, path in recorded_races():
        for r in load_race(path)[2].values():
            found += [(depth(nodes), len(nodes), label, r, s) for s in r.trace.steps if (nodes := step_tree(s))]
    return max(found, key=lambda f: f[:2])[2:]


def label_boxes(fig, width_px: float, char_px: float = 7.5, line_px: float = 15) -> list[tuple]:
    """(text, x0, y0, x1, y1) in pixels of every node label of a tree figure drawn ``width_px`` wide (its
    own height): each label starts right of its node (the marker's radius and a gap) and is
    ``char_px`` a character wide, more than an 11-px font's average."""
    layout = fig.layout
    plot_w = width_px - layout.margin.l - layout.margin.r
    plot_h = layout.height - layout.margin.t - layout.margin.b
    (x_lo, x_hi), (y_lo, y_hi) = layout.xaxis.range, layout.yaxis.range
    boxes = []
    for d in fig.data:
        if d.mode != "markers+text":
            continue
        for x, y, text in zip(d.x, d.y, d.text):
            px, py = (x - x_lo) / (x_hi - x_lo) * plot_w + 8, (y_hi - y) / (y_hi - y_lo) * plot_h
            boxes.append((text, px, py - line_px / 2, px + char_px * len(text), py + line_px / 2))
    return boxes


def overlapping(boxes) -> list[tuple[str, str]]:
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]]


def test_no_two_labels_of_the_deepest_recorded_tree_overlap():
    """The tree's labels at every depth stay clear of each other (issue 69: they overlapped at depths 2-3),
    computed from the figure's text positions, at the width of a 1280 px page and of an 800 px one."""
    _, result, step = recorded_deepest_tree()
    fig = figures.tree(step, result.pieces)
    assert len([t for d in fig.data if d.mode == "markers+text" for t in d.text]) > 40
    for width in (1200, 740):
        assert overlapping(label_boxes(fig, width)) == [], width


def test_a_recorded_races_exports_are_named_with_its_recording_not_today():
    """Downloads of a recorded race carry the day it was recorded, its prompt's category and its machine."""
    import tempfile

    from app.replay import RECORDED, load_race

    _, meta, results = load_race(RECORDED / "nvidia-h200" / "qa.json")
    paths = export_files({n: r.trace for n, r in results.items()}, tempfile.mkdtemp())
    assert meta["date"] == "2026-11-27"
    assert all(Path(p).name.startswith("recorded-20261127-qa-nvidia-h200-") for p in paths)
    assert json.loads(Path(paths[2]).read_text())["meta"]["recording"]["hardware"] == "NVIDIA H200"


def test_the_utilisation_chart_says_where_a_gpu_run_has_too_few_nvml_readings():
    """In the H200 summarization recording Speculative Streaming's and Mirror-SD's runs (37 and 48 ms) got one
    NVML reading each, the sampler reading every 50 ms: drawn as a dot, and the chart says why there is
    no line. The legend sits at the foot, clear of the toolbar at the top right (issue 69)."""
    from app.replay import RECORDED, load_race

    _, _, results = load_race(RECORDED / "nvidia-h200" / "summarization.json")
    assert {n: len(r.trace.gpu_samples) for n, r in results.items()} == dict(vanilla=2, sd=2, ss=1, mirror=1, eagle=2)
    fig = figures.utilisation({r.title: r.trace for r in results.values()})
    notes = [a.text for a in fig.layout.annotations if "NVML" in a.text]
    assert notes == ["one NVML reading only (the dot): this run lasted 37 ms, and the GPU is read every 50 ms",
                     "one NVML reading only (the dot): this run lasted 48 ms, and the GPU is read every 50 ms"]
    dots = [d for d in fig.data if d.name == "cuda:0 (NVML)"]
    assert len(dots) == 5 and all("markers" in d.mode for d in dots)
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0
    on_cpu = load_race(RECORDED / "summarization.json")[2]
    assert not any(figures.nvml_note(r.trace) for r in on_cpu.values())  # no GPU: nothing to say


def test_a_recording_that_names_mirror_options_since_removed_still_reads():
    """Recordings made before issue 71 carry Mirror-SD's former options (exit_head, queued, correction,
    branching: rules now); the app reads their settings as the defaults they were."""
    from app import tuned

    old = dict(gamma=2, kappa=4, exit_layer=0, branch_budget=16, streams=0, lookup=8, exit_head=-1, queued=-1,
               correction=1, tree=0, branching=4)
    assert tuned.in_words("mirror", old, 30) == tuned.in_words("mirror", {}, 30)
