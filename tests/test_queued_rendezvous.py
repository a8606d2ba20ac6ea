"""What a queued Mirror-SD step waits for (docs/methods/mirror.md, "What a queued step's rendezvous span
times"): on CUDA streams its ``rendezvous`` span is only the target's picks, queued right after the suffix
and waiting for nothing on the draft stream, so the GPU may finish it before the rollouts; the host's one
wait takes the rollouts too before it verifies and matches the branch, which no span times. The code
(spied on CPU lanes), the app's H200 recordings, and the zoomed step that draws them agree."""
import pytest

from app import figures
from app.replay import RECORDED, load_race
from mirror_sd import generate
from mirror_sd.executors import Phase, Streams
from mirror_sd.methods import mirror
from mirror_sd.trace import SpanKind

H200 = sorted((RECORDED / "nvidia-h200").glob("*.json"))
EPS = 1e-6  # s: the spans' clock rounding
STEP_WORK = (SpanKind.TARGET_PREFIX, SpanKind.TARGET_SUFFIX, SpanKind.DRAFT_ROLLOUT, SpanKind.RENDEZVOUS)


@pytest.mark.parametrize("options", [dict(gamma=3, kappa=2, branch_budget=3), dict(gamma=3, kappa=3, tree=6)])
def test_the_picks_wait_for_no_draft_work_and_the_verdict_is_read_after_the_steps_one_wait(tiny_pair, monkeypatch,
                                                                                         options):
    """Streams (the GPU's executor), spied on: the rendezvous phase reads only the target lane's work (so no
    CUDA event makes it wait for the draft stream), and the host computes each verdict only after one
    ``finish`` that took the rollouts and the picks."""
    log = []
    start, finish = Streams.start, Streams.finish

    def spy_start(self, lane, kind, fn, *args, **span):
        if kind == SpanKind.RENDEZVOUS:
            log.append(("picks after", {a.lane is lane for a in args if isinstance(a, Phase)}))
        return start(self, lane, kind, fn, *args, **span)

    def spy_finish(self, *phases):
        finish(self, *phases)
        log.append(("waited for", {p.queued.kind for p in phases}))

    def spy(real, name):
        return lambda *a, **k: log.append((name, None)) or real(*a, **k)

    monkeypatch.setattr(Streams, "start", spy_start)
    monkeypatch.setattr(Streams, "finish", spy_finish)
    monkeypatch.setattr(mirror, "walk_tree_picks", spy(mirror.walk_tree_picks, "verdict"))
    monkeypatch.setattr(tiny_pair, "queue_steps", "on")
    out = generate(tiny_pair, "t1 t2 t3", method="mirror", max_new_tokens=16, raw=True, **options)
    assert out.error is None
    verdicts = [i for i, (what, _) in enumerate(log) if what == "verdict"]
    assert len(verdicts) == len(out.trace.steps) - 1
    for i in verdicts:
        assert log[i - 1] == ("waited for", set(STEP_WORK))  # the rollouts and the picks, then the verdict
    assert {frozenset(seen) for what, seen in log if what == "picks after"} == {frozenset({True})}


def mirror_steps(trace):
    """(step, {kind: span}) of each Mirror-SD step with rollouts, and the start of the step after it (None)."""
    firsts = {}
    for s in trace.spans:
        if s.step is not None:
            firsts[s.step] = min(firsts.get(s.step, s.start), s.start)
    for step in trace.steps[1:]:
        spans = {s.kind: s for s in figures.step_spans(trace, step.index)}
        if SpanKind.DRAFT_ROLLOUT in spans:
            yield step.index, spans, firsts.get(step.index + 1)


def test_the_h200_recordings_show_the_picks_before_the_rollouts_end_and_the_next_step_after_both():
    """Every queued step of the recordings in the order its synchronisation implies: the picks right after
    the suffix on the target stream, the rollouts after the token channel (their event), the next step's
    first work after the host's one wait (both lanes done); and the picks end before the rollouts in most
    steps (157 of 157 when recorded: by 0.38 ms median), which the chart draws as it was."""
    steps = early = 0
    for path in H200:
        trace = load_race(path)[2]["mirror"].trace
        assert figures.queued_on_gpu(trace)
        for k, spans, after in mirror_steps(trace):
            prefix, suffix = spans[SpanKind.TARGET_PREFIX], spans[SpanKind.TARGET_SUFFIX]
            rollout, picks = spans[SpanKind.DRAFT_ROLLOUT], spans[SpanKind.RENDEZVOUS]
            assert suffix.end - EPS <= picks.start < suffix.end + 0.001 and picks.duration < 0.0001, (path.name, k)
            assert rollout.start >= prefix.end - EPS, (path.name, k)
            if after is not None:
                assert after >= max(rollout.end, picks.end) - EPS, (path.name, k)
            steps += 1
            early += picks.end < rollout.end
    assert steps > 100 and early >= 0.9 * steps


def test_the_zoomed_step_says_the_picks_come_first_and_draws_the_hosts_verdict_after_both_lanes():
    for path in H200:
        results = load_race(path)[2]
        traces = {name: r.trace for name, r in results.items()}
        fig = figures.zoomed_steps(traces)
        notes = [a for a in fig.layout.annotations if a.text == figures.QUEUED_NOTE]
        host = [b for b in fig.data if b.name == figures.HOST_LEGEND]
        mirror_rows = figures.typical_steps(traces["mirror"])
        assert len(notes) == len(host) == len(fig.layout.shapes) == len(mirror_rows) == 2
        trace = traces["mirror"]
        for (_, k), bar, line in zip(mirror_rows, host, fig.layout.shapes):
            spans = figures.step_spans(trace, k)
            t0 = min(s.start for s in spans)
            rollout = next(s for s in spans if s.kind == SpanKind.DRAFT_ROLLOUT)
            picks = next(s for s in spans if s.kind == SpanKind.RENDEZVOUS)
            waited = 1000 * (max(rollout.end, picks.end) - t0)
            assert bar.base[0] == pytest.approx(waited) and line.x0 == pytest.approx(waited) and bar.x[0] > 0
            assert bar.y[0] == picks.lane and bar.text[0] == figures.HOST_TEXT
        legends = {b.name for b in fig.data if b.legendgroup == SpanKind.RENDEZVOUS}
        assert legends == {figures.QUEUED_LEGEND}


def test_a_cpu_race_draws_its_rendezvous_as_recorded():
    path = next(p for p in sorted(RECORDED.glob("*.json")))
    traces = {name: r.trace for name, r in load_race(path)[2].items()}
    assert not figures.queued_on_gpu(traces["mirror"])
    fig = figures.zoomed_steps(traces)
    assert not [b for b in fig.data if b.name == figures.HOST_LEGEND] and not fig.layout.shapes
    assert all(a.text != figures.QUEUED_NOTE for a in fig.layout.annotations)


def test_how_it_works_says_a_gpu_step_still_ends_after_both_lanes():
    from app.intro import how_it_works_html

    assert ("On a GPU the target&#x27;s picks come right after its suffix, but the host reads them and matches the "
            "branch only once the draft is done too, so the step still ends after both") in how_it_works_html()
