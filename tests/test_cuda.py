"""The CUDA paths, on a real NVIDIA GPU: skipped on machines without one (CI has none).

With one GPU the target runs on cuda:0 and the draft on a second CUDA stream of it (devices.py).
Tiny random models stand in for the embedded pair, so these tests need no weights; every method
must commit vanilla's tokens there as it does on the CPU, the two lanes' streams must really
overlap, sampling must keep the target's law, and NVML readings must reach the trace.
"""
import pytest
import torch

from mirror_sd import generate, load_pair
from mirror_sd.models.eagle import EagleHead, attach_head

from test_distribution import PROMPT, chi_square_p, exact_law_of_tokens_2_and_3, sample_counts
from test_ss import random_streams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = ["t1 t2 t3", "t9", "t4 t4 t4 t4", "t15 t0 t7", "t3 t1 t4 t1 t5 t9 t2 t6"]
METHODS = {  # method (and a variant after a comma) -> options; lookup 0 keeps context copies out, so the draft's own paths run
    "sd": dict(gamma=3),
    "eagle": dict(depth=3, top_k=3, total_tokens=8, lookup=0),
    "ss": dict(gamma=3, top_k=2, total_tokens=6, lookup=0),
    "ss, one forward": dict(gamma=3, top_k=2, total_tokens=6, lookup=0, one_forward=1),
    "mirror": dict(gamma=3, kappa=2, branch_budget=3, lookup=0),  # each step queued on the two streams
    "mirror, host": dict(gamma=3, kappa=2, branch_budget=3, lookup=0, queue_steps="off"),  # the lanes' threads, the
    # host between; no correction rollout: a miss drafts afresh
    "mirror, trees": dict(gamma=3, kappa=2, branch_budget=3, lookup=0, tree=6),  # queued tree steps
    "sd, tree": dict(gamma=3, tree=6, branching=2),  # the draft's tree grown on the GPU, read once
}


def cuda_pair(tiny_dirs, dtype: str | None):
    """The tiny pair on this machine's default devices (one GPU: cuda:0 and its second stream),
    with an untrained EAGLE head and random streams for the target."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), dtype=dtype)
    assert pair.target.device.type == pair.draft.device.type == "cuda"
    torch.manual_seed(0)
    attach_head(pair, EagleHead.from_target(pair.target, torch.arange(16)))
    pair.streams = random_streams(pair.target, layers=1, G=3)
    pair.one_forward_streams = pair.streams  # no next-token input: they fit both forms
    return pair


@pytest.fixture(scope="module")
def fp32_pair(tiny_dirs):
    pair = cuda_pair(tiny_dirs, None)  # no dtype: the default, fp32 on a GPU too (devices.DEFAULT_DTYPE)
    assert pair.target.dtype == pair.draft.dtype == torch.float32
    return pair


def test_one_gpu_gives_the_draft_a_second_stream(fp32_pair):
    target, draft = fp32_pair.target_lane, fp32_pair.draft_lane
    assert target.device.type == draft.device.type == "cuda" and target.device == draft.device
    assert draft.stream is not None and target.stream is None
    assert fp32_pair.target.device.type == "cuda" and fp32_pair.draft.device.type == "cuda"
    assert "2nd stream" in draft.label
    assert not torch.backends.cuda.cudnn_sdp_enabled()  # devices.avoid_cudnn_attention: a plan per length


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_equals_vanilla_on_the_gpu(fp32_pair, monkeypatch, method):
    options = dict(METHODS[method])
    monkeypatch.setattr(fp32_pair, "queue_steps", options.pop("queue_steps", "auto"))  # the pair's, not an option
    accepted = 0
    for prompt in PROMPTS:
        expected = generate(fp32_pair, prompt, method="vanilla", max_new_tokens=32, raw=True).token_ids
        out = generate(fp32_pair, prompt, method=method.split(",")[0], max_new_tokens=32, raw=True, **options)
        assert out.error is None, out.error
        assert out.token_ids == expected, f"{method} differs from vanilla on {prompt!r}"
        accepted += sum(s.accepted for s in out.trace.steps)
    assert accepted > 0  # drafts were really verified and some used


def test_mirror_rollouts_overlap_the_target_suffix_on_two_streams(fp32_pair, monkeypatch):
    """The draft stream waits for the token channel only, so its rollouts run while the target
    stream works on the suffix. The tiny target's suffix takes the GPU microseconds, less than the
    host needs to queue the rollouts, so each suffix is made longer here: the GPU first spins on the
    target stream for about a millisecond (``torch.cuda._sleep``). Rollouts made to wait for the
    suffix would then never overlap it."""
    from mirror_sd.methods import mirror

    target_suffix = mirror.target_suffix

    def long_suffix(*args, **kwargs):
        torch.cuda._sleep(2_000_000)  # GPU clock cycles, on the target lane's stream
        return target_suffix(*args, **kwargs)
    monkeypatch.setattr(mirror, "target_suffix", long_suffix)
    out = generate(fp32_pair, PROMPTS[4], method="mirror", max_new_tokens=48, raw=True, **METHODS["mirror"])
    spans = out.trace.spans_frame()
    overlapping = 0
    for _, group in spans.groupby("step"):
        suffix, rollout = group[group.kind == "target-suffix"], group[group.kind == "draft-rollout"]
        if len(suffix) and len(rollout):
            s, r = suffix.iloc[0], rollout.iloc[0]
            overlapping += min(s.end, r.end) - max(s.start, r.start) > 0
    assert overlapping >= 1 and out.metrics["overlap"] > 0


def test_a_miss_takes_its_next_window_from_the_correction_rollout_on_the_gpu(fp32_pair):
    """Queued on the two streams, the correction rollout runs on the draft's stream after the
    target's picks: the step after a miss takes its window, with no fallback draft after the first
    step, and the run equals vanilla (tests/test_rollout.py checks the window itself on the CPU)."""
    for prompt in PROMPTS:
        expected = generate(fp32_pair, prompt, method="vanilla", max_new_tokens=32, raw=True).token_ids
        out = generate(fp32_pair, prompt, method="mirror", max_new_tokens=32, raw=True, **METHODS["mirror"])
        assert out.error is None and out.token_ids == expected
        steps = out.trace.steps[1:]
        assert [s.rendezvous.corrected for s in steps[1:]] == [not s.rendezvous.hit for s in steps[:-1]]
        assert not any(s.rendezvous.fallback for s in steps[1:])
        lanes = {out.trace.lanes[s.lane] for s in out.trace.spans if s.kind == "correction-rollout"}
        assert lanes == {"draft"}


def test_gpu_lanes_time_their_spans_with_cuda_events(fp32_pair):
    """A span is the GPU's own time between two events around the work (devices.EventClock), put on
    the host's clock and within the host's readings around it."""
    from mirror_sd import Trace

    lane, trace = fp32_pair.target_lane, Trace("test")
    assert lane.span_clock == fp32_pair.draft_lane.span_clock == "CUDA events"
    x = torch.randn(2048, 2048, device=lane.device)
    work = lambda: [x @ x for _ in range(50)][-1].sum()  # noqa: E731  (some milliseconds of GPU work)
    lane.run("warm-up", work, trace=trace)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    lane.run("work", work, trace=trace)
    end.record()
    end.synchronize()
    span = trace.spans[-1]
    assert 0 < span.duration * 1e3 <= begin.elapsed_time(end) + 0.5  # ms: no longer than the GPU's own
    out = generate(fp32_pair, PROMPTS[0], method="mirror", max_new_tokens=8, raw=True, **METHODS["mirror"])
    assert out.trace.meta["span_clocks"] == {"target": "CUDA events", "draft": "CUDA events"}


@pytest.mark.parametrize("method", ["sd", "mirror"])
def test_sampling_on_the_gpu_keeps_the_target_law(tiny_dirs, fp32_pair, method):
    prompt_ids = fp32_pair.encode(PROMPT, raw=True)
    target_cpu = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu").target
    law = exact_law_of_tokens_2_and_3(target_cpu, prompt_ids, 1.0, 1.0)
    options = {k: v for k, v in METHODS[method].items() if k != "lookup"} if method == "mirror" else dict(gamma=2)
    counts = sample_counts(fp32_pair, method, 1.0, 1.0, **options)
    assert chi_square_p(counts, law) > 1e-3


def test_nvml_readings_reach_the_trace(fp32_pair):
    pytest.importorskip("pynvml")
    out = generate(fp32_pair, PROMPTS[4], method="mirror", max_new_tokens=160, raw=True, **METHODS["mirror"])
    samples = out.trace.gpu_samples
    assert samples and {g.device for g in samples} == {"cuda:0"}
    assert all(0 <= g.percent <= 100 for g in samples)


def test_queued_work_on_the_second_stream_waits_for_the_firsts_on_the_gpu(fp32_pair):
    """Lane.queue's ``after``: the draft lane's stream waits for an event of the target lane's work,
    on the GPU, so what it reads is what the target lane wrote; the host waits only at the end."""
    target, draft = fp32_pair.target_lane, fp32_pair.draft_lane
    x = torch.zeros(2048, 2048, device="cuda")

    def slow_fill():  # a long kernel chain on the target's stream, then the value the draft reads
        y = x
        for _ in range(20):
            y = y @ y
        x.fill_(3.0)

    _, filled = target.queue("fill", slow_fill)
    total, summed = draft.queue("sum", lambda: x.sum(), after=filled.done)
    summed.done.synchronize()
    assert total.item() == 3.0 * x.numel()


def test_sd_verifies_the_chain_its_draft_stream_just_drafted(fp32_pair, monkeypatch):
    """sd's queued step (methods/verify.py: draft_and_verify_on_stages): the target's stream waits for the
    draft's on a CUDA event, so the chain it verifies is the one the draft's stage has just drafted,
    not the one its output buffer held before, even when the draft's stream runs late."""
    from mirror_sd.drafting.tree import read_trees
    from mirror_sd.methods import sd

    drafted, draft_on_stage = [], sd.chain_on_stage

    def late(run, stages, cache, chain):  # the draft's stream spins first, then drafts
        torch.cuda._sleep(20_000_000)
        fields = draft_on_stage(run, stages, cache, chain)
        drafted.append(fields.clone())  # on the draft's stream, after the replay
        return fields

    monkeypatch.setattr(sd, "chain_on_stage", late)
    out = generate(fp32_pair, PROMPTS[0], method="sd", max_new_tokens=16, raw=True, **METHODS["sd"])
    assert out.error is None and len(drafted) == len(out.trace.steps) - 1  # every step queued, read once
    assert [step.proposed for step in out.trace.steps[1:]] == [read_trees(f)[0].tokens for f in drafted]


def test_to_device_queues_its_copy_behind_the_streams_work():
    """A non-blocking copy through pinned memory lands before the kernels queued after it read it,
    and after a long kernel already queued on the stream, without the host waiting for that kernel."""
    from mirror_sd.devices import to_device

    device = torch.device("cuda")
    big = torch.randn(4096, 4096, device=device)
    for _ in range(3):
        big = big @ big / 64  # queued work the copy must not wait for
    ids = to_device([[3, 1, 4, 1, 5]], device)
    assert ids.device.type == "cuda" and ids.dtype == torch.long
    assert ids.add(1).tolist() == [[4, 2, 5, 2, 6]]
    mask = to_device(torch.ones(2, 3, dtype=torch.int64), device, torch.bool)
    assert mask.dtype == torch.bool and bool(mask.all())


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_every_formulation_is_the_default_ones_result_on_the_gpu(dtype, tolerance):
    """models/tuning.py's formulations, the Triton kernel compiled for this GPU included, at the
    embedded target's shapes and every row count a stage runs: its products, its attention over a
    stage's slots under a mask, its RMSNorm (alone and after a residual add), its rotary embedding,
    its rotary embedding fused with the cache writes, its q, k and v products and its gated MLP's
    first half."""
    import torch.nn.functional as F

    from mirror_sd.models.linear import Linear
    from mirror_sd.models.stages import BUCKETS
    from mirror_sd.models.llama import RMSNorm
    from mirror_sd.models.tuning import (FORMULATIONS, run_added_norm, run_attention, run_gated, run_norm, run_product,
                                         run_projections, run_rotary, run_rotary_store)

    rms = RMSNorm(576, 1e-5).to("cuda", dtype)
    qkv = [Linear(576, n).to("cuda", dtype) for n in (576, 192, 192)]
    gate, up = (Linear(576, 1536, bias=False).to("cuda", dtype) for _ in range(2))

    torch.manual_seed(0)
    for n, k, bias in [(576, 576, False), (1536, 576, False), (576, 1536, False), (192, 576, True)]:
        w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dtype)
        b = torch.randn(n, device="cuda").to(dtype) if bias else None
        for rows in BUCKETS:
            x = torch.randn(rows, k, device="cuda").to(dtype)
            expected = F.linear(x, w, b).float()
            for name in FORMULATIONS["product"]:
                torch.testing.assert_close(run_product(name, x, w, b).float(), expected, rtol=tolerance,
                                           atol=tolerance, msg=lambda m: f"{name}, {rows} x {k} by {n} x {k}: {m}")
    for rows in BUCKETS:
        q = torch.randn(1, 9, rows, 64, device="cuda").to(dtype)
        k, v = (torch.randn(1, 3, 1088, 64, device="cuda").to(dtype) for _ in range(2))
        mask = torch.rand(1, 1, rows, 1088, device="cuda") > 0.5
        mask[..., 0] = True
        expected = run_attention("sdpa", q, k, v, mask, False).float()
        for name in FORMULATIONS["attention"]:
            torch.testing.assert_close(run_attention(name, q, k, v, mask, False).float(), expected, rtol=tolerance,
                                       atol=tolerance, msg=lambda m: f"attention {name}, {rows} rows: {m}")
        x, w = (torch.randn(1, rows, 576, device="cuda") * 3).to(dtype), torch.randn(576, device="cuda").to(dtype)
        expected = run_norm("composite", x, w, 1e-5).float()
        for name in FORMULATIONS["norm"]:
            torch.testing.assert_close(run_norm(name, x, w, 1e-5).float(), expected, rtol=tolerance, atol=tolerance,
                                       msg=lambda m: f"norm {name}, {rows} rows: {m}")
        delta = torch.randn(1, rows, 576, device="cuda").to(dtype)
        with torch.no_grad():
            rms.weight.copy_(w)
            expected = [y.float() for y in run_added_norm("separate", x, delta, rms)]
            for name in FORMULATIONS["added_norm"]:
                for got, want in zip(run_added_norm(name, x, delta, rms), expected):
                    torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance,
                                               msg=lambda m: f"added_norm {name}, {rows} rows: {m}")
        q = torch.randn(1, rows, 9, 64, device="cuda").to(dtype).transpose(1, 2)  # [B, H, T, D], as Attention has it
        angles = torch.rand(1, 1, rows, 32, device="cuda") * 6
        cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(dtype) for f in (torch.cos, torch.sin))
        expected = run_rotary("composite", q, cos, sin).float()
        for name in FORMULATIONS["rotary"]:
            torch.testing.assert_close(run_rotary(name, q, cos, sin).float(), expected, rtol=tolerance, atol=tolerance,
                                       msg=lambda m: f"rotary {name}, {rows} rows: {m}")
        k, v = (torch.randn(1, rows, 3, 64, device="cuda").to(dtype).transpose(1, 2) for _ in range(2))
        slots = torch.randperm(1088, device="cuda")[:rows]
        stored = {}
        for name in FORMULATIONS["rotary_store"]:
            caches = [torch.zeros(1, 3, 1088, 64, device="cuda", dtype=dtype) for _ in range(2)]
            stored[name] = [x.float() for x in run_rotary_store(name, q, k, v, cos, sin, *caches, slots)]
            for got, want in zip(stored[name], stored["separate"]):
                torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance,
                                           msg=lambda m: f"rotary_store {name}, {rows} rows: {m}")
        x = torch.randn(1, rows, 576, device="cuda").to(dtype)
        with torch.no_grad():
            expected = [y.float() for y in run_projections("separate", x, qkv)]
            for name in FORMULATIONS["projections"]:
                for got, want in zip(run_projections(name, x, qkv), expected):
                    torch.testing.assert_close(got.float(), want, rtol=tolerance, atol=tolerance)
            expected = run_gated("separate", x, gate, up).float()
            for name in FORMULATIONS["gated"]:
                torch.testing.assert_close(run_gated(name, x, gate, up).float(), expected, rtol=tolerance,
                                           atol=tolerance, msg=lambda m: f"gated {name}, {rows} rows: {m}")


def test_captured_stages_time_every_formulation_and_record_the_fastest(tiny_dirs):
    """Capturing a stage set tunes each operation it records (models/tuning.py):
    every formulation timed on this GPU (the Triton kernels compiled and ran), and the stages'
    logits are still the plain forward's."""
    from mirror_sd.models import tuning
    from mirror_sd.models.loading import load_model
    from mirror_sd.models.stages import BUCKETS, Stages

    model, _ = load_model(tiny_dirs["target"], torch.device("cuda"), torch.float32)
    with torch.inference_mode():
        stages = Stages(model, 64)
        stages.capture_all(["full"])
        ids = torch.tensor([[1, 5, 2, 9, 3]], device="cuda")
        plain = model.forward(ids, model.new_cache(64), commit=False)
        torch.testing.assert_close(stages.run("full", ids), plain, rtol=1e-4, atol=1e-4)
    head = f"{model.args.vocab_size} x {model.args.hidden_size}"
    for rows in BUCKETS:
        for op, shape in (("product", head), ("attention", None), ("norm", None), ("added_norm", None),
                          ("rotary", None), ("rotary_store", None), ("projections", None), ("gated", None)):
            key = next(k for k in tuning.PLAN if k[0] == op and k[1].startswith("cuda") and k[3] == rows
                       and shape in (None, k[2]))
            times, names = tuning.TIMES[key], tuning.FORMULATIONS[op]
            assert all(isinstance(times[name], float) and times[name] > 0 for name in names), times
            assert tuning.PLAN[key] == names[0] or times[tuning.PLAN[key]] < times[names[0]]


def test_a_one_stage_forward_a_capture_cannot_record_is_refused_before_its_capture(tiny_dirs, monkeypatch):
    """The warm-up's check (models/capture_check.py) finds a host value copied onto the device in a
    one-stage forward's body, before any capture: the forward is refused with a warning, its method
    commits vanilla's tokens an operation at a time, and the process's later captures and random
    numbers still work (a failed capture could leave both unusable)."""
    from mirror_sd.models.chain_draft import ChainDraftStage

    body = ChainDraftStage.body

    def unsafe_body(stage):
        rows = torch.arange(1, device=stage.x.device)
        stage.x[rows, rows] = 0  # a Python number through a tensor index: a copy from the host
        return body(stage)

    monkeypatch.setattr(ChainDraftStage, "body", unsafe_body)
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")
    expected = generate(pair, PROMPTS[0], method="vanilla", max_new_tokens=12, raw=True).token_ids
    with pytest.warns(UserWarning, match="could not be captured as a CUDA graph"):
        out = generate(pair, PROMPTS[0], method="sd", max_new_tokens=12, raw=True, gamma=3)
    assert out.error is None and out.token_ids == expected
    assert any("CaptureUnsafe" in why for s in pair.stage_sets.values() for why in s.refused.values())
    torch.randn(8, device="cuda")  # the random-number state is not stuck in a capture
    monkeypatch.undo()  # the chain stages' own body again: Mirror-SD's fallback chain captures
    refused = sum(len(s.refused) for s in pair.stage_sets.values())
    again = generate(pair, PROMPTS[0], method="mirror", max_new_tokens=12, raw=True, gamma=3, exit_layer=1)  # new captures
    assert again.error is None and again.token_ids == expected
    assert sum(len(s.refused) for s in pair.stage_sets.values()) == refused
