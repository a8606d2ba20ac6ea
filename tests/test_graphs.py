"""Methods on fixed-shape stages (``graphs="on"``), on the CPU, where the stages run eagerly.

With graphs on, the methods' target and draft forwards go through models/forwards.py onto the
stages of models/stages.py: every method must still commit exactly vanilla's tokens at T = 0
(vanilla with graphs off is the reference), the stages must actually run, and the seam's forwards
must give the plain forward's logits. Tiny models only: a few seconds per test.
"""
import pytest
import torch

from mirror_sd import generate, load_pair
from mirror_sd.devices import on_cpu_worker, single_threaded
from mirror_sd.errors import MirrorSDError
from mirror_sd.models.eagle import EagleHead, attach_head
from mirror_sd.models.exit_head import attach_exit_head, new_exit_head
from mirror_sd.models.forwards import FULL, LayerRange, forward, layers, stage_cache, staged
from mirror_sd.models.linear import convert_to_int8
from mirror_sd.models.llama import KVCache
from mirror_sd.models.stages import MAX_WIDTH, StageCache, Stages, bucket
from mirror_sd.models.streams import StreamConfig, Streams

ATOL = 1e-4 if torch.cuda.is_available() else 1e-5  # TF32 and other kernels on a GPU
PROMPTS = ["t1 t2 t3", "t4 t4 t4 t4", "t15 t0 t7 t9 t2"]
LONG_PROMPT = " ".join(f"t{(7 * i + 3) % 16}" for i in range(70))  # more rows than the widest stage
TOKENS = 16
# INT8_NOTE: a test that holds a drafting module's stage to its plain forward converts it to fp32 first
# (a run converts it back): int8 products quantise a product's rows together, so padding rows move them


def random_streams(model, seed: int) -> Streams:
    """Three untrained streams on the model's top layer, made to act (their LoRA is zero at first)."""
    torch.manual_seed(seed)
    streams = Streams(model.args, StreamConfig(num_streams=3, stream_layers=1, rank=4))
    with torch.no_grad():
        for p in streams.lora_b.values():
            p.normal_(0, 0.1)
        streams.embeddings.normal_(0, 1.0)
    return streams.attach(model)


@pytest.fixture(scope="module")
def pair(tiny_dirs):
    """The tiny target and draft with graphs on, an EAGLE head reading an early feature, streams on
    the target (for ss, both forms) and on the draft (for sd and mirror's streams options), and an
    early-exit head at layer 1 (for mirror)."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")

    def add_ons():  # on the CPU worker: torch work on this thread would start an OpenMP pool here
        torch.manual_seed(0)
        head = EagleHead.from_target(pair.target, torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 11, 13]), (1,))
        torch.nn.init.normal_(head.fuse.weight, std=0.5)
        attach_head(pair, head.eval())
        pair.streams = pair.one_forward_streams = random_streams(pair.target, seed=1)
        pair.attached_streams = True
        pair.draft_streams = random_streams(pair.draft, seed=2)
        exit_head = new_exit_head(pair.target, 1, rank=4)
        torch.nn.init.normal_(exit_head.up.weight, std=0.5)
        attach_exit_head(pair, exit_head)
    on_cpu_worker(add_ons)
    return pair


def vanilla_tokens(pair, prompt: str) -> list[int]:
    """The reference: vanilla with graphs off."""
    pair.graphs = "off"
    try:
        return generate(pair, prompt, method="vanilla", max_new_tokens=TOKENS, raw=True).token_ids
    finally:
        pair.graphs = "on"


@pytest.fixture
def stage_runs(monkeypatch):
    """(model layers, stage name) -> how many windows ran on that stage; ("late", name) for a stage
    made outside ``capture_all`` (on CUDA: captured mid-run, maybe beside another lane's work)."""
    runs, run, stage, capture_all = {}, Stages.run, Stages.stage, Stages.capture_all

    def counted(self, name, x, *args, **kwargs):
        key = (self.model.num_layers, name)
        runs[key] = runs.get(key, 0) + 1
        return run(self, name, x, *args, **kwargs)

    def made(self, name, width):  # also how a stage that is not run by name is found (``run_drafted``)
        if not getattr(self, "capturing", False):
            runs.setdefault((self.model.num_layers, name), 0)
            if (name, bucket(width)) not in self._stages:
                runs[("late", name)] = 1
        return stage(self, name, width)

    def capturing(self, *args, **kwargs):
        self.capturing = True
        try:
            return capture_all(self, *args, **kwargs)
        finally:
            self.capturing = False
    monkeypatch.setattr(Stages, "run", counted)
    monkeypatch.setattr(Stages, "stage", made)
    monkeypatch.setattr(Stages, "capture_all", capturing)
    return runs


METHODS = [
    ("vanilla", {}, {"full"}),
    # sd: the draft's gamma forwards one stage (models/chain_draft.py); every window verified as a
    # tree (a chain: one path) on the tree verify stage (models/eagle_verify.py)
    ("sd", dict(gamma=3), {"full", "chain draft of 3 as a tree", "tree verify"}),
    ("sd", dict(gamma=3, streams=1), {"full", "layers 0-1", "layers 1-2 + head", "streams 1-2", "tree verify"}),
    ("sd", dict(gamma=3, streams=2), {"full", "layers 0-1", "layers 1-2 + head", "streams 1-2", "tree verify"}),
    ("sd", dict(gamma=3, tree=6, branching=2), {"full", "tree verify"}),  # the draft's tree levels; the target's
    # tree verify one stage (models/eagle_verify.py)
    ("mirror", dict(gamma=3, exit_layer=1, lookup=0, queue_steps="off"),  # on the lanes' threads: the token channel and
     {"full", "token channel: layers 0-1, trained early exit, top 4", "layers 1-2 + head",  # the rollouts
      "rollouts 16x3 from 4x4 candidates", "chain draft of 3"}),
    ("mirror", dict(gamma=3, exit_layer=1, lookup=0, queue_steps="on"),  # queued: the correction's too
     {"full", "token channel: layers 0-1, trained early exit, top 4", "layers 1-2 + head",
      "rollouts 16x3 from 4x4 candidates", "rollouts 1x3 from 4x1 candidates", "chain draft of 3"}),
    ("mirror", dict(gamma=3, exit_layer=1, tree=6, queue_steps="off"),  # tree windows: the prefix and suffix
     {"full", "layers 0-1", "trained early exit at 1", "layers 1-2 + head"}),  # under a tree mask
    ("mirror", dict(gamma=3, exit_layer=1, tree=6, queue_steps="on"),  # queued tree steps
     {"full", "layers 0-1", "trained early exit at 1", "layers 1-2 + head"}),
    ("mirror", dict(gamma=2, exit_layer=1, streams=1, branch_budget=4, lens=True),  # no head at the exit: the lens
     {"full", "layers 0-1", "early exit at 1", "layers 1-2 + head", "streams 1-2"}),
    ("eagle", dict(depth=3, top_k=3, total_tokens=8),  # the whole draft one stage (models/eagle_tree.py)
     {"layers 0-1", "features 1-2", "tree draft 3x3, 8 kept + early features",  # the verification one stage
      "tree verify, early features at [1]"}),  # too (models/eagle_verify.py); the prefill on layer ranges
    ("ss", dict(gamma=3, top_k=2, total_tokens=4),  # the streams' pass and candidates one stage (models/stream_draft.py)
     {"layers 0-1", "layers 1-2 + head", "stream draft 3x2, 4 kept", "tree verify, hidden states at 1"}),
    ("ss", dict(gamma=3, one_forward=1), {"layers 0-1", "layers 1-2 + head", "streams 1-2"}),  # after the main rows
]


def on_pair(pair, options: dict, monkeypatch) -> dict:
    """A METHODS row's options less the pair's own settings it names, which are set on ``pair``:
    ``queue_steps`` (Mirror-SD's steps queued?) and ``lens`` (no trained head at any exit layer)."""
    options = dict(options)
    monkeypatch.setattr(pair, "queue_steps", options.pop("queue_steps", "auto"))
    if options.pop("lens", False):
        monkeypatch.setattr(pair, "exit_heads", {})
    return options


@pytest.mark.parametrize("method,options,stages", METHODS, ids=[f"{m}-{o}" for m, o, _ in METHODS])
def test_every_method_on_stages_commits_vanillas_tokens(pair, stage_runs, monkeypatch, method, options, stages):
    options = on_pair(pair, options, monkeypatch)
    for prompt in PROMPTS:
        expected = vanilla_tokens(pair, prompt)
        stage_runs.clear()
        out = generate(pair, prompt, method=method, max_new_tokens=TOKENS, raw=True, **options)
        assert out.error is None and out.token_ids == expected, f"{method} {options} on {prompt!r}"
        assert {name for layers, name in stage_runs if layers != "late"} == stages  # the forwards it ran on stages
        assert not [name for layers, name in stage_runs if layers == "late"]  # each made before the first step
    assert len(set(expected)) > 1  # not a degenerate run


@pytest.mark.parametrize("method,options,plain", [
    ("eagle", dict(lookup=0), "verify_tree"), ("eagle", dict(lookup=8), "verify_tree"),
    ("ss", dict(gamma=3, top_k=2, total_tokens=4, lookup=0), "verify_tree"),
    ("ss", dict(gamma=3, top_k=2, total_tokens=4, lookup=8), "verify_tree"),
    ("sd", dict(gamma=3), "verify_tree")], ids=["eagle", "eagle-lookup", "ss", "ss-lookup", "sd"])
def test_a_step_on_stages_reads_the_host_once_unless_it_copies_from_the_context(pair, monkeypatch, method, options,
                                                                                plain):
    """On its one-stage draft and verification a greedy EAGLE, ss or sd (chain) step is queued on the
    lanes' streams and read once (methods/verify.py: draft_and_verify_on_stages): the tree or chain
    stays on the device between them, and both spans are recorded. A step that copies tokens from
    the context grafts them onto the tree on the host, so it reads the tree first (two reads), as
    an sd prompt longer than the widest stage does. All commit vanilla's tokens."""
    import importlib

    module = importlib.import_module(f"mirror_sd.methods.{method}")
    one_read, two_reads = [], []
    for name, calls in (("draft_and_verify_on_stages", one_read), (plain, two_reads)):
        counted = lambda *a, _f=getattr(module, name), _c=calls, **k: _c.append(a) or _f(*a, **k)  # noqa: E731
        monkeypatch.setattr(module, name, counted)
    steps = 0
    for prompt in PROMPTS:
        out = generate(pair, prompt, method=method, max_new_tokens=TOKENS, raw=True, **options)
        assert out.error is None and out.token_ids == vanilla_tokens(pair, prompt), prompt
        steps += sum(1 for step in out.trace.steps if step.index > 0)  # step 0: the prefill
        spans = {(span.step, span.kind) for span in out.trace.spans}
        assert all((step.index, kind) in spans for step in out.trace.steps[1:] for kind in ("draft", "verify"))
    assert len(one_read) + len(two_reads) == steps  # one verification per step
    if options.get("lookup", 0) == 0:
        assert one_read and not two_reads
    else:  # "t4 t4 t4 t4" repeats itself, so some steps copy from it
        assert one_read and two_reads


def every_module(pair) -> list:
    """Every module the methods run on ``pair``: both models, the EAGLE head, the exit heads, and the
    streams with each form of their layers (merged, and the int8 views that drafting runs)."""
    from mirror_sd.models.eagle import head_for
    from mirror_sd.models.streams import draft_streams, target_streams

    modules = [pair.target, pair.draft, head_for(pair), *pair.exit_heads.values(), *pair.early_exits.values()]
    for streams, model in ((target_streams(pair), pair.target), (draft_streams(pair), pair.draft)):
        layers = streams.layers_for(model, streams.first_layer, model.num_layers)
        modules += [streams, *streams.merged_layers(model), *layers]
    return modules


@pytest.mark.parametrize("method,options,stages", METHODS[1:], ids=[f"{m}-{o}" for m, o, _ in METHODS[1:]])
def test_every_method_commits_vanillas_tokens_with_the_other_tuned_kernels(pair, monkeypatch, method, options, stages):
    """Every product and attention the methods run, in every thread, in the formulation a GPU may
    tune them to (models/tuning.py): products with their sides swapped, attention with its key and
    value heads expanded, RMSNorm as PyTorch's fused op, q, k and v (and gate and up) as one product
    each; vanilla (the reference) in the default
    ones. The Triton kernels are checked per forward in tests/test_tuning.py (Triton's interpreter
    is too slow for whole runs)."""
    from mirror_sd.models import tuning

    other = {"swapped": 1.0, "expanded": 1.0, "fused": 1.0, "joined": 1.0,
             "cublas": 10.0, "sdpa": 10.0, "composite": 10.0, "separate": 10.0}

    def timer(fn):  # the Triton kernels "cannot run" here: their interpreter is too slow for whole runs
        if fn.__defaults__[0] not in other:
            raise RuntimeError("left out")
        return other[fn.__defaults__[0]]

    expected = {prompt: vanilla_tokens(pair, prompt) for prompt in PROMPTS}
    monkeypatch.setattr(tuning, "PLAN", {})
    monkeypatch.setattr(tuning, "TIMES", {})
    monkeypatch.setattr(tuning, "graph_us", timer)  # on CUDA, what a stage's capture tunes with
    monkeypatch.setattr(pair, "stage_sets", {})  # stages made afresh, so that CUDA captures them under this plan
    options = on_pair(pair, options, monkeypatch)
    with tuning.converted(on_cpu_worker(every_module, pair), tuning.Plan(timer)):  # whichever thread runs them
        for prompt in PROMPTS:
            out = generate(pair, prompt, method=method, max_new_tokens=TOKENS, raw=True, **options)
            assert out.error is None and out.token_ids == expected[prompt], f"{method} {options} on {prompt!r}"
    assert {op: name for (op, *_), name in tuning.PLAN.items()} == dict(
        product="swapped", attention="expanded", norm="fused", added_norm="separate", rotary="composite",
        rotary_store="separate", projections="joined", gated="joined")


@pytest.mark.parametrize("method,options", [("vanilla", {}), ("sd", dict(gamma=3)), ("mirror", dict(exit_layer=1)),
                                            ("eagle", {}), ("ss", dict(gamma=3)), ("ss", dict(gamma=3, one_forward=1))])
def test_a_prompt_longer_than_the_widest_stage_prefills_in_chunks(pair, stage_runs, method, options):
    expected = vanilla_tokens(pair, LONG_PROMPT)
    out = generate(pair, LONG_PROMPT, method=method, max_new_tokens=TOKENS, raw=True, **options)
    assert out.error is None and out.token_ids == expected
    assert stage_runs  # on stages, the prefill as two chunks


def test_graphs_option_picks_the_cache_and_is_in_the_trace(tiny_dirs, pair):
    with pytest.raises(MirrorSDError, match="graphs must be one of"):
        load_pair(target=str(tiny_dirs["target"]), draft=None, graphs="yes")
    plain = load_pair(target=str(tiny_dirs["target"]), draft=None, target_device="cpu")  # auto: off on the CPU
    assert plain.graphs == "auto" and not plain.stages_on(plain.target)
    assert type(plain.new_cache(plain.target, 40)) is KVCache
    cache = pair.new_cache(pair.target, 40)
    assert isinstance(cache, StageCache) and staged(pair.target, cache) is not None
    assert staged(pair.draft, cache) is None  # another model's stage cache: the plain forward
    out = generate(pair, "t1 t2", method="vanilla", max_new_tokens=2, raw=True)
    assert out.trace.meta["graphs"] == "on" and out.trace.meta["buckets"] == "cheapest"


def test_buckets_option_reaches_the_stage_sets(tiny_dirs, pair):
    with pytest.raises(MirrorSDError, match="buckets must be one of"):
        load_pair(target=str(tiny_dirs["target"]), draft=None, buckets="fastest")
    assert pair.new_cache(pair.target, 40).stages.cheapest
    pair.buckets = "smallest"
    try:
        cache = pair.new_cache(pair.target, 40)
        cache.stages.replay_ms["full"] = {1: 9.0, 2: 9.0, 4: 9.0, 8: 9.0, 16: 9.0, 32: 1.0, 64: 9.0}  # as if timed
        assert cache.stages.route("full", 5) == 8  # smallest: the times are not consulted
        out = generate(pair, "t1 t2", method="vanilla", max_new_tokens=2, raw=True)
        assert out.trace.meta["buckets"] == "smallest"
    finally:
        pair.buckets = "cheapest"
        pair.new_cache(pair.target, 40).stages.replay_ms.pop("full", None)
    assert pair.new_cache(pair.target, 40).stages.route("full", 5) == 8  # nothing timed on the CPU


def test_the_cli_passes_graphs_on(tiny_dirs, capsys):
    import json

    from mirror_sd.cli import main

    assert main(["generate", "--target", str(tiny_dirs["target"]), "--graphs", "on", "--method", "vanilla",
                 "--prompt", "t1 t2 t3", "--raw", "--max-new-tokens", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["metrics"]["new_tokens"] == 4
    assert main(["generate", "--graphs", "maybe", "--prompt", "x"]) == 2  # argparse's one line


# -- the seam's forwards against the plain ones ------------------------------------------------------
@pytest.fixture
def target(pair):
    with torch.inference_mode(), single_threaded():
        yield pair.target


def caches(model, slots=200, ranges=(FULL,)):
    """A plain cache and a stage cache, both holding the same 5-token prefix."""
    sets = {}
    plain, stage = model.new_cache(slots), stage_cache(sets, model, slots, list(ranges))
    prefix = torch.tensor([[1, 5, 9, 2, 7]], device=model.device)
    for cache in (plain, stage):
        forward(model, prefix, cache)
    return plain, stage


def test_forward_and_layers_on_stages_give_the_plain_logits(target):
    plain, stage = caches(target, ranges=[FULL, LayerRange(0, 1), LayerRange(1, lm_head=True)])
    at = dict(device=target.device)
    window, positions = torch.tensor([[4, 8, 2, 6]], **at), torch.tensor([[5, 6, 6, 7]], **at)
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool, **at)
    for kwargs in (dict(), dict(positions=positions, tree_mask=tree)):
        expected = forward(target, window, plain, commit=False, **kwargs)
        assert torch.allclose(forward(target, window, stage, commit=False, **kwargs), expected, atol=ATOL)
        h = layers(target, window, stage, LayerRange(0, 1), **kwargs)
        assert torch.allclose(layers(target, h, stage, LayerRange(1, lm_head=True), **kwargs), expected, atol=ATOL)
    over_every_slot = torch.ones(4, 9, dtype=torch.bool, **at).tril(5)  # [T, start + T]: causal
    last = layers(target, window, stage, FULL, tree_mask=over_every_slot, last=2)
    assert torch.allclose(last, forward(target, window, plain, commit=False)[:, -2:], atol=ATOL)
    assert stage.length == 5 and plain.length == 5


def test_wide_windows_run_in_chunks_or_on_the_plain_forward(target):
    plain, stage = caches(target)
    wide = torch.arange(MAX_WIDTH + 6, device=target.device)[None] % 16  # [1, 70]
    expected = forward(target, wide, plain, commit=False)
    assert torch.allclose(forward(target, wide, stage, commit=False), expected, atol=ATOL)  # 64 + 6 rows
    assert stage.length == 5
    tree = torch.ones(70, 70, dtype=torch.bool, device=target.device).tril()
    assert torch.allclose(forward(target, wide, stage, tree_mask=tree), expected, atol=ATOL)  # the plain forward
    assert stage.length == 75


def test_a_stage_set_grows_when_a_run_needs_more_slots(target):
    sets = {}
    small = stage_cache(sets, target, 100)
    assert small.max_slots == 512 and stage_cache(sets, target, 512) is small
    big = stage_cache(sets, target, 600)
    assert big is not small and big.max_slots == 1024 and big.length == 0


def test_stream_rows_on_their_stage_give_the_plain_logits_and_store_nothing(pair, target, stage_runs):
    streams = convert_to_int8(pair.streams, False)  # three streams on the target's top layer; fp32 (INT8_NOTE)
    plain, stage = caches(target, ranges=[FULL, LayerRange(streams.first_layer, streams=streams)])
    torch.manual_seed(3)
    h = torch.randn(1, 2, target.args.hidden_size, device=target.device)  # two main rows entering layer L0
    at = torch.tensor([[3, 4]], device=target.device)  # their main tokens' slots
    seen = torch.tensor([[[1, 1, 0, 1, 0], [1, 1, 1, 0, 1]]], dtype=torch.bool, device=target.device)  # [1, 2, 5]
    real = stage.k[:, :, :, :stage.max_slots].clone()
    for kwargs in (dict(), dict(positions=torch.tensor([[3, 3]], device=target.device), seen=seen)):
        expected = streams(target, plain, h, at, **kwargs)  # [1, 2, 3, head rows]
        assert torch.allclose(streams(target, stage, h, at, **kwargs), expected, atol=ATOL)
    assert stage_runs[(target.num_layers, f"streams {streams.first_layer}-{target.num_layers}")] == 2
    assert torch.equal(stage.k[:, :, :, :stage.max_slots], real) and stage.length == 5  # scratch slots only
    window = torch.tensor([[4, 8]], device=target.device)
    assert torch.allclose(forward(target, window, stage, commit=False), forward(target, window, plain, commit=False),
                          atol=ATOL)


def test_streams_after_main_rows_on_stages_give_the_plain_forwards_logits(pair, target, stage_runs):
    """forward_with_streams (ss --one-forward 1, sd --streams 2): on a stage cache the main rows' stages
    then the stream rows' stage give the plain forwards' main and stream logits, and store the main
    rows' keys and values where the plain forwards do."""
    from mirror_sd.models.streams import forward_with_streams, stream_ranges

    streams = convert_to_int8(pair.one_forward_streams, False)  # fp32 (INT8_NOTE)
    plain, stage = caches(target, ranges=stream_ranges(streams))
    ids = torch.tensor([[3, 9, 4, 4]], device=target.device)  # a root and three tree nodes
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)  # [4, 4]
    positions = torch.tensor([[5, 6, 6, 7]], device=target.device)
    for kwargs in (dict(), dict(rows=[0, 1, 3], positions=positions, tree_mask=tree)):
        main, ahead = forward_with_streams(target, streams, ids, plain, 3, **kwargs)  # [1, 4, V], [1, R, 3, .]
        stage_runs.clear()
        on_stages = forward_with_streams(target, streams, ids, stage, 3, **kwargs)
        assert torch.allclose(on_stages[0], main, atol=ATOL) and torch.allclose(on_stages[1], ahead, atol=ATOL)
        assert {name for _, name in stage_runs} == {"layers 0-1", "layers 1-2 + head", "streams 1-2"}
        assert stage.length == plain.length == 5  # the caller commits
        assert torch.allclose(stage.k[:, :, :, :9], plain.k[:, :, :, :9], atol=ATOL)  # the main rows' keys


def test_other_streams_on_the_same_model_get_stages_of_their_own(pair, target):
    other = on_cpu_worker(random_streams, target, 5)
    plain, stage = caches(target, ranges=[LayerRange(pair.streams.first_layer, streams=pair.streams)])
    h = torch.ones(1, 1, target.args.hidden_size, device=target.device)
    at = torch.tensor([[4]], device=target.device)
    pair.streams(target, stage, h, at)
    assert torch.allclose(other(target, stage, h, at), other(target, plain, h, at), atol=ATOL)


def test_the_eagle_head_on_its_stages_gives_the_plain_features(pair, target, stage_runs):
    from mirror_sd.models.eagle import HeadStages, head_for

    head, d = convert_to_int8(head_for(pair), False), target.args.hidden_size  # fp32 (INT8_NOTE)
    plain, stage = head.new_cache(100), stage_cache({}, head, 100, [], stage_set=HeadStages)
    torch.manual_seed(4)
    at = dict(device=head.device)
    feats, early = torch.randn(1, 5, d, **at), torch.randn(1, 5, len(head.early_layers) * d, **at)  # five pending pairs
    ids = torch.tensor([[3, 1, 4, 1, 5]], **at)
    tree = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1, 0, 1]],
                        dtype=torch.bool, **at)  # three frontier nodes over the five slots and themselves
    for cache in (plain, stage):
        first = head(feats, ids, cache, early=early)  # [1, 5, d]
        level = head(first[:, [4, 4, 3]], torch.tensor([[2, 7, 8]], **at), cache, torch.tensor([[5, 5, 6]], **at), tree)
        cache.outputs = first, level
    for got, expected in zip(stage.outputs, plain.outputs):
        assert torch.allclose(got, expected, atol=ATOL)
    assert stage.length == plain.length == 8
    assert {name for _, name in stage_runs} == {"pairs", "pairs + early features"}


def test_the_token_channel_on_its_stages_gives_the_plain_candidates(pair, target):
    from conftest import channel_of
    from mirror_sd.methods.mirror import target_ranges

    for head in (None, pair.exit_heads[1]):
        plain, stage = caches(target, ranges=target_ranges(pair, 1, head))
        got, expected = (channel_of(pair, cache, [4, 8, 2], 1, 3, head) for cache in (stage, plain))
        assert torch.allclose(got[0], expected[0], atol=ATOL)  # the prefix's hidden states
        for a, b in zip(got[2:], expected[2:]):
            assert torch.allclose(a, b, atol=ATOL)  # the top-kappa log-probs, and the window's
        apart = torch.ones_like(expected[1], dtype=torch.bool)  # candidates whose log-prob no neighbour ties
        gaps = (expected[2][:, :-1] - expected[2][:, 1:]).abs() > 10 * ATOL
        apart[:, :-1] &= gaps
        apart[:, 1:] &= gaps
        assert torch.equal(got[1][apart], expected[1][apart])  # the top-kappa ids
        assert stage.length == plain.length == 5
