"""Every stage body can be captured as a CUDA graph: it never reads a number back to the host, and
a run of it over padding only (warm-up, capture) writes scratch slots only.

A CUDA graph records kernels; an operation whose result the host must read first (``.item()``,
``.tolist()``, a tensor's truth value, a boolean mask's indexing: ``nonzero``, a repeat by a
tensor) synchronises, which a capture refuses, and would make the recorded shapes depend on the
data. On the CPU no capture runs, so this checks each kind of stage's body, run on a real window,
for those operations (the GPU's capture itself runs in tests/test_cuda.py and gpu-check). It runs
them twice: on the CPU, and on PyTorch's ``meta`` device standing for the GPU, where a host tensor
copied in, used as an index or mixed into an operation, and any copy back to the host, show.
"""
import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.methods.mirror import exit_reader
from mirror_sd.models.chain_draft import ChainDraft
from mirror_sd.models.channel import Channel, TokenChannel
from mirror_sd.models.eagle import EagleHead, HeadStages
from mirror_sd.models.eagle_tree import TreeDraft
from mirror_sd.models.eagle_verify import TreeVerify
from mirror_sd.models.forwards import FULL, forward, stage_cache
from mirror_sd.models.rollout import Rollouts
from mirror_sd.models.capture_check import CaptureCheck, CaptureUnsafe
from mirror_sd.models.stages import Layout
from mirror_sd.models.stream_draft import StreamDraft
from mirror_sd.models.streams import StreamConfig, Streams

@pytest.fixture(scope="module")
def pair(tiny_dirs):
    return load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]), target_device="cpu",
                     draft_device="cpu")


@pytest.fixture(scope="module")
def meta_pair(tiny_dirs):
    """The same pair with its models on the ``meta`` device: tensors of shapes without data."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]), target_device="cpu",
                     draft_device="cpu")
    for model in (pair.target, pair.draft):
        model.to("meta")
        if model.vocab_map is not None:  # loaded onto the model's device: on a GPU, there
            model.vocab_map = model.vocab_map.to("meta")
    return pair


def loaded_stages(pair):
    """(name, a stage of each kind loaded with a real window, as its run would load it)."""
    target, draft, V = pair.target, pair.draft, pair.target.args.vocab_size
    torch.manual_seed(0)
    head = EagleHead.from_target(target, torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 11, 13]), (1,)).eval()
    streams = Streams(target.args, StreamConfig(num_streams=3, stream_layers=1, rank=4)).attach(target)
    specs = dict(tree_draft=TreeDraft(3, 3, 8, early=True), tree_verify=TreeVerify((1,), hidden_at=1),
                 channel=TokenChannel(1, 3, exit_reader(pair), V), rollouts=Rollouts(8, 2, 3, 3, V),
                 chain=ChainDraft(3, V), chain_as_tree=ChainDraft(3, V, as_tree=True),
                 stream_draft=StreamDraft(streams, 3, 2, 4))
    caches = dict(tree_draft=stage_cache({}, head, 100, [specs["tree_draft"]], stage_set=HeadStages),
                  **{k: stage_cache({}, target, 100, [FULL, specs[k]])
                     for k in ("tree_verify", "channel", "stream_draft")},
                  **{k: stage_cache({}, draft, 100, [FULL, specs[k]]) for k in ("rollouts", "chain", "chain_as_tree")})
    for name, cache in caches.items():
        model = cache.stages.model
        if name != "tree_draft":
            forward(model, torch.tensor([[1, 5, 2, 9]]), cache)
        else:
            cache.length = 4
    d = target.args.hidden_size
    stage = {name: caches[name].stages.stage(specs[name].name, w) for name, w in
             dict(tree_draft=4, tree_verify=8, channel=4, rollouts=16, chain=2, chain_as_tree=2,
                  stream_draft=4).items()}
    with torch.inference_mode():  # each loaded as its run loads it (by hand where its run replays at once)
        stage["tree_draft"].load_pairs([[3, 4]], None, None, torch.randn(1, 2, d), torch.randn(1, 2, d))
        stage["tree_verify"].tree[:, :4].copy_(torch.tensor([[7, 3, 9, 2], [0, 1, 1, 2], [0, 0, 0, 1]]))
        stage["tree_verify"].window.fill_(Layout(4, 4).code)
        stage["channel"].load([[7, 3, 9]])
        rollouts = stage["rollouts"]
        rollouts.x[0, :3] = torch.tensor([7, 3, 9])
        rollouts.channel[:3] = Channel.of(torch.randint(0, 16, (3, 3)), torch.randn(3, 3), torch.randn(2)).packed
        rollouts.channel_rows.fill_(3)
        rollouts.window.fill_(Layout(4, 3).code)
        stage["chain"].load([[7]])
        stage["chain_as_tree"].load([[7]])
        stage["stream_draft"].h0.normal_()
        stage["stream_draft"].window.fill_(Layout(4, 1).code)
    return [*stage.items(), ("plain stage", caches["chain"].stages.stage("full", 4))]


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_no_stage_body_reads_a_number_back_or_copies_a_host_value(request, device):
    """Run outside inference mode: there PyTorch reads a 0-d index tensor's value through the
    dispatcher on the CPU too (inside, it reads a CPU tensor's memory directly, unseen)."""
    stages = loaded_stages(request.getfixturevalue("pair" if device == "cpu" else "meta_pair"))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    stages[-1][1].load(torch.tensor([[3, 4, 5]]), torch.tensor([[4, 5, 5]]), tree)  # the plain stage: a tree
    verify = next(stage for name, stage in stages if name == "tree_verify")

    def from_a_draft():  # the verify stage again, its rows from a draft's fields (run_drafted)
        verify.drafted[:, :3].copy_(torch.tensor([[3, 9, 2], [-1, 0, 0], [1, 2, 2], [-0.1, -0.5, -0.7]]))
        verify.from_draft.fill_(True)
        return verify.body

    unsafe = {}
    for name, load in [*((name, lambda stage=stage: stage.body) for name, stage in stages),
                       ("tree_verify from a draft", from_a_draft)]:
        body = load()  # loading copies from the host; the body must not
        try:
            with torch.no_grad(), CaptureCheck():
                body()
        except CaptureUnsafe as e:
            unsafe[name] = str(e)
    assert not unsafe


def test_the_check_catches_what_a_capture_refuses():
    x, i = torch.zeros(3, 3), torch.arange(3)
    for unsafe in (lambda: x[x > 0], lambda: x.sum().item(), lambda: x[torch.tensor(1).view(())],
                   lambda: x.__setitem__((i, i), 1.0)):
        with torch.no_grad(), pytest.raises(CaptureUnsafe), CaptureCheck():  # the check catches them
            unsafe()
    with torch.no_grad(), CaptureCheck():  # and lets pass what a capture records: a fill, a host scalar operand
        x[:, 0] = 1.0
        x.mul_(torch.tensor(0.5))
    x = torch.zeros(3, 3, device="meta")  # standing for the GPU: copies between it and the host show
    for unsafe in (lambda: x + torch.tensor([1.0, 2.0, 3.0]).to(x.device), lambda: x[torch.tensor([0, 1])],
                   lambda: x.tolist(), lambda: x.cpu()):
        with torch.no_grad(), pytest.raises(CaptureUnsafe), CaptureCheck():
            unsafe()
    with torch.no_grad(), CaptureCheck():
        x[:, 0] = 1.0
        x.mul_(torch.tensor(0.5)).add_(torch.arange(3, device="meta"))


def test_a_run_over_padding_writes_scratch_slots_only(pair):
    """Warm-up, capture and the replays timed at capture run a stage over padding only: every kind
    of stage must then leave every real slot of its cache as it was."""
    for name, stage in loaded_stages(pair):
        cache = stage.cache
        with torch.inference_mode():
            cache.kv.normal_()
            before = cache.kv[:, :, :, :, :cache.max_slots].clone()
            stage.load_padding()
            stage.body()
        assert torch.equal(cache.kv[:, :, :, :, :cache.max_slots], before), name


@pytest.mark.parametrize("method,options", [("sd", dict(gamma=3)), ("eagle", {}), ("ss", dict(gamma=3)),
                                            ("mirror", dict(exit_layer=1))])
def test_a_one_stage_forward_that_fails_to_capture_is_refused_and_its_method_goes_on(
        tiny_dirs, monkeypatch, method, options):
    """As on a GPU whose capture of a one-stage forward fails: a warning names it, the set refuses it
    (not named again), and the method commits vanilla's tokens an operation at a time around the
    stages that did capture (here the plain stages' "capture" does nothing: no GPU)."""
    from mirror_sd import generate
    from mirror_sd.models.eagle import attach_head
    from mirror_sd.models.exit_head import attach_exit_head, new_exit_head
    from mirror_sd.models.stages import OwnStage, Stage, Stages

    def capture(stage, pool=None, stream=None, check=False):
        if type(stage) is not Stage and not type(stage).__name__.startswith("Head"):  # a one-stage forward's
            raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(Stage, "capture", capture)
    monkeypatch.setattr(Stage, "time_replays", lambda stage: 1.0)
    monkeypatch.setattr(Stage, "time_launch", lambda stage: (0.01, 1.1))
    monkeypatch.setattr(Stages, "__init__", _graphs_on_the_cpu(Stages.__init__))
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")
    pair.queue_steps = "on"  # Mirror-SD's steps as on a GPU: the correction's stage too
    torch.manual_seed(0)
    attach_head(pair, EagleHead.from_target(pair.target, torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 11, 13])).eval())
    pair.streams = Streams(pair.target.args, StreamConfig(num_streams=3, stream_layers=1, rank=4)).attach(pair.target)
    pair.attached_streams = True
    attach_exit_head(pair, new_exit_head(pair.target, 1, rank=4))
    expected = generate(pair, "t1 t2 t3", method="vanilla", max_new_tokens=12, raw=True).token_ids
    with pytest.warns(UserWarning, match="could not be captured as a CUDA graph"):
        out = generate(pair, "t1 t2 t3", method=method, max_new_tokens=12, raw=True, **options)
    assert out.error is None, out.error
    assert out.token_ids == expected and "note" not in out.trace.meta, out.trace.meta.get("note")
    refused = {name for stages in pair.stage_sets.values() for name in stages.refused}
    assert refused and not any(isinstance(kind, OwnStage) for s in pair.stage_sets.values() for kind in s.kinds.values())
    monkeypatch.setattr(Stage, "capture", lambda *a, **k: pytest.fail("a refused forward's capture was tried again"))
    again = generate(pair, "t1 t2 t3", method=method, max_new_tokens=12, raw=True, **options)  # no capture tried
    assert again.error is None and again.token_ids == expected


def _graphs_on_the_cpu(init):
    """Stages.__init__ with ``graphs`` on although the model is on the CPU (capture patched out)."""
    def patched(self, model, max_slots, batch=1, graphs=None, stream=None):
        init(self, model, max_slots, batch, False, stream)
        self.graphs = True
    return patched
