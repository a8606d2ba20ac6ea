"""Lanes run work at the same time and record real spans; traces export faithfully."""
import json
import os
import select
import threading
import time

import pytest
import torch

from mirror_sd import MirrorSDError, Trace, generate
from mirror_sd.devices import Lane, allot_cpu_threads, cpu_cores, on_cpu_worker, resolve_device


def _matmuls(n=60):
    x = torch.randn(256, 256)
    for _ in range(n):
        x = torch.tanh(x @ x)
    return float(x.sum())


def test_two_lanes_overlap_in_time():
    trace = Trace("test")
    lanes = [Lane("target", torch.device("cpu"), "cpu:0"), Lane("draft", torch.device("cpu"), "cpu:1")]
    allot_cpu_threads(lanes, parallel=True)
    futures = [lane.submit("decode", _matmuls, label="matmuls", step=1, trace=trace) for lane in lanes]
    [f.result() for f in futures]
    a, b = trace.spans
    assert a.lane != b.lane
    assert a.duration > 0 and b.duration > 0
    overlap = min(a.end, b.end) - max(a.start, b.start)
    assert overlap > 0.5 * min(a.duration, b.duration), "work on two lanes should run at the same time"


def _int8_copies(module) -> set[str]:
    return {name for name, p in module.named_parameters() if hasattr(p, "_int8_packed")}


@pytest.mark.parametrize("int8", [True, False])
def test_drafting_alone_multiplies_by_int8_weights(tiny_dirs, int8):
    """With int8 drafting (the default) the draft's weights get int8 copies as it drafts, but for
    its MLP down projections, and the target's never do (the draft lane runs only the draft model;
    the target lane verifies in fp32); with it off, nothing is quantised. Either way sd commits
    vanilla's tokens."""
    from mirror_sd import load_pair
    from mirror_sd.models.linear import INT8

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), int8_drafting=int8)
    assert pair.int8_drafting == (int8 and INT8) and pair.describe()["int8_drafting"] == pair.int8_drafting
    reference = generate(pair, "a b c", method="vanilla", max_new_tokens=12, raw=True).token_ids
    assert generate(pair, "a b c", method="sd", max_new_tokens=12, raw=True).token_ids == reference
    assert generate(pair, "a b c", method="mirror", max_new_tokens=12, raw=True).token_ids == reference
    assert not _int8_copies(pair.target)
    drafted = _int8_copies(pair.draft)
    if int8 and INT8:  # every product but the MLP down projections (models/linear.py says why)
        assert "lm_head.weight" in drafted and "model.layers.0.mlp.up_proj.weight" in drafted
        assert not any("down_proj" in name for name in drafted)
    else:
        assert not drafted


def test_a_cpu_lane_takes_the_shared_cores_once_the_work_beside_it_is_done():
    """Mirror-SD's suffix widens to every core once the rollouts end (Lane.widen_when_done)."""
    from concurrent.futures import Future

    lanes = [Lane("target", torch.device("cpu"), "cpu:0"), Lane("draft", torch.device("cpu"), "cpu:1")]
    allot_cpu_threads(lanes, parallel=True)
    target = lanes[0]
    beside = Future()

    def threads_after_widening():
        target.widen_when_done(beside)
        return torch.get_num_threads()

    assert target.submit("work", threads_after_widening).result() == target.threads  # still running beside it
    beside.set_result(None)
    assert target.submit("work", threads_after_widening).result() == target.alone_threads  # done: all cores
    assert target.submit("work", torch.get_num_threads).result() == target.threads  # the next work: its share


def test_cpu_lanes_share_a_worker_unless_they_work_at_the_same_time():
    """Every OS thread that runs torch's multi-threaded kernels keeps an OpenMP pool, and two pools of
    all the cores slow each other down (devices.py): serial CPU lanes share one thread."""
    lanes = [Lane("target", torch.device("cpu"), "cpu:0"), Lane("draft", torch.device("cpu"), "cpu:1")]
    allot_cpu_threads(lanes, parallel=False)
    serial = [lane.run("where", threading.get_ident) for lane in lanes]
    assert serial[0] == serial[1] != threading.get_ident()
    assert on_cpu_worker(threading.get_ident) == serial[0]  # model loading runs there too
    allot_cpu_threads(lanes, parallel=True)
    parallel = [lane.run("where", threading.get_ident) for lane in lanes]
    assert parallel[0] != parallel[1]
    assert lanes[0].threads == lanes[1].threads == max(1, cpu_cores() // 2)
    # work one lane runs while the other waits may use every core, on worker 0 only
    assert lanes[0].run("alone", torch.get_num_threads, alone=True) == cpu_cores()
    assert lanes[1].run("alone", torch.get_num_threads, alone=True) == lanes[1].threads
    assert lanes[0].run("shared", torch.get_num_threads) == lanes[0].threads


def test_the_decoding_thread_runs_its_own_torch_work_on_one_thread(tiny_pair, monkeypatch):
    """The caller's thread allocates caches and builds windows between lane calls: it must not start
    an OpenMP pool of its own, and gets its thread setting back afterwards."""
    seen = []
    new_cache = type(tiny_pair.target).new_cache
    def recording_new_cache(model, *args, **kwargs):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        return new_cache(model, *args, **kwargs)
    monkeypatch.setattr(type(tiny_pair.target), "new_cache", recording_new_cache)
    before = torch.get_num_threads()
    out = generate(tiny_pair, "t1 t2 t3", method="sd", max_new_tokens=6, raw=True, gamma=3)
    assert out.error is None and len(out.token_ids) == 6
    assert (threading.get_ident(), 1) in seen
    assert torch.get_num_threads() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_importing_mirror_sd_starts_no_openmp_pool():
    """The import-time int8 probe (models/linear.py) runs one thread: a pool started on the importing
    thread would slow every kernel on the CPU workers (devices.py). The importing thread's pool is
    the only difference between the two imports below, so the thread counts must match."""
    import subprocess
    import sys

    count = ("import os, torch\n{}\nimport mirror_sd, mirror_sd.methods\n"
             "print(len(os.listdir('/proc/self/task')))")
    threads = [int(subprocess.run([sys.executable, "-c", count.format(setting)], capture_output=True, text=True,
                                  check=True, env={**os.environ, "OMP_NUM_THREADS": "2"}).stdout)
               for setting in ("", "torch.set_num_threads(1)")]
    assert threads[0] == threads[1]


def test_the_consumers_time_between_steps_is_not_decoding_time(tiny_pair):
    """An app redraws after every step while the stream waits: that time is not the method's."""
    from mirror_sd import stream
    pause, steps = 0.05, 0
    for out in stream(tiny_pair, "t1 t2 t3", method="vanilla", max_new_tokens=6, raw=True):
        steps += 1
        time.sleep(pause)
    assert steps >= 6 and out.finished == "length"
    assert 0 < out.metrics["wall_s"] < pause * steps / 2


def test_spans_are_measured_on_the_lane_clock():
    trace = Trace("test")
    lane = Lane("target", torch.device("cpu"))
    before = time.perf_counter() - trace.t0
    lane.run("decode", time.sleep, 0.05, label="sleep", trace=trace)
    after = time.perf_counter() - trace.t0
    (span,) = trace.spans
    assert before <= span.start < span.end <= after
    assert span.duration >= 0.05


class StandInEvent:
    """A CUDA event's interface on the CPU: the stand-in GPU reaches it ``queued`` seconds after the
    host records it (it was busy with earlier work), on the host's clock."""

    queued = 0.0

    def record(self, stream=None):
        self.t = time.perf_counter() + StandInEvent.queued

    def synchronize(self):
        pass

    def elapsed_time(self, other) -> float:
        return 1e3 * (other.t - self.t)  # milliseconds, as CUDA's


def test_event_spans_are_the_gpus_times_on_the_host_clock_within_the_hosts_readings():
    from mirror_sd.devices import EventClock

    class At(StandInEvent):
        def __init__(self, t):
            self.t = t

    clock = EventClock(torch.device("cpu"))
    clock.anchor, clock.anchor_host = At(10.0), 100.0  # the GPU passed the anchor at host time 100
    assert clock.span((At(10.5), At(10.8)), 100.4, 100.9) == pytest.approx((100.5, 100.8))
    assert clock.span((At(10.3), At(10.8)), 100.4, 100.9) == pytest.approx((100.4, 100.8))  # not before submitted
    assert clock.span((At(10.5), At(11.2)), 100.4, 100.9) == pytest.approx((100.5, 100.9))  # not after seen done


def test_a_lane_with_an_event_clock_records_when_its_device_worked_not_when_the_host_did(monkeypatch):
    from mirror_sd.devices import EventClock

    trace = Trace("test")
    lane = Lane("target", torch.device("cpu"))
    assert lane.span_clock == "host"
    lane.clock = EventClock(lane.device, event=StandInEvent)
    assert lane.span_clock == "CUDA events"
    lane.run("prefill", time.sleep, 0.01, trace=trace)  # anchors the clock for this trace, nothing queued
    monkeypatch.setattr(StandInEvent, "queued", 0.02)  # the device starts 20 ms after the host submits
    before = time.perf_counter() - trace.t0
    lane.run("decode", time.sleep, 0.05, label="sleep", trace=trace)
    after = time.perf_counter() - trace.t0
    span = trace.spans[-1]
    assert before + 0.02 <= span.start < span.end <= after  # the host's readings would start at `before`
    assert span.duration <= after - before - 0.02


def test_a_generation_says_where_its_spans_came_from(tiny_pair):
    out = generate(tiny_pair, "hi", method="mirror", max_new_tokens=2)
    assert out.trace.meta["span_clocks"] == {"target": "host", "draft": "host"}  # CPU lanes


def test_a_steps_idle_time_is_when_no_lane_worked_on_it():
    from mirror_sd.trace import Span, Step

    trace = Trace("sd")
    for lane, start, end, step in [("target", 0.0, 1.0, 0), ("draft", 1.0, 1.2, 1), ("target", 1.25, 1.4, 1),
                                   ("draft", 1.3, 1.35, 1),  # inside the target's span: counted once
                                   ("draft", 1.5, 1.6, 2), ("target", 1.65, 1.7, 2)]:
        trace.spans.append(Span(lane, "work", "", start, end, step))
    trace.steps = [Step(0, [1], ["target"]), Step(1, [2, 3], ["accepted", "correction"]), Step(2, [4], ["bonus"])]
    costs = trace.step_costs()
    assert costs.ms.tolist() == pytest.approx([500.0, 200.0])  # step 1 runs to step 2's first span
    assert costs.idle.tolist() == pytest.approx([150.0, 50.0])  # 1.2-1.25 and 1.4-1.5; 1.6-1.65


def test_queued_work_on_a_cpu_lane_runs_on_its_worker_and_records_its_span_when_told():
    """Lane.queue (the queued steps): on a CPU lane fn runs to its end on the lane's worker, with its
    threads, as ``run`` runs it; the span goes into the trace once the caller says the work is done,
    within the host's readings."""
    from mirror_sd.devices import LaneError

    trace = Trace("test")
    lane = Lane("draft", torch.device("cpu"))
    before = time.perf_counter() - trace.t0
    result, queued = lane.queue("decode", lambda: (time.sleep(0.02), threading.get_ident())[1], trace=trace, step=2)
    assert result == lane.run("thread", threading.get_ident) != threading.get_ident()
    assert queued.done is None and not trace.spans
    queued.record()
    (span,) = trace.spans
    assert (span.kind, span.step) == ("decode", 2) and before <= span.start and span.duration >= 0.02
    with pytest.raises(LaneError, match="ZeroDivisionError") as caught:
        lane.queue("boom", lambda: 1 / 0, step=3)
    assert (caught.value.lane, caught.value.step) == ("draft", 3)


def test_lane_errors_reach_the_caller():
    """As a LaneError naming the lane and the step, with the error itself as its cause."""
    from mirror_sd.devices import LaneError

    lane = Lane("draft", torch.device("cpu"))
    with pytest.raises(LaneError, match="ZeroDivisionError: division by zero") as caught:
        lane.run("boom", lambda: 1 / 0, step=3)
    assert (caught.value.lane, caught.value.step) == ("draft", 3)
    assert isinstance(caught.value.error, ZeroDivisionError) and caught.value.__cause__ is caught.value.error


def test_a_lane_works_in_a_forked_child():
    """ZeroGPU runs each GPU call in a forked process, where the parent's worker thread is gone."""
    lane = Lane("target", torch.device("cpu"))
    assert lane.run("warm", lambda: 1) == 1  # the parent's worker thread now exists
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: without a fresh worker this would wait forever
        try:
            os.write(write, str(lane.run("add", lambda a, b: a + b, 2, 3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 20)
    answer = os.read(read, 16).decode() if ready else "no answer within 20 s"
    os.waitpid(pid, 0) if ready else os.kill(pid, 9)
    assert answer == "5"
    assert lane.run("again", lambda: 7) == 7  # the parent's lane is untouched


@pytest.mark.parametrize("name", ["cuda:7", "npu", "tpu", "", "mps"])
def test_missing_devices_are_refused_clearly(name):
    if name == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with pytest.raises(MirrorSDError, match="device|npu"):
        resolve_device(name)


def test_trace_exports(tiny_pair):
    out = generate(tiny_pair, "t1 t2 t3", method="sd", max_new_tokens=12, raw=True, gamma=3)
    trace = out.trace
    spans = trace.spans_frame()
    assert {"lane", "kind", "label", "start", "end", "step", "tokens", "duration"} <= set(spans.columns)
    assert set(spans.kind) == {"prefill", "draft", "verify"}
    assert spans.lane.nunique() == 2
    assert (spans.duration > 0).all()
    steps = trace.steps_frame()
    assert steps.new_tokens.sum() == len(out.token_ids) == 12
    # JSON round trip keeps everything
    again = Trace.from_json(trace.to_json())
    assert again.to_dict() == json.loads(trace.to_json())
    # Chrome trace: one "X" event per span, microseconds, one tid per lane
    chrome = trace.to_chrome_trace()
    events = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(trace.spans)
    assert len({e["tid"] for e in events}) == 2
    first = trace.spans[0]
    match = [e for e in events if abs(e["ts"] - first.start * 1e6) < 1]
    assert match and abs(match[0]["dur"] - first.duration * 1e6) < 1


def test_a_step_cut_at_max_new_tokens_counts_only_the_drafts_it_commits(tiny_pair):
    """The last step may verify more drafts than there is room for: it commits what fits, and its
    ``accepted`` counts only the committed drafts (so acceptance rates stay true)."""
    from mirror_sd.engine import Decoding
    from mirror_sd.trace import Step, Trace

    run = Decoding(tiny_pair, [1, 2, 3], max_new_tokens=3, temperature=0.0, top_p=1.0, seed=0, trace=Trace("sd"))
    run.commit(Step(0, [5], ["target"]))
    last = run.commit(Step(1, [6, 7, 8, 9], ["accepted"] * 3 + ["bonus"], proposed=[6, 7, 8], accepted=3))
    assert run.tokens == [5, 6, 7] and run.finished == "length"
    assert last.committed == [6, 7] and last.accepted == 2 and last.origins == ["accepted", "accepted"]


def test_rejected_tokens_of_a_chain_and_of_a_tree():
    """A chain window's rejected tokens are its rest; a tree's are the candidates where acceptance stopped
    (the children of the last accepted node), not the nodes of other branches."""
    from dataclasses import replace

    from mirror_sd.trace import DraftTree, Step

    chain = Step(1, [6, 9], ["accepted", "correction"], proposed=[6, 7, 8], accepted=1)
    assert chain.rejected == [7, 8] and chain.accepted_at == [0] and chain.rejected_at == [1, 2]
    # root -> 10, 11; 10 -> 20, 21; 11 -> 22. Accepted 10, then the target said 30 (a correction).
    tree = DraftTree(tokens=[10, 11, 20, 21, 22], parents=[-1, -1, 0, 0, 1], depths=[1, 1, 2, 2, 2], scores=[None] * 5,
                     path=[0])
    step = Step(1, [10, 30], ["accepted", "correction"], proposed=tree.tokens, accepted=1, tree=tree)
    assert step.rejected == [20, 21] and step.accepted_at == [0] and step.rejected_at == [2, 3]
    none = Step(2, [40], ["correction"], proposed=tree.tokens, accepted=0, tree=replace(tree, path=[]))
    assert none.rejected == [10, 11] and none.accepted_at == [] and none.rejected_at == [0, 1]


def test_to_device_makes_tensors_of_numbers_and_of_tensors():
    from mirror_sd.devices import to_device

    cpu = torch.device("cpu")
    assert to_device([[1, 2], [3, 4]], cpu).tolist() == [[1, 2], [3, 4]]
    assert to_device([1, 0], cpu, torch.bool).dtype == torch.bool
    mask = torch.ones(2, 2)
    assert to_device(mask, cpu) is mask  # already there: not copied
    assert to_device(mask, cpu, torch.bool).dtype == torch.bool


@pytest.mark.parametrize("side_by_side", [False, True])
def test_the_two_prefills_run_side_by_side_only_on_lanes_of_their_own(tiny_pair, monkeypatch, side_by_side):
    """Two CPU lanes prefill one after the other (the target's prefill takes every core they split);
    lanes of their own (a GPU's two streams, a GPU and the CPU) prefill at once: the draft's is
    submitted before the host waits for the target's (forced here; the CPU's lanes may then share
    one worker, so their spans need not overlap). Either way sd and mirror commit vanilla's tokens."""
    from mirror_sd.methods import prefill

    assert not prefill.prefills_side_by_side(tiny_pair)  # the CPU's two lanes
    monkeypatch.setattr(prefill, "prefills_side_by_side", lambda pair: side_by_side)
    forward, submit, futures, target_done_at_draft = prefill.forward, Lane.submit, {}, []

    def slow_target_forward(model, *args, **kwargs):  # the target's prefill outlasts the host's next step
        if model is tiny_pair.target:
            time.sleep(0.05)
        return forward(model, *args, **kwargs)

    def logged_submit(self, kind, fn, *args, **kwargs):
        if kind == "prefill" and self.name == "draft":
            target_done_at_draft.append(futures["target"].done())
        futures[self.name] = submit(self, kind, fn, *args, **kwargs)
        return futures[self.name]

    monkeypatch.setattr(prefill, "forward", slow_target_forward)
    monkeypatch.setattr(Lane, "submit", logged_submit)
    prompt = "t1 t2 t3 t4 t5 t6 t7 t8 t9 t10 t11 t12 t13 t14 t15 t16"
    expected = generate(tiny_pair, prompt, method="vanilla", max_new_tokens=12, raw=True).token_ids
    for method in ("sd", "mirror"):
        out = generate(tiny_pair, prompt, method=method, max_new_tokens=12, raw=True)
        assert out.error is None and out.token_ids == expected
        target, draft = (next(s for s in out.trace.spans if s.kind == "prefill" and out.trace.lanes[s.lane] == lane)
                         for lane in ("target", "draft"))
        assert target.end <= draft.start or side_by_side  # one after the other on the CPU's lanes
    assert target_done_at_draft == [not side_by_side] * 2  # sd's and mirror's draft prefills
