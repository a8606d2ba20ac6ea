"""Fixed-shape stages (models/stages.py) against the plain forward, on the tiny models.

A stage pads its window to a bucket, reads the whole cache under a mask and writes padding rows to
scratch slots: real rows must get the plain forward's logits, and greedy decoding the same tokens,
at any position, with the cache's real slots untouched by padding. The CUDA-graph tests need a GPU.
"""
import pytest
import torch

from mirror_sd.devices import single_threaded
from mirror_sd.errors import MirrorSDError
from mirror_sd.models.llama import full_mask
from mirror_sd.models.stages import (BUCKETS, MAX_WIDTH, ROUTE_MARGIN, LayerRange, Stage, Stages, bucket,
                                     cheapest_bucket)

ATOL = 1e-5
PROMPT = torch.tensor([[1, 5, 9, 2, 7]])

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA-graph capture and replay)")


@pytest.fixture(autouse=True)
def no_grad():
    with torch.inference_mode(), single_threaded():  # tiny models: one thread, no OpenMP pool
        yield


@pytest.fixture(scope="module")
def target(tiny_dirs):
    """The tiny target on the CPU on every machine: these tests check the stages' arithmetic, eagerly."""
    from mirror_sd.models.loading import load_model

    return load_model(tiny_dirs["target"], torch.device("cpu"), torch.float32)[0]


def plain_prefill(model, ids, slots=160):
    cache = model.new_cache(slots, batch=ids.shape[0])
    return model.forward(ids, cache), cache


def test_bucket_is_the_smallest_that_holds_the_width():
    assert [bucket(w) for w in (1, 2, 3, 4, 5, 8, 9, 33, 64)] == [1, 2, 4, 4, 8, 8, 16, 64, 64]
    assert BUCKETS[-1] == MAX_WIDTH == 64
    for bad in (0, 65):
        with pytest.raises(MirrorSDError):
            bucket(bad)


# GPU ms of one target replay per bucket, the shape measured on an H200 (docs/devices.md)
NOT_MONOTONIC = {1: 3.4, 2: 5.2, 4: 5.0, 8: 8.1, 16: 8.5, 32: 5.9, 64: 6.5}


def test_the_cheapest_bucket_is_the_smallest_unless_a_wider_one_measured_cheaper():
    assert [cheapest_bucket(w, {}) for w in (1, 3, 5, 33)] == [1, 4, 8, 64]  # nothing timed: the smallest
    routed = {w: cheapest_bucket(w, NOT_MONOTONIC) for w in (1, 2, 3, 5, 8, 16, 17, 32, 33, 64)}
    assert routed == {1: 1, 2: 2, 3: 4, 5: 32, 8: 32, 16: 32, 17: 32, 32: 32, 33: 64, 64: 64}
    # 4 costs 5.0 against 2's 5.2: within the margin, so width 2 keeps its own bucket
    assert NOT_MONOTONIC[4] > NOT_MONOTONIC[2] * (1 - ROUTE_MARGIN)
    assert cheapest_bucket(5, {8: 8.1, 16: 4.0}) == 16  # only measured buckets compete
    assert cheapest_bucket(5, {16: 4.0}) == 8  # its own bucket not timed yet: no comparison


def test_a_window_runs_at_the_cheaper_wider_bucket_with_the_same_logits(target):
    expected, plain = plain_prefill(target, PROMPT)
    stages = Stages(target, 160)
    stages.capture_all(names=["full"])  # eager on the CPU: made, not timed
    assert stages.replay_ms == {} and stages.routes("full") == {}
    stages.replay_ms["full"] = dict(NOT_MONOTONIC)  # as if measured on a GPU
    assert stages.routes("full") == {w: 32 for w in range(5, 17)}
    ran = []
    for width in BUCKETS:
        stage = stages.stage("full", width)
        stage.replay = lambda stage=stage, run=stage.replay: (ran.append(stage.width), run())[1]
    assert torch.allclose(stages.run("full", PROMPT), expected, atol=ATOL)
    assert ran == [32]  # 5 rows at bucket 32, not 8
    stages.cache.length = 5
    assert torch.allclose(stages.run("full", torch.tensor([[3]])), target.forward(torch.tensor([[3]]), plain),
                          atol=ATOL)
    assert ran == [32, 1]
    stages.add("full", LayerRange(0, target.num_layers))  # another forward under the name: timings go
    assert "full" not in stages.replay_ms


def test_prefill_equals_the_plain_forward_at_every_bucket_that_holds_it(target):
    expected, plain = plain_prefill(target, PROMPT)
    for width in (8, 16, 64):  # 5 real rows, 3 to 59 padding rows
        stages = Stages(target, 160)
        stage = Stage(target, width, stages.cache)
        assert torch.allclose(stage.run(PROMPT), expected, atol=ATOL)
        n = PROMPT.shape[1]
        assert torch.allclose(stages.cache.k[:, :, :, :n], plain.k[:, :, :, :n], atol=ATOL)
        assert torch.allclose(stages.cache.v[:, :, :, :n], plain.v[:, :, :, :n], atol=ATOL)


def test_padding_leaves_every_real_slot_but_the_window_untouched(target):
    stages = Stages(target, 160)
    stages.run("full", PROMPT)
    stages.cache.length = 5
    stages.cache.k[:, :, :, 5:160].fill_(3.0)  # stale slots past the window: the plain path keeps them too
    stages.cache.v[:, :, :, 5:160].fill_(3.0)
    before_k, before_v = stages.cache.k[:, :, :, :160].clone(), stages.cache.v[:, :, :, :160].clone()
    stages.stage("full", 64).run(torch.tensor([[3, 4, 6]]))  # 3 rows, 61 padding rows
    window = torch.zeros(160, dtype=torch.bool)
    window[5:8] = True
    assert torch.equal(stages.cache.k[:, :, :, :160][:, :, :, ~window], before_k[:, :, :, ~window])
    assert torch.equal(stages.cache.v[:, :, :, :160][:, :, :, ~window], before_v[:, :, :, ~window])
    assert not torch.equal(stages.cache.k[:, :, :, 5:8], before_k[:, :, :, 5:8])  # the window was written


def host_layout(stage, start: int, T: int, positions=None, mask=None):
    """The slots, mask [B, 1, W, S] and positions [B, W] of a window as the host laid them out
    before the body did: real rows at slots start.., padding rows at scratch, seeing only it."""
    W, usable = stage.width, stage.cache.max_slots
    rows = torch.arange(W)
    slots = torch.where(rows < T, start + rows, usable + rows)
    laid = stage.padding.clone()[None].repeat(stage.batch, 1, 1)  # [B, W, S]
    laid[:, :T] = False
    laid[:, :T, :start + T] = full_mask(mask, T, start, torch.device("cpu"))
    at = torch.zeros(stage.batch, W, dtype=torch.long)
    at[:, :T] = torch.arange(start, start + T) if positions is None else positions
    return slots, laid[:, None], at


def test_every_kind_of_window_lays_itself_out_as_the_host_would(target):
    """The body (``settle``) lays out a window's slots, mask and positions from what ``load`` wrote
    (the rows, given positions or mask, one number), as the host did when it laid them out itself:
    causal windows, trees over the window, masks over every slot, given positions, in any order."""
    stages = Stages(target, 160, batch=2)
    stage = stages.stage("full", 8)
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    for start, T in ((0, 5), (7, 1), (40, 8), (3, 3)):
        stages.cache.length = start
        ids = torch.ones(2, T, dtype=torch.long)
        over_slots = torch.rand(2, T, start + T) < 0.5
        depths = torch.tensor([[start, start + 1, start + 1]] * 2)
        windows = [dict(), dict(positions=torch.arange(start, start + T).expand(2, T)), dict(mask=over_slots)]
        if T == 3:
            windows.append(dict(positions=depths, mask=tree))
        for window in windows:
            stage.load(ids, **window)
            stage.settle()
            slots, mask, positions = host_layout(stage, start, T, **window)
            assert torch.equal(stage.slots, slots) and torch.equal(stage.mask, mask)
            assert torch.equal(stage.positions, positions)


def test_real_rows_do_not_depend_on_the_padding(target):
    stages = Stages(target, 160)
    stages.run("full", PROMPT)
    stages.cache.length = 5
    window = torch.tensor([[3, 4, 6]])
    outs = [stages.stage("full", w).run(window) for w in (4, 8, 64)]
    expected, plain = plain_prefill(target, PROMPT)
    expected = target.forward(window, plain)
    for out in outs:
        assert torch.allclose(out, expected, atol=ATOL)
    assert stages.cache.length == 5  # run() does not commit, like forward(commit=False)


def greedy(step, cache, prompt, tokens):
    """Prefill, then one token per forward; step(ids) -> logits for ids written at cache.length."""
    logits, out = step(prompt), []
    cache.length = prompt.shape[1]
    for _ in range(tokens):
        out.append(int(logits[0, -1].argmax()))
        logits = step(torch.tensor([[out[-1]]]))
        cache.length += 1
    return out


def test_greedy_decode_past_the_first_buckets_gives_the_plain_tokens(target):
    tokens = MAX_WIDTH + 6  # positions past 64: the stage's shape stays the same
    plain = target.new_cache(200)
    expected = greedy(lambda ids: target.forward(ids, plain, commit=False), plain, PROMPT, tokens)
    stages = Stages(target, 200)
    got = greedy(lambda ids: stages.run("full", ids), stages.cache, PROMPT, tokens)
    assert got == expected
    assert len(set(expected)) > 1  # not a degenerate run
    assert {w for _, w in stages._stages} == {1, 8}  # one stage per bucket, reused at every position


def test_prefix_then_suffix_stages_equal_the_full_forward(target):
    expected, _ = plain_prefill(target, PROMPT)
    stages = Stages(target, 160)
    stages.add("prefix", LayerRange(0, 1))
    stages.add("suffix", LayerRange(1, lm_head=True))
    hidden = stages.run("prefix", PROMPT)
    assert hidden.shape == (1, 5, target.args.hidden_size)
    assert torch.allclose(stages.run("suffix", hidden), expected, atol=ATOL)
    h = target.forward_layers(target.embed(PROMPT), target.new_cache(160),
                              target.window(target.new_cache(160), 5), 0, target.num_layers)
    assert torch.allclose(stages.run("head", h), target.head(h), atol=ATOL)


def test_a_tree_window_with_depth_positions_equals_the_plain_tree_forward(target):
    _, plain = plain_prefill(target, PROMPT)
    plain.length = 5
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    ids, positions = torch.tensor([[4, 8, 2, 6]]), torch.tensor([[5, 6, 6, 7]])
    expected = target.forward(ids, plain, positions=positions, tree_mask=tree, commit=False)
    stages = Stages(target, 160)
    stages.run("full", PROMPT)
    stages.cache.length = 5
    got = stages.stage("full", 8).run(ids, positions, tree)
    assert torch.allclose(got, expected, atol=ATOL)


def test_a_batch_of_branches_at_one_width(tiny_dirs):
    from mirror_sd.models.loading import load_model

    draft = load_model(tiny_dirs["draft"], torch.device("cpu"), torch.float32)[0]
    prompts = torch.tensor([[1, 5, 9], [2, 2, 7]])
    expected, _ = plain_prefill(draft, prompts)
    stages = Stages(draft, 160, batch=2)
    assert torch.allclose(stages.run("full", prompts), expected, atol=ATOL)


def test_stage_refuses_what_it_cannot_hold(target):
    stages = Stages(target, 6)
    with pytest.raises(MirrorSDError, match="width 4"):
        stages.stage("full", 4).run(torch.ones(1, 5, dtype=torch.long))
    stages.run("full", PROMPT)
    stages.cache.length = 5
    with pytest.raises(MirrorSDError, match="KV cache full"):
        stages.run("full", torch.tensor([[1, 2]]))
    with pytest.raises(MirrorSDError, match="no stage"):
        stages.stage("verify", 4)


def test_capture_all_makes_every_stage_at_every_bucket_eager_on_the_cpu(target):
    stages, seen = Stages(target, 16), []
    stages.capture_all(progress=lambda done, total: seen.append((done, total)))
    assert set(stages._stages) == {(n, w) for n in ("full", "head") for w in BUCKETS}
    assert seen[-1] == (2 * len(BUCKETS),) * 2
    assert all(stage.graph is None for stage in stages._stages.values())
    stages.cache.length = 16  # full: the LM head alone writes no cache, so it still runs
    h = torch.randn(1, 3, target.args.hidden_size)
    assert torch.allclose(stages.run("head", h), target.head(h), atol=ATOL)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's answer to graphs=True")
def test_graphs_need_cuda(target):
    assert Stages(target, 16).graphs is False  # auto: off on the CPU
    with pytest.raises(MirrorSDError, match="CUDA"):
        Stages(target, 16, graphs=True)


@cuda
def test_captured_graphs_replay_the_eager_logits_on_the_gpu(tiny_dirs):
    from mirror_sd.models.loading import load_model

    model, _ = load_model(tiny_dirs["target"], torch.device("cuda"), torch.float32)
    expected, _ = plain_prefill(model, PROMPT.cuda())
    eager, graphs = Stages(model, 160, graphs=False), Stages(model, 160)
    assert graphs.graphs
    tokens = []
    for stages in (eager, graphs):
        assert torch.allclose(stages.run("full", PROMPT.cuda()), expected, atol=1e-4)
        tokens.append(greedy(lambda ids: stages.run("full", ids.cuda()), stages.cache, PROMPT.cuda(), 80))
        assert stages.cache.length == 5 + 80
    assert tokens[0] == tokens[1]
    captured = graphs.stage("full", 1)
    assert captured.graph is not None
    # its launch timed at capture (Stage.time_launch): from an idle stream the GPU waits for the launch too
    assert 0 < captured.launch_ms and captured.from_idle_ms >= graphs.replay_ms["full"][1] * 0.9
    assert eager.stage("full", 1).launch_ms is None  # nothing captured, nothing timed


@cuda
def test_capture_times_every_stage_and_routes_by_the_times(tiny_dirs):
    from mirror_sd.models.loading import load_model

    model, _ = load_model(tiny_dirs["target"], torch.device("cuda"), torch.float32)
    stages = Stages(model, 160)
    stages.capture_all(names=["full"])
    times = stages.replay_ms["full"]
    assert set(times) == set(BUCKETS) and all(ms > 0 for ms in times.values())
    assert all(stages.route("full", w) == cheapest_bucket(w, times) for w in range(1, MAX_WIDTH + 1))
    expected, _ = plain_prefill(model, PROMPT.cuda())
    assert torch.allclose(stages.run("full", PROMPT.cuda()), expected, atol=1e-4)


@cuda
def test_a_stage_captures_while_the_other_lane_copies_through_pinned_memory(tiny_dirs):
    """Stages are captured on demand, mid-run: after non-blocking copies whose pinned blocks PyTorch
    still tracks by event, and while the other lane's thread copies too (devices.to_device)."""
    import threading

    from mirror_sd.devices import to_device
    from mirror_sd.models.loading import load_model

    model, _ = load_model(tiny_dirs["target"], torch.device("cuda"), torch.float32)
    for _ in range(4):
        to_device(list(range(64)), model.device)  # freed at once, their copies' events pending
    stop, side = threading.Event(), torch.cuda.Stream()

    def other_lane():
        with torch.inference_mode(), torch.cuda.stream(side):
            while not stop.is_set():
                to_device(list(range(64)), model.device)
                stop.wait(0.001)

    thread = threading.Thread(target=other_lane)
    thread.start()
    try:
        stages = Stages(model, 160)
        stages.capture_all(names=["full"])
    finally:
        stop.set()
        thread.join()
    expected, _ = plain_prefill(model, PROMPT.cuda())
    assert torch.allclose(stages.run("full", PROMPT.cuda()), expected, atol=1e-4)


@cuda
def test_capture_writes_scratch_slots_only(tiny_dirs):
    from mirror_sd.models.loading import load_model

    model, _ = load_model(tiny_dirs["target"], torch.device("cuda"), torch.float32)
    stages = Stages(model, 160)
    stages.cache.k.fill_(2.0)
    stages.capture_all(names=["full"])
    assert bool((stages.cache.k[:, :, :, :160] == 2.0).all())


def test_host_ops_counts_the_operations_around_a_stage_not_inside_it(tiny_dirs, monkeypatch):
    """mirror_sd/tools/host_ops.py: a vanilla step on a stage runs a handful of operations around the
    stage's body (the window copied in, the token picked); the plain forward runs every layer's."""
    from mirror_sd import load_pair
    from mirror_sd.tools.host_ops import count_ops, replay_outside_the_count

    monkeypatch.setattr(Stage, "replay", replay_outside_the_count(Stage.replay))
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on",
                     target_device="cpu", draft_device="cpu")  # the count's own test: the host's work
    on_stages = count_ops(pair, "vanilla", 12, prompt="t1 t2 t3", raw=True)
    pair.graphs = "off"
    plain = count_ops(pair, "vanilla", 12, prompt="t1 t2 t3", raw=True)
    assert on_stages["steps"] == plain["steps"] == 11
    assert 0 < on_stages["ops_per_step"] < 30 < plain["ops_per_step"]


def test_host_samples_charges_the_decoding_threads_time_to_the_engines_lines(tiny_dirs):
    """mirror_sd/tools/host_samples.py: every sample of the decoding thread goes to the innermost line of
    mirror_sd/ on its stack (here, on the CPU, mostly a wait for the lane's worker), or to
    "(outside)" for a stack without one (this test's own frame); the shares add up to 1."""
    import re
    import sys

    from mirror_sd import load_pair
    from mirror_sd.tools.host_samples import OUTSIDE, innermost_engine_line, sample_method

    assert innermost_engine_line(sys._getframe()) == OUTSIDE
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), target_device="cpu",
                     draft_device="cpu")
    table = sample_method(pair, "vanilla", ["t1 t2 t3", "t4 t5"], 12, dict(raw=True), period_s=0.0005, top=5)
    assert abs(table.share.sum() - 1) < 0.01 and (table.ms_per_step >= 0).all()
    lines = table.line.iloc[:-1]
    assert lines.iloc[0] != OUTSIDE and all(re.fullmatch(r"[\w/]+\.py:\d+ \w+", x) for x in lines if x != OUTSIDE)
