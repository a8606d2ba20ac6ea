"""The executor seam (mirror_sd/executors.py): a Mirror-SD step is one algorithm (methods/mirror.py), and
both ways of running it yield step for step the same windows, candidates, branches and committed
tokens: its phases on the lanes' threads (``ModelPair.queue_steps`` "off") and queued in turn ("on":
on a GPU, on its streams), on the plain forwards and on fixed-shape stages (``graphs="on"``), on the
tiny random pairs and on the shipped pair.

Stages against plain forwards: vanilla's tokens both, but not always the same steps. A stage runs
padded shapes (its attention over every slot of its cache, masked), which may settle a near tie in
the tiny random draft the other way. A queued step on stages rolls out its correction
(tests/test_rollout.py): the window after a miss is then that rollout's, the same tokens as the
fallback draft's the lanes' threads make there."""
import threading
import time
from dataclasses import replace

import pytest

from mirror_sd import generate, load_pair
from mirror_sd.devices import allot_cpu_threads, make_lanes
from mirror_sd.executors import Phase, Streams, Threads, work
from mirror_sd.trace import SpanKind, Trace

RUNS = ["off", "on"]  # ModelPair.queue_steps: the lanes' threads, the phases queued in turn


def steps_of(out):
    """What a run decided at each step: window, accepted count, committed tokens, rendezvous record (a
    window drafted after a miss, afresh or by the correction rollout, alike)."""
    return [(s.proposed, s.accepted, s.committed, replace(s.rendezvous, fallback=s.rendezvous.fallback
             or s.rendezvous.corrected, corrected=False), s.tree) for s in out.trace.steps[1:]]


@pytest.mark.parametrize("options", [dict(gamma=3, kappa=2, branch_budget=3, lookup=0),
                                     dict(gamma=2, kappa=3, branch_budget=5, lookup=8),
                                     dict(gamma=3, kappa=3, exit_layer=1, tree=6)])
def test_every_executor_on_plain_forwards_and_on_stages_takes_the_same_steps(tiny_dirs, options):
    prompt = "t1 t2 t3"
    plain = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]))
    staged = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]), graphs="on")
    expected = generate(plain, prompt, method="vanilla", max_new_tokens=32, raw=True).token_ids
    runs = {}
    for name, pair in (("plain", plain), ("stages", staged)):
        for queued in RUNS:
            pair.queue_steps = queued
            out = generate(pair, prompt, method="mirror", max_new_tokens=32, raw=True, **options)
            assert out.error is None and out.token_ids == expected, (name, queued)
            runs[name, queued] = steps_of(out)
    for forwards in ("plain", "stages"):
        reference = runs[forwards, "on"]  # the phases in turn, each to its end
        assert runs[forwards, "off"] == reference, f"the lanes' threads step apart from the reference on {forwards}"
        assert any(r.hit for _, _, _, r, _ in reference) and any(not r.hit for _, _, _, r, _ in reference)


def test_the_shipped_pair_takes_the_same_steps_on_either_executor(embedded_pair, monkeypatch):
    prompt = "Write a short poem about the sea."
    runs = []
    for queued in RUNS:
        monkeypatch.setattr(embedded_pair, "queue_steps", queued)
        runs.append(steps_of(generate(embedded_pair, prompt, method="mirror", max_new_tokens=24)))
    assert runs[0] == runs[1] and any(r.hit for _, _, _, r, _ in runs[0])


def lanes_for_test():
    target, draft = make_lanes("cpu", "cpu")
    allot_cpu_threads([target, draft], parallel=True)  # a worker each, as for Mirror-SD
    trace = Trace("test")
    return target.recording(trace), draft.recording(trace), trace


def test_threads_overlap_the_lanes_and_hand_a_phase_its_dependencies_values():
    """Threads: two phases of different lanes run at the same time; a phase given another lane's phase
    gets its value once it is done; one given a phase of its own lane gets it too (done before it)."""
    target, draft, trace = lanes_for_test()
    ex = Threads()
    started = {}

    def work(name, value, seconds=0.05):
        started[name] = (time.perf_counter(), threading.get_ident())
        time.sleep(seconds)
        return value

    a = ex.start(target, SpanKind.TARGET_PREFIX, work, "a", 1)
    b = ex.start(draft, SpanKind.DRAFT_ROLLOUT, work, "b", 2)  # independent: overlaps a
    c = ex.start(draft, SpanKind.CORRECTION_ROLLOUT, lambda x, y: x + y, a, b)  # waits for a (other lane), b (its own)
    d = ex.start(target, SpanKind.TARGET_SUFFIX, lambda x: 10 * x, a)
    ex.finish(a, b, c, d)
    assert (c.result(), d.result()) == (3, 10)
    assert abs(started["a"][0] - started["b"][0]) < 0.04 and started["a"][1] != started["b"][1]
    assert len(trace.spans) == 4 and all(isinstance(s.kind, SpanKind) for s in trace.spans)


def test_streams_run_phases_in_turn_on_cpu_lanes_and_record_each_span_once():
    target, draft, trace = lanes_for_test()
    ex = Streams()
    order = []
    a = ex.start(target, SpanKind.TARGET_PREFIX, lambda: order.append("a") or 1)
    b = ex.start(draft, SpanKind.DRAFT_ROLLOUT, lambda x: order.append("b") or x + 1, a)
    assert order == ["a", "b"] and isinstance(b, Phase) and not trace.spans  # recorded when waited for
    ex.finish(a, b)
    assert b.result() == 2 and [s.kind for s in trace.spans] == [SpanKind.TARGET_PREFIX, SpanKind.DRAFT_ROLLOUT]


def test_a_phase_no_other_lane_works_beside_takes_every_core_and_overlapping_phases_their_share():
    """Threads decides the cores: a phase started while the host has read every phase of the other lane
    runs alone (every core the lanes share); one started while the other lane's phase is unread, or
    with ``overlap``, runs on its lane's share."""
    import torch

    target, draft, _ = lanes_for_test()
    ex = Threads()
    alone = ex.start(target, SpanKind.TARGET_PREFIX, torch.get_num_threads)
    assert alone.result() == target.lane.alone_threads
    slow = ex.start(draft, SpanKind.DRAFT_ROLLOUT, time.sleep, 0.05)
    assert ex.start(target, SpanKind.RENDEZVOUS, torch.get_num_threads).result() == target.lane.threads  # beside slow
    slow.result()
    assert ex.start(target, SpanKind.RENDEZVOUS, torch.get_num_threads).result() == target.lane.alone_threads
    main, beside = ex.overlap(work(target, SpanKind.TARGET_SUFFIX, lambda each_layer: torch.get_num_threads()),
                              work(draft, SpanKind.DRAFT_ROLLOUT, torch.get_num_threads))
    assert (main.result(), beside.result()) == (target.lane.threads, draft.lane.threads)


def test_overlap_widens_the_first_phase_once_the_other_is_done():
    """``overlap(main, beside)``: main's fn gets ``each_layer``; called before beside is done it leaves
    the cores as they are, after it the lane takes every core it may use alone. Streams queue both in
    turn and hand main no ``each_layer`` (queued work has no threads to widen)."""
    target, draft, _ = lanes_for_test()
    calls = []
    target.lane.widen_when_done = lambda beside: calls.append(beside.done())

    def main(each_layer):
        each_layer()  # the rollouts still run
        time.sleep(0.1)
        each_layer()  # done by now
        return "main"

    first, second = Threads().overlap(work(target, SpanKind.TARGET_SUFFIX, main),
                                      work(draft, SpanKind.DRAFT_ROLLOUT, time.sleep, 0.02))
    assert first.result() == "main" and second.result() is None and calls == [False, True]
    order = []
    first, second = Streams().overlap(work(target, SpanKind.TARGET_SUFFIX, lambda: order.append("main") or 1),
                                      work(draft, SpanKind.DRAFT_ROLLOUT, lambda x: order.append("beside") or x + 1,
                                           1))
    assert order == ["main", "beside"] and second.result() == 2


def test_only_a_queued_executor_runs_work_aside():
    target, draft, _ = lanes_for_test()
    assert Threads().aside(work(draft, SpanKind.CORRECTION_ROLLOUT, lambda: 1)) is None
    assert Streams().aside(work(draft, SpanKind.CORRECTION_ROLLOUT, lambda: 1)).result() == 1


def test_a_span_kind_is_one_of_the_shared_names_and_survives_json():
    """Span kinds are one enum (trace.SpanKind) for the methods, the trace, the what-if model and the
    app: a trace refuses any other name, and one read back from JSON holds the same members."""
    target, _, trace = lanes_for_test()
    target.run(SpanKind.VERIFY, lambda: None)
    with pytest.raises(Exception, match="not a valid SpanKind"):
        target.run("verify-ish", lambda: None)
    again = Trace.from_json(trace.to_json())
    assert [s.kind for s in again.spans] == [SpanKind.VERIFY] and again.spans[0].kind is SpanKind.VERIFY
