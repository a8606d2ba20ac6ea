"""The what-if latency model (mirror_sd/tools/whatif.py): each method's step equation on hand-built
traces, re-timed traces that keep their steps, profiles and their refusals, the fit, the CLI."""
import json
import os
import shutil
from dataclasses import replace

import pytest

from mirror_sd import MirrorSDError
from mirror_sd.cli import main
from mirror_sd.tools import whatif as W
from mirror_sd.trace import DraftTree, DraftWork, Rendezvous, Span, Step, Trace

# target(w) = 10 + w ms; every stage a line, so each equation can be worked by hand
PROFILE = W.Profile("test", "hand-made", {"target": "T", "draft": "D"}, {
    "target": W.Cost.line(10, 1), "prefill": W.Cost.line(20, 0.5), "target_prefix": W.Cost.line(4, 0.5),
    "target_suffix": W.Cost.line(6, 0.5), "draft": W.Cost.line(2, 0.1), "draft_prefill": W.Cost.line(1, 0.1),
    "eagle_head": W.Cost.line(1, 0.5), "streams": W.Cost.line(3, 0)}, rendezvous_ms=0.5, channel_ms=0.25)


def trace_of(method, steps, options=None, two_lanes=False, prompt_tokens=10):
    trace = Trace(method, dict(options=options or {}, prompt_tokens=prompt_tokens, temperature=0.0))
    trace.lanes = {"target, GPU role, cpu:0": "target"}
    if two_lanes:
        trace.lanes["draft, NPU role, cpu:1"] = "draft"
    trace.steps = [Step(0, [7], ["target"])] + steps
    return trace


def step_time(trace, index=1, profile=PROFILE):
    return W.step_ms(W.step_plans(trace)[index], profile)


def chain(index, proposed, accepted, **records):
    committed = proposed[:accepted] + [99]
    origins = ["accepted"] * accepted + ["bonus" if accepted == len(proposed) else "correction"]
    return Step(index, committed, origins, proposed=proposed, accepted=accepted, **records)


def test_vanilla_is_one_target_forward():
    assert step_time(trace_of("vanilla", [Step(1, [5], ["target"])])) == pytest.approx(11)


@pytest.mark.parametrize("accepted", [0, 1, 2])  # miss at once, partly, all accepted (bonus)
def test_sd_is_gamma_draft_forwards_then_one_verify(accepted):
    step = chain(1, [3, 4], accepted, draft=DraftWork(forwards=2))
    assert step_time(trace_of("sd", [step], two_lanes=True)) == pytest.approx(2 * 2.1 + (10 + 3))


def test_sd_prices_the_forwards_the_draft_made():
    copied = chain(1, [3, 4, 5], 1, draft=DraftWork(forwards=3, copied_at=[1]))  # a copied token still took a forward
    assert step_time(trace_of("sd", [copied], two_lanes=True)) == pytest.approx(3 * 2.1 + 14)
    checked = chain(1, [3, 4, 5], 3, draft=DraftWork(forwards=2, lookahead=[(3, 1), (2, 2)]))  # 1 + checked tokens
    assert step_time(trace_of("sd", [checked], two_lanes=True)) == pytest.approx(2.4 + 2.3 + 14)


def test_eagle_is_head_levels_then_one_tree_verify():
    tree = DraftTree(tokens=list(range(8)), parents=[-1, -1, 0, 0, 1, 2, 2, 4], depths=[1, 1, 2, 2, 2, 3, 3, 3],
                     scores=[0.0] * 8, path=[0, 2])
    small = DraftTree(tokens=[1, 2], parents=[-1, 0], depths=[1, 2], scores=[0.0] * 2, path=[0, 1])
    previous = Step(1, [1, 2, 3], ["accepted", "accepted", "bonus"], proposed=[1, 2], accepted=2, tree=small)
    step = Step(2, [0, 2, 9], ["accepted", "accepted", "correction"], proposed=tree.tokens, accepted=2, tree=tree)
    trace = trace_of("eagle", [previous, step], dict(depth=3, top_k=4))
    # the head over the 3 pending pairs, then 2 levels of 4 frontier nodes; verify root + 8 nodes
    assert step_time(trace, 2) == pytest.approx((1 + 1.5) + 2 * (1 + 2) + (10 + 9))  # no target_tree: target's
    own = W.Profile(**{**PROFILE.__dict__, "stages": {**PROFILE.stages, "target_tree": W.Cost.line(12, 2)}})
    assert W.step_ms(W.step_plans(trace)[2], own) == pytest.approx((1 + 1.5) + 2 * (1 + 2) + (12 + 18))


def test_ss_is_a_streams_pass_then_one_tree_verify():
    tree = DraftTree(tokens=[1, 2, 3, 4], parents=[-1, 0, 1, 2], depths=[1, 2, 3, 4], scores=[0.0] * 4, path=[])
    step = Step(1, [5], ["correction"], proposed=tree.tokens, accepted=0, tree=tree)
    assert step_time(trace_of("ss", [step], dict(gamma=4))) == pytest.approx(3 + (10 + 5))


def test_one_stage_drafts_price_eagle_levels_and_the_streams_draft_where_the_profile_has_them():
    """On CUDA graphs EAGLE's tree draft and ss's draft are one stage each, picks inside: a profile
    with eagle_level and stream_draft prices them so; the profile above, without, by the forwards."""
    tree = DraftTree(tokens=[1, 2], parents=[-1, 0], depths=[1, 2], scores=[0.0] * 2, path=[0, 1])
    eagle = trace_of("eagle", [Step(1, [1, 2, 3], ["accepted", "accepted", "bonus"], proposed=[1, 2], accepted=2,
                                    tree=tree)] * 2, dict(depth=3, top_k=4))
    streams = DraftTree(tokens=[1, 2, 3, 4], parents=[-1, 0, 1, 2], depths=[1, 2, 3, 4], scores=[0.0] * 4, path=[])
    ss_step = Step(1, [5], ["correction"], proposed=streams.tokens, accepted=0, tree=streams)
    ss = trace_of("ss", [ss_step], dict(gamma=4))
    graphs = W.Profile(**{**PROFILE.__dict__, "stages": {**PROFILE.stages, "eagle_level": W.Cost.line(4, 0),
                                                         "stream_draft": W.Cost.line(7, 0)}})
    verify = 10 + 3  # root + 2 nodes, as a window (no target_tree)
    assert step_time(eagle, 2) == pytest.approx((1 + 1.5) + 2 * (1 + 2) + verify)  # the head's forwards alone
    assert step_time(eagle, 2, graphs) == pytest.approx((1 + 1.5) + 2 * 4 + verify)
    assert step_time(ss, 1, graphs) == pytest.approx(7 + (10 + 5))
    half = graphs.with_draft_ratio(0.5 * graphs.cost("eagle_head", 1) / graphs.cost("target", 1))
    assert half.cost("eagle_level", 4) == pytest.approx(2)  # scaled with the head, in proportion


def mirror_step(branches=4, hit=True, fallback=False, copied=False, accepted=1, corrected=False):
    rv = Rendezvous(exit_candidates=[[1, 2]] * 3, branches=[(0, 9, [1, 2])] * branches,
                    branch_used=0 if hit else None, fallback=fallback, copied=copied, corrected=corrected)
    return chain(1, [3, 4], accepted, rendezvous=rv)


MIRROR = dict(gamma=2, branch_budget=16)
PREFIX, SUFFIX = 4 + 0.5 * 3, 6 + 0.5 * 3  # window of 3: the last committed token + gamma


@pytest.mark.parametrize("accepted", [0, 2])
def test_mirror_hit_costs_prefix_channel_the_larger_of_suffix_and_rollouts_and_rendezvous(accepted):
    rollouts = (2 + 0.1 * (3 + 4)) + (2 + 0.1 * 4)  # the tree layout forward, then one forward of 4 branches
    assert rollouts < SUFFIX
    trace = trace_of("mirror", [mirror_step(accepted=accepted)], MIRROR, two_lanes=True)
    assert step_time(trace) == pytest.approx(PREFIX + 0.25 + SUFFIX + 0.5)


def test_mirror_rollouts_longer_than_the_suffix_set_the_step():
    rollouts = (2 + 0.1 * 43) + (2 + 0.1 * 40)
    assert rollouts > SUFFIX
    trace = trace_of("mirror", [mirror_step(branches=40)], MIRROR, two_lanes=True)
    assert step_time(trace) == pytest.approx(PREFIX + 0.25 + rollouts + 0.5)


def test_mirror_miss_exposes_a_fresh_draft_and_a_copy_exposes_none():
    hit = step_time(trace_of("mirror", [mirror_step()], MIRROR, two_lanes=True))
    fallback = trace_of("mirror", [mirror_step(hit=False, fallback=True)], MIRROR, two_lanes=True)
    assert step_time(fallback) == pytest.approx(hit + 2 * 2.1)  # gamma draft forwards on the critical path
    copied = trace_of("mirror", [mirror_step(hit=False, copied=True)], MIRROR, two_lanes=True)
    assert step_time(copied) == pytest.approx(hit)


@pytest.mark.parametrize("host_turn", [0.0, 1.5, 10.0])  # shorter than, within, longer than the 4.2 ms rollout
def test_a_correction_rollout_shows_only_what_outlasts_the_host_s_turn_between_the_steps(host_turn):
    """The last step launched it at its picks (methods/mirror.py: roll_out_correction), so it ran while the host
    took its turn: the step after it costs its gamma draft forwards less that turn, never less than
    nothing, and the re-timed trace draws it from the last step's end, beside the host's turn."""
    profile = replace(PROFILE, step_ms=host_turn)
    hit = W.step_ms(W.step_plans(trace_of("mirror", [mirror_step()], MIRROR, two_lanes=True))[1], profile)
    steps = [mirror_step(hit=False), mirror_step(hit=False, corrected=True)]
    steps[1].index = 2
    trace = trace_of("mirror", steps, MIRROR, two_lanes=True)
    assert W.corrects(trace)
    exposed = max(0.0, 2 * 2.1 - host_turn)
    assert W.step_ms(W.step_plans(trace)[2], profile) == pytest.approx(hit + exposed)
    assert W.fallback_ms(trace, profile) == pytest.approx(exposed)
    out = W.retime(trace, profile)
    step_1_end = max(s.end for s in out.spans if s.step == 1)
    correction = next(s for s in out.spans if s.kind == "correction-rollout")
    prefix = next(s for s in out.spans if s.step == 2 and s.kind == "target-prefix")
    assert correction.step == 2 and correction.start == pytest.approx(step_1_end)
    assert correction.duration == pytest.approx(2 * 2.1 / 1000)
    assert prefix.start == pytest.approx(step_1_end + max(host_turn, 2 * 2.1) / 1000)  # no launch turn: phase_ms 0
    assert out.meta["modelled_s"] == pytest.approx(W.modelled_seconds(trace, profile))


def test_tree_windows_price_the_draft_s_tree_levels_and_a_tree_verify():
    """sd --tree: the draft's root forward, then gamma - 1 levels of ``branching`` nodes, then a tree
    verify; mirror --tree: its rollouts feed every branch's frontier per level, and a fallback
    draft grows a tree as sd's does."""
    tree = DraftTree(tokens=[3, 4, 5], parents=[-1, 0, -1], depths=[1, 2, 1], scores=[0.0] * 3, path=[0])
    sd = Step(1, [3, 99], ["accepted", "correction"], proposed=tree.tokens, accepted=1, tree=tree,
              draft=DraftWork(forwards=3))
    own = W.Profile(**{**PROFILE.__dict__, "stages": {**PROFILE.stages, "target_tree": W.Cost.line(12, 2)}})
    options = dict(gamma=3, tree=3, branching=2)
    assert W.step_ms(W.step_plans(trace_of("sd", [sd], options, two_lanes=True))[1], own) == \
        pytest.approx(2.1 + 2 * 2.2 + (12 + 2 * 4))
    rv = Rendezvous(exit_candidates=[[1, 2]] * 4, branches=[(0, 9, [1, 2])] * 2, branch_used=None, fallback=True,
                    copied=False, branch_parents=[[-1, 0]] * 2)
    mirror = Step(1, [3, 99], ["accepted", "correction"], proposed=tree.tokens, accepted=1, tree=tree, rendezvous=rv)
    window = 4  # the last committed token + 3 nodes
    rollouts = (2 + 0.1 * (window + 2)) + 2 * (2 + 0.1 * 2 * 2)  # layout, then 2 levels of 2 branches x 2 nodes
    prefix, suffix = 4 + 0.5 * window, 6 + 0.5 * window
    assert rollouts < suffix
    expected = (2.1 + 2 * 2.2) + prefix + 0.25 + suffix + 0.5  # the fallback tree, then the step
    assert step_time(trace_of("mirror", [mirror], dict(MIRROR, **options), two_lanes=True)) == pytest.approx(expected)
    assert rollouts == pytest.approx(W.phase_ms(W.step_plans(trace_of("mirror", [mirror], dict(MIRROR, **options),
                                                                       two_lanes=True))[1][3], PROFILE)[1])


def test_a_bucketed_profile_prices_a_call_at_the_bucket_the_engine_routes_it_to():
    """gpu-check's profiles are CUDA-graph replays per bucket: a window runs at the cheapest measured
    bucket that holds it (wider only if it saves more than 5%), not on a line between two buckets."""
    replays = {"1": 3.4, "2": 5.2, "4": 5.0, "8": 8.2, "16": 8.6, "32": 5.9, "64": 6.6}  # the H200's target
    data = dict(name="b", source="hand-made", buckets=True, stages={"target": {"ms_by_width": replays}})
    bucketed, lined = W.Profile.from_json(data), W.Profile.from_json(dict(data, buckets=False))
    assert bucketed.cost("target", 1) == 3.4 and bucketed.cost("target", 3) == 5.0  # 4 holds 3
    assert bucketed.cost("target", 9) == bucketed.cost("target", 16) == bucketed.cost("target", 32) == 5.9
    assert bucketed.cost("target", 5) == 5.9  # 8 holds it, 32 saves more than 5%
    assert bucketed.cost("target", 2) == 5.2  # 4 would save under 5% (5.0 against 5.2)
    assert lined.cost("target", 9) == pytest.approx(8.2 + 0.4 / 8) and bucketed.cost("target", 128) == pytest.approx(
        2 * 6.6)  # past the widest stage: a prefill runs as 64-row chunks
    assert W.Profile.from_json(bucketed.to_json()).buckets and "buckets" not in lined.to_json()
    with pytest.raises(MirrorSDError, match="buckets"):
        W.Profile.from_json(dict(data, buckets="yes"))


def test_overlap_zero_adds_the_two_sides_up():
    serial = W.Profile(**{**PROFILE.__dict__, "overlap": 0.0})
    rollouts = (2 + 0.1 * 7) + (2 + 0.1 * 4)
    trace = trace_of("mirror", [mirror_step()], MIRROR, two_lanes=True)
    assert step_time(trace, profile=serial) == pytest.approx(PREFIX + 0.25 + SUFFIX + rollouts + 0.5)


def test_a_retimed_trace_keeps_its_steps_and_tokens_and_only_moves_spans():
    steps = [mirror_step(), mirror_step(hit=False, fallback=True)]
    steps[1].index = 2
    trace = trace_of("mirror", steps, MIRROR, two_lanes=True)
    trace.spans = [Span("target, GPU role, cpu:0", "prefill", "prefill", 0.0, 1.0, 0, 10)]
    out = PROFILE.retime(trace)
    assert out.steps == trace.steps and out.method == "mirror" and out.meta["modelled"] is True
    assert out.meta["profile"] == "test" and not trace.meta.get("modelled")
    assert sorted(out.lanes.values()) == ["draft", "target"] and all("(modelled)" in label for label in out.lanes)
    kinds = [(s.step, s.kind) for s in out.spans]
    assert kinds[:2] == [(0, "prefill"), (0, "prefill")] and (2, "fallback-draft") in kinds
    assert (1, "draft-rollout") in kinds and (1, "target-suffix") in kinds
    for lane in out.lanes:  # one worker per lane: its spans never overlap
        spans = sorted((s.start, s.end) for s in out.spans if s.lane == lane)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
    prefill = max(20 + 0.5 * 10, 1 + 0.1 * 9)  # devices of their own: the two prefills side by side
    assert out.meta["modelled_s"] == pytest.approx((prefill + step_time(trace, 1) + step_time(trace, 2)) / 1000)
    on_one_cpu = replace(PROFILE, devices={"target": "cpu:0", "draft": "cpu:1"}).retime(trace)
    prefills = sorted((s.start, s.end) for s in on_one_cpu.spans if s.kind == "prefill")
    assert prefills[0][1] <= prefills[1][0]  # the CPU's two lanes: in turn
    assert on_one_cpu.meta["modelled_s"] == pytest.approx(out.meta["modelled_s"] + (1 + 0.1 * 9) / 1000)


def test_summary_speedup_is_against_vanilla_modelled_on_the_same_tokens():
    trace = trace_of("sd", [chain(1, [3, 4], 2, draft=DraftWork(forwards=2))], two_lanes=True)
    row = W.summary(trace, PROFILE)
    assert row["new_tokens"] == 4  # 1 from the prefill, 3 from the step
    assert row["vanilla_seconds"] == pytest.approx((25 + 3 * 11) / 1000)
    assert row["seconds"] == pytest.approx((25 + 2 * 2.1 + 13) / 1000)  # the draft's prefill beside the target's


# -- profiles ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", W.profile_names())
def test_shipped_profiles_load_with_a_source(name):
    profile = W.load_profile(name)
    assert profile.source and profile.devices
    for stage in ("target", "prefill", "target_prefix", "target_suffix", "draft", "eagle_head", "streams"):
        assert profile.cost(stage, 1) > 0 and profile.cost(stage, 64) >= profile.cost(stage, 1) * 0.9


def test_the_paper_profiles_are_the_measured_h100_figures():
    p = W.load_profile("paper-14b")
    assert p.cost("target", 1) == pytest.approx(11.764) and p.cost("target", 64) == pytest.approx(13.265)
    assert p.draft_speed == 0.5 and p.cost("draft", 1) == pytest.approx(1.565 / 0.5)
    assert p.with_draft_speed(1.0).cost("draft", 1) == pytest.approx(1.565)
    assert p.with_draft_ratio(0.25).draft_ratio() == pytest.approx(0.25)


def test_cost_is_piecewise_linear_through_its_points():
    cost = W.Cost(((1, 1.0), (2, 2.0), (10, 4.0)))
    assert cost(1) == 1.0 and cost(1.5) == 1.5 and cost(6) == 3.0 and cost(18) == 6.0  # straight on past the end


@pytest.mark.parametrize("change, message", [
    (dict(source=""), "'source'"),
    (dict(stages={"draft": {"ms": 1}}), "\"target\""),
    (dict(stages={"target": {"ms": -1}}), "stage 'target'"),
    (dict(stages={"target": {"ms_by_width": {"1": "fast"}}}), "stage 'target'"),
    (dict(stages={"target": {"ms": 1}, "gpu": {"ms": 1}}), "unknown stage 'gpu'"),
    (dict(overlap=2), "'overlap'"),
    (dict(draft_speed=0), "'draft_speed'"),
    (dict(split={"exit_layer": 30, "layers": 30}), "\"split\""),
    (dict(split=[22, 30]), "\"split\""),
])
def test_malformed_profiles_are_refused_with_what_is_wrong(tmp_path, change, message):
    data = {**W.load_profile("paper-14b").to_json(), **change}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MirrorSDError, match=message) as error:
        W.load_profile(path)
    assert "bad.json" in str(error.value)


def test_unreadable_and_unknown_profiles_are_refused(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(MirrorSDError, match="not readable JSON"):
        W.load_profile(path)
    with pytest.raises(MirrorSDError, match="unknown profile 'mars'.*paper-14b"):
        W.load_profile("mars")


def test_a_profile_round_trips_through_json():
    for profile in (PROFILE, replace(PROFILE, split=(22, 30))):
        again = W.Profile.from_json(json.loads(json.dumps(profile.to_json())))
        assert again.to_json() == profile.to_json() and again.split == profile.split


@pytest.mark.parametrize("exit_layer, layers", [(14, 30), (22, 30), (0, 30), (7, 15)])
def test_a_run_at_another_exit_depth_moves_layers_between_prefix_and_suffix(exit_layer, layers):
    """A profile measured with its exit at layer 22 of 30: a target layer costs what the full forward
    costs beyond the suffix, over 22 layers; a run exiting at another share of its layers (0: the
    default, 3/4 of the way up) moves that many layers' cost from the suffix to the prefix or back.
    Without a split, or without the run's layer count, the profile's own prefix and suffix stand."""
    split = replace(PROFILE, split=(22, 30))
    meta = dict(options=dict(MIRROR, exit_layer=exit_layer), target_layers=layers, temperature=0.0)
    trace = trace_of("mirror", [mirror_step()], MIRROR, two_lanes=True)
    trace.meta.update(meta)
    depth = (exit_layer or layers * 3 // 4) / layers
    assert W.exit_depth(trace.meta) == pytest.approx(depth)
    per_layer = ((10 + 3) - SUFFIX) / 22  # window of 3
    moved = (depth * 30 - 22) * per_layer
    plan = W.step_plans(trace)[1]
    works = {w.kind: w for phase in plan for w in phase}
    assert works["target-prefix"].ms(split) == pytest.approx(PREFIX + moved)
    assert works["target-suffix"].ms(split) == pytest.approx(SUFFIX - moved)
    assert works["target-prefix"].ms(PROFILE) == pytest.approx(PREFIX)  # no split: the profile's own
    trace.meta.pop("target_layers")
    assert W.exit_depth(trace.meta) is None
    assert W.step_ms(W.step_plans(trace)[1], split) == pytest.approx(W.step_ms(W.step_plans(trace)[1], PROFILE))


def test_a_fitted_profile_knows_the_exit_its_mirror_runs_were_measured_at():
    def run(method, exit_layer):
        trace = trace_of(method, [mirror_step()] if method == "mirror" else [Step(1, [5], ["target"])], MIRROR,
                         two_lanes=True)
        trace.meta.update(target_layers=30, options=dict(MIRROR, exit_layer=exit_layer))
        return trace
    assert W.measured_split([run("mirror", 0), run("mirror", 22), run("vanilla", 14)]) == (22, 30)
    assert W.measured_split([run("mirror", 14), run("mirror", 22)]) is None  # two exits: no one split
    assert W.measured_split([run("vanilla", 0)]) is None


# -- the fit -------------------------------------------------------------------------------------
def sd_trace(windows, prompt_tokens):
    steps = [chain(i, list(range(g)), a, draft=DraftWork(forwards=g)) for i, (g, a) in enumerate(windows, start=1)]
    return trace_of("sd", steps, two_lanes=True, prompt_tokens=prompt_tokens)


def test_the_fit_recovers_the_costs_that_made_the_spans():
    known = W.Profile(**{**PROFILE.__dict__, "step_ms": 0.75, "phase_ms": 0.3})
    made = [sd_trace([(2, 1), (4, 4), (3, 0)], 12), sd_trace([(1, 0), (5, 2)], 30),
            trace_of("vanilla", [Step(i, [5], ["target"]) for i in range(1, 4)], prompt_tokens=20)]
    measured = [known_retimed(t, known) for t in made]
    fitted = W.fit_profile(measured)
    seen = dict(target=(1, 7, 40), prefill=(1, 7, 40), draft_prefill=(1, 7, 40), draft=(1,))  # sd drafts at width 1
    for stage, widths in seen.items():
        for width in widths:
            assert fitted.cost(stage, width) == pytest.approx(known.cost(stage, width), abs=1e-6)
    assert fitted.step_ms == pytest.approx(0.75) and fitted.phase_ms == pytest.approx(0.3)  # vanilla: 1 phase, sd: 2
    for t in made:
        assert W.modelled_seconds(t, fitted) == pytest.approx(W.modelled_seconds(t, known))


def test_the_host_fit_never_goes_negative():
    made = [sd_trace([(2, 1), (4, 4), (3, 0)], 12), sd_trace([(1, 0), (5, 2)], 30),
            trace_of("vanilla", [Step(i, [5], ["target"]) for i in range(1, 4)], prompt_tokens=20)]
    bare = W.Profile(**{**PROFILE.__dict__, "step_ms": 0.0, "phase_ms": 0.0})
    per_phase_only = W.Profile(**{**PROFILE.__dict__, "phase_ms": 0.5})
    assert W.fit_host([known_retimed(t, per_phase_only) for t in made], bare) == pytest.approx((0.0, 0.5))
    assert W.fit_host([known_retimed(t, bare) for t in made], bare) == pytest.approx((0.0, 0.0))
    # runs shorter than the profile makes their spans (it over-prices them): no host time, not a negative one
    dearer = W.Profile(**{**PROFILE.__dict__, "stages": {s: c.scaled(2) for s, c in PROFILE.stages.items()}})
    assert W.fit_host([known_retimed(t, bare) for t in made], dearer) == (0.0, 0.0)


def known_retimed(trace, profile):
    out = W.retime(trace, profile)
    out.meta.pop("modelled")
    return out


def test_the_held_out_check_predicts_runs_made_by_the_same_costs():
    runs = []
    for i, windows in enumerate([[(2, 1), (4, 4)], [(3, 0), (1, 1), (2, 2)], [(5, 2)], [(2, 0), (2, 2)]]):
        for method, trace in (("vanilla", trace_of("vanilla", [Step(j, [5], ["target"]) for j in range(1, 5)],
                                                   prompt_tokens=10 + i)),
                              ("sd", sd_trace(windows, 10 + i))):
            measured = known_retimed(trace, PROFILE)
            runs.append(dict(method=method, id=str(i), category="qa", traces=[measured],
                             new_tokens=sum(len(s.committed) for s in trace.steps),
                             wall_s=W.measured_seconds(measured)))
    profile, table = W.held_out_check(runs)
    assert list(table.method) == ["vanilla", "sd"] and table.error.abs().max() < 1e-9


# -- the command line ----------------------------------------------------------------------------
def test_cli_whatif_prints_modelled_step_time_tokens_per_s_and_speedup(tmp_path, capsys):
    for trace in (trace_of("vanilla", [Step(1, [5], ["target"])]),
                  sd_trace([(2, 1), (2, 2)], 10)):
        (tmp_path / f"{trace.method}.json").write_text(trace.to_json())
    assert main(["whatif", "--trace", str(tmp_path), "--profile", "paper-14b"]) == 0
    out = capsys.readouterr().out
    assert "MODELLED" in out and "step ms" in out and "tokens/s" in out and "speedup vs vanilla" in out
    assert "| sd " in out and "| vanilla " in out


def test_cli_whatif_refuses_bad_input_with_one_error_line(tmp_path, capsys):
    good = tmp_path / "sd.json"
    good.write_text(sd_trace([(2, 1)], 10).to_json())
    chrome = tmp_path / "chrome.json"
    chrome.write_text(json.dumps({"traceEvents": []}))
    for argv, message in ((["--trace", str(tmp_path / "none.json"), "--profile", "paper-14b"], "does not exist"),
                          (["--trace", str(good), "--profile", "mars"], "unknown profile"),
                          (["--trace", str(chrome), "--profile", "paper-14b"], "Chrome trace"),
                          (["--trace", str(good), "--profile", "paper-14b", "--draft-speed", "0"], "draft speed")):
        assert main(["whatif", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and message in err[0]


# -- steady state and the tradeoff curve -----------------------------------------------------------
def test_tokens_per_step_is_the_geometric_sum():
    assert W.tokens_per_step(0.5, 2) == pytest.approx(1.75) and W.tokens_per_step(1.0, 3) == 4


def test_steady_state_mirror_exposes_a_fresh_draft_at_the_miss_rate():
    steps = [mirror_step(), mirror_step(hit=False), mirror_step(fallback=True)]  # a miss, then its fresh draft
    trace = trace_of("mirror", steps, MIRROR, two_lanes=True)
    hit_step = PREFIX + 0.25 + SUFFIX + 0.5
    fresh = 2 * 2.1
    own = W.steady_state(trace, PROFILE)
    assert own["step_ms"] == pytest.approx(hit_step + (1 / 3) * fresh)  # one miss in three steps
    assert own["tokens_per_step"] == pytest.approx(2) and own["speedup"] == pytest.approx(2 * 11 / own["step_ms"])
    always = W.steady_state(trace, PROFILE, alpha=1.0, hit_rate=1.0)
    assert always["step_ms"] == pytest.approx(hit_step) and always["tokens_per_step"] == 3


def test_a_miss_s_fresh_draft_with_tree_windows_is_the_draft_s_tree_levels():
    chains = trace_of("mirror", [mirror_step()], dict(MIRROR, gamma=3), two_lanes=True)
    trees = trace_of("mirror", [mirror_step()], dict(MIRROR, gamma=3, tree=8, branching=2), two_lanes=True)
    assert W.fallback_ms(chains, PROFILE) == pytest.approx(3 * 2.1)
    assert W.fallback_ms(trees, PROFILE) == pytest.approx(2.1 + 2 * 2.2)  # the root's forward, 2 levels of 2 nodes


def test_the_what_if_tab_agrees_with_itself_on_a_recorded_race():
    """On a recorded race, the tab's views say one thing: the draft-capacity chart's points are the
    trade-off run's numbers (measured and, dashed, MODELLED on the chosen profile) and its sentence
    names the same leaders; the source line names one draft speed, the one in force; with "use this
    run's acceptance" ticked the sliders are hidden, and the run's own α and hit rate are printed,
    the ones the steady-state column uses."""
    from app import capacity
    from app import whatif as view
    from app.replay import load_race, recorded_races

    _, path = recorded_races()[0]
    _, _, current = load_race(path)
    measured, modelled, _ = capacity.load()
    for name, profile in (("paper-14b", "paper-14b"), (view.FITTED, capacity.THIS_MACHINE)):
        source, shown, why, _, _, curve, text, *_ = view.render(current, name, 2.0, True, 0.6, 0.2)
        lines = {t.name: t for t in curve.data}

        def points(name):  # the family's line and the shipped draft's star: (cost, speedup), by cost
            drawn = [t for n, t in lines.items() if n == name or n == f"{name}: the shipped distilled draft"]
            return sorted((round(x, 6), round(y, 6)) for t in drawn for x, y in zip(t.x, t.y))

        def expected(table, column):
            return sorted((round(x, 6), round(y, 6)) for x, y in zip(table.cost, table[column]))

        rows = capacity.modelled_on(modelled, profile)
        assert points("Mirror-SD, measured") == expected(measured, "mirror_speedup")
        assert points("Speculative decoding, measured") == expected(measured, "sd_speedup")
        assert points(f"Mirror-SD, MODELLED on {profile}") == expected(rows, "mirror_speedup")
        assert list(lines["Mirror-SD, measured"].x) == sorted(lines["Mirror-SD, measured"].x)  # a curve
        assert lines[f"EAGLE, MODELLED on {profile}"].y[0] == pytest.approx(rows.eagle_speedup.iloc[0])
        best = rows.loc[rows.mirror_speedup.idxmax()]
        assert f"Mirror-SD at {best.mirror_speedup:.2f}x with {best.draft}" in text
        if name != view.FITTED:  # the chosen draft speed, and no other, is named
            assert "runs at 2× the speed" in source and "half the GPU" not in source
        assert "This run's own acceptance and hit rate" in why
        table = shown["value"]
        steady = table.set_index("method")["MODELLED in the long run (controls)"]
        for r in view.race_runs(current).values():  # the column is the run's own steady state
            p = view.profile_for(name, current)
            p = p.with_draft_speed(2.0) if name != view.FITTED else p
            assert steady[r.title].startswith(f"{W.steady_state(r.trace, p)['speedup']:.2f}×")
    import gradio as gr

    with gr.Blocks():
        ui = view.whatif_tab()
    assert ui.own.value is True and ui.alpha.visible is False and ui.hit.visible is False  # ticked: no other values


def test_the_tradeoff_curve_falls_for_sd_and_stays_flat_for_mirror_while_rollouts_fit():
    sd = sd_trace([(2, 2)] * 3, 10)
    mirror = trace_of("mirror", [mirror_step(accepted=2)] * 3, MIRROR, two_lanes=True)
    profile = W.Profile(**{**PROFILE.__dict__, "channel_ms": 0.0, "stages": {**PROFILE.stages,
                                                                            "draft": W.Cost.line(2, 0.0)}})
    curves = W.tradeoff([sd, mirror], profile, [0.0, 0.1, 0.2])
    assert curves["sd"][0] > curves["sd"][1] > curves["sd"][2]
    assert curves["mirror"][0] == pytest.approx(curves["mirror"][1])  # 2 forwards of 1.1 ms < the 7.5 ms suffix


# -- the app's What if view ------------------------------------------------------------------------
def test_the_app_view_draws_every_method_modelled_under_the_banner():
    from app import whatif as view
    from app.race import Result

    runs = {"vanilla": trace_of("vanilla", [Step(1, [5], ["target"]), Step(2, [6], ["target"])]),
            "sd": sd_trace([(2, 1), (2, 2)], 10),
            "mirror": trace_of("mirror", [mirror_step(), mirror_step(hit=False)], MIRROR, two_lanes=True)}
    current = {}
    for method, trace in runs.items():
        measured = known_retimed(trace, PROFILE)
        tokens = sum(len(s.committed) for s in trace.steps)
        current[method] = Result(method, measured, metrics=dict(tokens_per_s=tokens / W.measured_seconds(measured),
                                                                mean_accepted=1.5), finished="length")
    assert "MODELLED from this run's steps, not measured" in view.BANNER
    for name in ("paper-14b", view.FITTED):
        source, shown, why, timeline, utilisation, curve, capacity, *_ = view.render(current, name, 0.5, True, 0.6, 0.2)
        table = shown["value"]
        assert shown["visible"]
        assert "the larger of the target suffix" in why
        assert len(table) == 3 and table.columns.str.contains("MODELLED").any()
        assert {t.name for t in timeline.data} and all("(MODELLED)" in a.text for a in timeline.layout.annotations)
        assert {"Speculative decoding, measured", "Mirror-SD, measured"} <= {t.name for t in curve.data}
        assert "Measured: RECORDED on " in capacity and "MODELLED on" in capacity
    assert "—" not in set(table["measured in the race"])
    empty = view.render({}, "paper-14b", 0.5, True, 0.6, 0.2)
    assert "Run a race, or open a recorded one, first" in empty[0] and empty[1]["visible"] is False
    assert empty[5] is not None  # the trade-off run's chart needs no race


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM) and not shutil.which("chromium"),
                    reason="Chromium is not installed here (CI installs Debian's chromium: see .ci/run)")
def test_browser_opens_the_what_if_view_with_the_banner_and_a_modelled_timeline_per_method(tiny_pair):
    from playwright.sync_api import expect, sync_playwright

    from app.ui import build_demo

    demo = build_demo(pair_factory=lambda **devices: tiny_pair)
    _, url, _ = demo.queue(max_size=8).launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True,
                                              quiet=True)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(headless=True, args=["--no-sandbox", "--disable-gpu"],
                                        executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"))
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.get_by_label("Prompt").fill("t1 t2 t3")
            page.locator("#run").click()
            expect(page.locator("#card-mirror .card")).to_have_attribute("data-state", "length", timeout=60_000)
            page.get_by_role("tab", name="What if").click()
            expect(page.locator("#whatif-banner")).to_contain_text("MODELLED from this run's steps, not measured")
            timeline = page.locator("#whatif-timeline")
            expect(timeline.locator(".js-plotly-plot")).to_be_visible(timeout=30_000)
            for title in ("Vanilla", "Speculative decoding", "Mirror-SD"):  # the methods the tiny pair runs
                expect(timeline).to_contain_text(f"{title} (MODELLED)")
            expect(page.locator("#whatif-table")).to_contain_text("MODELLED on paper-14b")
            expect(page.locator("#whatif-curve .js-plotly-plot")).to_be_visible()
            expect(page.locator("#whatif-curve")).to_contain_text("Draft capacity")
            expect(page.locator("#whatif-capacity")).to_contain_text("Measured: RECORDED on ")
            expect(page.locator("#whatif-reported")).to_contain_text("Mirror-SD")
            expect(page.get_by_text("REPORTED by the paper").first).to_be_visible()
            browser.close()
    finally:
        demo.close()


def test_the_hit_rate_mirror_needs_to_lead_is_the_first_where_its_speedup_reaches_the_other():
    mirror = trace_of("mirror", [mirror_step(hit=False), mirror_step(fallback=True)], MIRROR, two_lanes=True)
    sd = sd_trace([(2, 1), (2, 1)], 10)
    lead = W.hit_rate_to_lead(mirror, sd, PROFILE)
    assert lead is not None and W.steady_state(mirror, PROFILE, None, lead)["speedup"] >= \
        W.steady_state(sd, PROFILE)["speedup"] > W.steady_state(mirror, PROFILE, None, lead - 0.01)["speedup"]


def test_a_stage_keyed_by_cpu_threads_prices_the_lanes_that_ran_with_that_many():
    profile = W.Profile(**{**PROFILE.__dict__, "stages": {**PROFILE.stages, "draft@1": W.Cost.line(5, 0)}})
    trace = trace_of("sd", [chain(1, [3, 4], 1, draft=DraftWork(forwards=2))], two_lanes=True)
    assert step_time(trace, profile=profile) == pytest.approx(2 * 2.1 + 13)  # no thread count recorded
    trace.meta["threads"] = {"target": 1, "draft": 1}
    assert step_time(trace, profile=profile) == pytest.approx(2 * 5 + 13)
    made = [W.retime(trace_of("sd", [chain(1, [3, 4], 1, draft=DraftWork(forwards=2))], two_lanes=True,
                              prompt_tokens=n), PROFILE) for n in (10, 20)]
    for t, threads in zip(made, (1, 2)):
        t.meta["threads"] = {"target": 2, "draft": threads}
    assert {"draft@1", "draft@2"} <= set(W.fit_profile(made).stages)  # one stage on 1 and on 2 threads: kept apart


def test_without_a_thread_count_a_keyed_stage_uses_its_most_threads():
    profile = W.Profile("keyed", "test", {}, {"target@1": W.Cost.line(9, 0), "target@2": W.Cost.line(4, 0)})
    assert profile.cost("target", 1) == 4 and profile.cost("target", 1, threads=1) == 9
    assert profile.cost("target", 1, threads=3) == 4


# -- what the replays leave out: a prefill's chunks, the context, EAGLE's eager pairs ---------------
H200_TARGET = {"1": 3.4, "2": 5.2, "4": 5.0, "8": 8.2, "16": 8.6, "32": 5.9, "64": 6.6}  # replays per bucket


def test_a_prefill_past_the_widest_stage_is_priced_as_its_64_row_chunks():
    """The engine runs a prompt of more than 64 tokens as 64-row chunks and a last one of the rest
    (models/forwards.py), each at the bucket it is routed to."""
    bucketed = W.Profile.from_json(dict(name="b", source="hand-made", buckets=True,
                                        stages={"target": {"ms_by_width": H200_TARGET}}))
    assert bucketed.cost("prefill", 64) == 6.6 and bucketed.cost("prefill", 65) == pytest.approx(6.6 + 3.4)
    assert bucketed.cost("prefill", 150) == pytest.approx(2 * 6.6 + 5.9)  # 22 rows left: the 32 bucket, cheaper
    trace = trace_of("vanilla", [Step(1, [5], ["target"])], prompt_tokens=150)
    assert W.step_ms(W.step_plans(trace)[0], bucketed, host=False) == pytest.approx(2 * 6.6 + 5.9)
    no_widest = W.Profile.from_json(dict(name="b", source="hand-made", buckets=True,
                                         stages={"target": {"ms_by_width": {"1": 1.0, "32": 2.0}}}))
    assert no_widest.cost("prefill", 150) == pytest.approx(1 + 149 / 31)  # no 64 replay: the line


def test_context_adds_its_cost_per_call_and_vanilla_s_steady_state_pays_it_at_the_same_context():
    """A replay prices a call at an empty cache; each call adds ``context_ms`` per 100 slots it attends
    before its window: the prompt and the tokens committed before its step, but the window's first."""
    context = replace(PROFILE, context_ms={"target": 2.0, "draft": 1.0})
    trace = sd_trace([(2, 1), (2, 2)], 100)  # step 1 commits 2 tokens
    assert W.step_contexts(trace) == [0, 100, 102]
    for index, slots in ((1, 100), (2, 102)):  # two draft forwards and one verify, each at the step's context
        added = step_time(trace, index, context) - step_time(trace, index)
        assert added == pytest.approx((2 * 1.0 + 2.0) * slots / 100)
    assert step_time(trace_of("vanilla", [Step(1, [5], ["target"])], prompt_tokens=100), profile=context) == \
        pytest.approx(11 + 2.0)
    assert context.with_draft_speed(2.0).cost("draft", 1, context=100) == pytest.approx((2.1 + 1.0) / 2)

    steady, bare = W.steady_state(trace, context), W.steady_state(trace, PROFILE)
    assert bare["vanilla_ms"] == pytest.approx(11)
    assert steady["vanilla_ms"] == pytest.approx(11 + 2.0 * 101 / 100)  # the mean context of the run's steps
    assert steady["speedup"] == pytest.approx(steady["tokens_per_step"] * steady["vanilla_ms"] / steady["step_ms"])
    assert W.pooled_steady_state([trace], context)["speedup"] == pytest.approx(steady["speedup"])

    vanilla = trace_of("vanilla", [Step(i, [5], ["target"]) for i in range(1, 4)], prompt_tokens=20)
    assert W.modelled_seconds(vanilla, context) == pytest.approx(W.vanilla_seconds(20, 4, context))
    assert W.vanilla_seconds(20, 4, context) - W.vanilla_seconds(20, 4, PROFILE) == pytest.approx(
        2.0 * (20 + 21 + 22) / 100 / 1000)
    no_prompt = sd_trace([(2, 1), (2, 2)], None)  # the prompt's length not recorded: only the answer's tokens
    assert W.step_contexts(no_prompt) == [0, 0, 2]


def test_eagle_s_first_draft_on_stages_runs_the_pairs_past_64_through_the_head_eagerly():
    tree = DraftTree(tokens=[1, 2], parents=[-1, 0], depths=[1, 2], scores=[0.0] * 2, path=[0, 1])
    trace = trace_of("eagle", [Step(1, [1, 2, 3], ["accepted", "accepted", "bonus"], proposed=[1, 2], accepted=2,
                                    tree=tree)], dict(depth=3, top_k=4), prompt_tokens=100)
    eager = replace(PROFILE, stages={**PROFILE.stages, "eagle_head_eager": W.Cost.line(5, 0.1)})
    levels, verify = 2 * (1 + 2), 10 + 3

    def draft_ms(profile):
        return W.step_plans(trace)[1][0][0].ms(profile)

    assert draft_ms(eager) == pytest.approx((1 + 50) + levels)  # no graphs: the head over all 100 pairs
    trace.meta["graphs"] = "on"
    assert W.step_plans(trace)[1][0][0].calls[:2] == [("eagle_head_eager", 36), ("eagle_head", 64)]
    assert draft_ms(eager) == pytest.approx((5 + 3.6) + (1 + 32) + levels)
    assert step_time(trace, 1, eager) == pytest.approx((5 + 3.6) + (1 + 32) + levels + verify)
    assert draft_ms(PROFILE) == pytest.approx((1 + 18) + (1 + 32) + levels)  # no eager cost: the head's stand-in
    trace.meta["temperature"] = 0.7  # a sampled draft runs eagerly, off the stage: the head over every pair
    assert draft_ms(eager) == pytest.approx((1 + 50) + 2 * (1 + 0.5))
    bucketed = W.Profile.from_json(dict(name="b", source="hand-made", buckets=True, stages={
        "target": {"ms_by_width": H200_TARGET}, "eagle_head_eager": {"ms_by_width": {"2": 0.5, "78": 2.1}}}))
    assert bucketed.cost("eagle_head_eager", 40) == pytest.approx(0.5 + 38 * 1.6 / 76)  # eager: its line, no bucket


@pytest.mark.parametrize("context_ms", [[0.2], {"gpu": 0.2}, {"target": -0.1}, {"target": "slow"},
                                        {"target@4": 0.2}, {"target": True}])
def test_a_malformed_context_cost_is_refused(tmp_path, context_ms):
    data = {**W.load_profile("h200-embedded").to_json(), "context_ms": context_ms}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MirrorSDError, match="context_ms") as error:
        W.load_profile(path)
    assert "bad.json" in str(error.value)
    good = W.load_profile("h200-embedded")
    assert good.context_ms["target"] > 0 and W.Profile.from_json(good.to_json()).to_json() == good.to_json()
