"""A target and a draft model, their shared tokenizer and the lanes they run on."""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..devices import Lane, make_lanes, on_cpu_worker, shard_lane
from ..errors import MirrorSDError
from . import auto_dtype, exact
from .add_ons import attach_add_on
from .exit_draft import PREFIX as EXIT_DRAFT, exit_layer_of, load_exit_draft
from .linear import INT8
from .forwards import FULL, stage_cache
from .llama import Transformer
from .stages import Stages
from .loading import EMBEDDED_NAME, is_embedded, load_model, load_tokenizer, read_config, resolve_model_dir
from .sharding import needs_sharding, shard_over

# The default draft of the embedded target: the project's own, trained by `python -m mirror_sd.train
# draft` and shipped in the package (model card in its README.md). Other targets have no default
# draft: pass one.
EMBEDDED_DRAFT = Path(__file__).resolve().parents[1] / "assets" / "draft-smollm2-135m"
DEFAULT = "default"  # load_pair(draft=DEFAULT): the embedded target's draft, or none for other targets


class PairLock:
    """One generation at a time per pair (lanes and caches are not shared). Another thread waits its turn;
    the thread that holds it, because a ``stream()`` it started is paused between steps, gets an error
    instead of waiting for itself forever."""

    def __init__(self):
        self._lock = threading.Lock()
        self._holder: int | None = None

    def __enter__(self):
        if self._holder == threading.get_ident():
            raise MirrorSDError("this model pair is still decoding a stream() started in this thread: read it to "
                                "the end or close it (generator.close()) before starting another generation")
        self._lock.acquire()
        self._holder = threading.get_ident()
        return self

    def __exit__(self, *exc):
        self._holder = None
        self._lock.release()


@dataclass
class ModelPair:
    target: Transformer
    draft: Transformer | None
    tokenizer: object
    target_lane: Lane
    draft_lane: Lane
    target_name: str
    draft_name: str | None
    eos_ids: frozenset[int]
    draft_dir: Path | None = None  # the draft's folder (where its trained streams live, if any)
    dtype: auto_dtype.Choice | None = None  # the dtype the pair runs in and why (dtype="auto": models/auto_dtype.py)
    lock: PairLock = field(default_factory=PairLock, repr=False)
    # Add-ons, loaded or built on first use:
    streams: object = field(default=None, repr=False)  # the target's speculative streams (ss; models/streams.py)
    one_forward_streams: object = field(default=None, repr=False)  # ... trained without the next-token input
    attached_streams: bool = field(default=False, repr=False)  # streams came from use_streams, not the package
    draft_streams: object = field(default=None, repr=False)  # the draft's speculative streams (drafting/streamed.py)
    early_exit_rows: torch.Tensor | None = field(default=None, repr=False)  # Mirror-SD's exit head rows
    early_exits: dict = field(default_factory=dict, repr=False)  # Mirror-SD: (exit head, rows?) -> its EarlyExit
    exit_heads: dict = field(default_factory=dict, repr=False)  # Mirror-SD: exit layer -> trained head (models/exit_head.py)
    add_ons: list = field(default_factory=list, repr=False)  # "kind: folder", each add-on attached (add_ons.py)
    loaded_drafts: dict = field(default_factory=dict, repr=False)  # use_draft: name -> (model, name, folder)
    graphs: str = "auto"  # fixed-shape stages: "on", "off", or "auto" (on for CUDA lanes); see new_cache
    buckets: str = "cheapest"  # a stage's window: at the "cheapest" bucket timed at capture, or the "smallest"
    kernels: str = "tuned"  # a stage's operations: "tuned" (the fastest, at capture; models/tuning.py) or "default"
    # Mirror-SD's steps queued on the lanes' streams (executors.executor_for): "on" (on CPU lanes: the
    # phases in turn, the reference order the tests and research/ run), "off", or "auto" (on CUDA lanes)
    queue_steps: str = "auto"
    stage_sets: dict = field(default_factory=dict, repr=False)  # model -> its Stages (models/forwards.py)

    @property
    def embedded_target(self) -> bool:
        return self.target_name == EMBEDDED_NAME

    @property
    def context_length(self) -> int:
        return self.target.args.max_position_embeddings

    def encode(self, prompt: str | list[dict], raw: bool = False) -> list[int]:
        """Token ids of a prompt (a string, or a list of chat messages): through the chat template,
        or as plain text (messages joined by newlines) when raw=True or the tokenizer has none."""
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if raw or not has_template:
            text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
            return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)
        return list(encoded["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def use_draft(self, draft: str | None):
        """Swap in another draft (a folder, a hub id, "self:N", "exit:N" or None), loaded on the draft lane in the
        target's dtype; drafts loaded before are kept, so swapping back costs nothing. Add-ons built for
        the old draft (its streams, mirror's early-exit head rows) are dropped."""
        loaded = self.loaded_drafts
        loaded.setdefault(self.draft_name, (self.draft, self.draft_name, self.draft_dir))
        if draft not in loaded:
            target_dir = resolve_model_dir(self.target_name)
            if draft is not None and draft.startswith(EXIT_DRAFT):  # needs the pair's exit heads
                loaded[draft] = on_cpu_worker(self._load_exit_draft, draft, target_dir), draft, None
            else:
                loaded[draft] = on_cpu_worker(_load_draft, draft, target_dir, self.tokenizer, self.draft_lane,
                                              self.target.dtype, self.target.model.embed_tokens.weight)
        self.draft, self.draft_name, self.draft_dir = loaded[draft]
        self.draft_streams = self.early_exit_rows = None
        self.early_exits = {}

    def _load_exit_draft(self, draft: str, target_dir: Path) -> Transformer:
        """``exit:N``: the target's first N layers through this pair's exit head for layer N
        (models/exit_draft.py), over the shipped draft's rows for the embedded target."""
        from .exit_head import available_exit_head

        layer = exit_layer_of(draft, self.target.num_layers)
        model = load_exit_draft(draft, available_exit_head(self, layer), self.target, target_dir,
                                EMBEDDED_DRAFT if self.embedded_target else None, self.draft_lane.device,
                                self.target.dtype)
        return fp32_down_projections(model)

    @property
    def int8_drafting(self) -> bool:
        """Whether drafting work on CPU lanes multiplies by int8 weight copies (models/linear.py)."""
        return self.target_lane.int8_drafting or self.draft_lane.int8_drafting

    @int8_drafting.setter
    def int8_drafting(self, on: bool):
        for lane in (self.target_lane, self.draft_lane):
            lane.int8_drafting = bool(on) and lane.device.type == "cpu" and INT8

    def lane_of(self, model: Transformer) -> Lane:
        """The lane a model runs on: the target's, or the draft lane for any draft."""
        return self.target_lane if model is self.target else self.draft_lane

    def stages_on(self, model: Transformer, lane: Lane | None = None) -> bool:
        """Whether runs of ``model`` (on ``lane``; None: ``lane_of(model)``) go through fixed-shape
        stages: graphs "on", or "auto" on a CUDA lane; never for a model sharded over devices."""
        lane = lane or self.lane_of(model)
        on = self.graphs == "on" or (self.graphs == "auto" and lane.device.type == "cuda")
        return on and not model.layer_devices

    def new_cache(self, model: Transformer, slots: int, ranges=(FULL,), lane: Lane | None = None,
                  stage_set: type = Stages):
        """A KV cache of at least ``slots`` slots for a run of ``model`` (the target or the draft;
        another model, such as an EAGLE head, names its ``lane`` and its ``stage_set`` class), for
        the forwards of models/forwards.py. With stages on (``stages_on``) it is the cache of the
        model's stage set, whose stages for the layer ``ranges`` the run uses ((a, b, head);
        default: the full forward) are made now, before any step: on a CUDA lane that is when they
        are captured as CUDA graphs, with a progress bar. Otherwise a plain cache."""
        lane = lane or self.lane_of(model)
        if not self.stages_on(model, lane):
            return model.new_cache(slots)
        cache = stage_cache(self.stage_sets, model, slots, list(ranges), lane.stream,
                            _capture_bar(lane) if lane.device.type == "cuda" else None, stage_set,
                            tuned_kernels=self.kernels == "tuned")
        cache.stages.cheapest = self.buckets == "cheapest"
        return cache

    def describe(self) -> dict:
        """Models and lanes, for traces and reports."""
        return dict(target=self.target_name, draft=self.draft_name, dtype=str(self.dtype or self.target.dtype),
                    int8_drafting=self.int8_drafting,
                    graphs=self.graphs, buckets=self.buckets, kernels=self.kernels,
                    target_lane=self.target_lane.label, draft_lane=self.draft_lane.label,
                    target_layers=self.target.num_layers, add_ons=list(self.add_ons),
                    draft_layers=self.draft.num_layers if self.draft is not None else None,
                    target_parameters=own_parameters(self.target),
                    draft_parameters=own_parameters(self.draft, self.target) if self.draft is not None else None)


def own_parameters(model: Transformer, shared_with: Transformer | None = None) -> int:
    """How many parameters ``model`` holds, less those it shares with ``shared_with`` (a draft that reads
    the target's embedding does not count it again): the size a model card gives."""
    shared = {id(p) for p in shared_with.parameters()} if shared_with is not None else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in shared)


def load_pair(target: str | None = None, draft: str | None = DEFAULT, target_device: str | None = None,
              draft_device: str | None = None, dtype: str | torch.dtype | None = "auto",
              int8_drafting: bool = True, graphs: str = "auto", buckets: str = "cheapest",
              kernels: str = "tuned", add_ons: list[str | Path] = ()) -> ModelPair:
    """Load a target and a draft on their lanes. With no arguments: the embedded default pair.

    target: None / "smollm2-135m-instruct" (embedded), a Hugging Face id, or a local folder.
    draft: the same kinds of name, "self:N" (the target's first N layers), "exit:N" (those layers read
    by the exit head trained for layer N: models/exit_draft.py), None for no draft, or "default": the
    project's draft for the embedded target, and no draft for any other target.
    devices: "cpu", "cuda[:N]", "mps", "npu"; None picks this machine's defaults (see devices.py).
    target_device may list several GPUs ("cuda:0,cuda:1") to shard a target too big for one
    (models/sharding.py); with None, a target too big for the first GPU is sharded over all of them.
    dtype: "auto" (or None): bf16 on a CPU that computes it natively, where the exact bf16 target
    checks out at load and runs faster than fp32; fp32 everywhere else (models/auto_dtype.py). Or
    "fp32", "bf16", "fp16" (or a torch dtype). A bf16 target on a CPU runs exact (models/exact.py):
    every method commits vanilla's tokens at temperature 0. ``pair.dtype`` says which ran and why.
    int8_drafting: drafting work on CPU lanes (the draft model, the EAGLE head, the speculative
    streams) multiplies by int8 weight copies; the target verifies in its own dtype: lossless
    (models/linear.py). ``pair.int8_drafting`` changes it later.
    graphs: "auto" (on for CUDA lanes, off elsewhere), "on" or "off": whether methods run their
    forwards as fixed-shape stages (models/stages.py), captured as CUDA graphs on a CUDA lane and
    run eagerly elsewhere (how the CPU tests that path). ``pair.graphs`` changes it later.
    buckets: "cheapest" (a window runs at the captured bucket that holds it and replayed fastest when
    captured) or "smallest" (always the smallest that holds it); models/stages.py says why.
    kernels: "tuned" (each operation a stage captures on a GPU, from its products to its attention,
    runs the formulation measured fastest for its shapes; models/tuning.py) or "default"
    (PyTorch's calls, as outside a stage). It applies to stages captured from then on
    (``pair.kernels`` changes it).
    add_ons: folders of add-ons trained for the target (``python -m mirror_sd.train eagle``,
    ``exit-head`` or ``ss``): its EAGLE head, early-exit heads or speculative streams (models/add_ons.py).
    The embedded target's ship with the package and need none.
    Loading runs on the CPU lanes' shared worker thread (devices.on_cpu_worker says why).
    """
    for name, value, choices in (("graphs", graphs, GRAPHS), ("buckets", buckets, BUCKETS),
                                 ("kernels", kernels, KERNELS)):
        if value not in choices:
            raise MirrorSDError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    exit_draft = draft if isinstance(draft, str) and draft.startswith(EXIT_DRAFT) else None
    pair = on_cpu_worker(_load_pair, target, None if exit_draft else draft, target_device, draft_device, dtype)
    pair.int8_drafting = int8_drafting
    pair.graphs, pair.buckets, pair.kernels = graphs, buckets, kernels
    for folder in add_ons:
        attach_add_on(pair, folder)
    if exit_draft:  # its head may be an add-on: loaded last
        pair.use_draft(exit_draft)
    return pair


GRAPHS = ("auto", "on", "off")
BUCKETS = ("cheapest", "smallest")
KERNELS = ("tuned", "default")


def _capture_bar(lane: Lane):
    """progress(total) for stage_cache: a tqdm bar over the CUDA graphs a lane captures."""
    from tqdm.auto import tqdm

    def progress(total: int):
        bar = tqdm(total=total, desc=f"capturing CUDA graphs ({lane.name} lane)", unit="graph", leave=False)

        def step(done: int, total: int):
            bar.update(1)
            if done == total:
                bar.close()
        return step
    return progress


def _load_pair(target, draft, target_device, draft_device, dtype) -> ModelPair:
    target_lane, draft_lane = make_lanes(target_device, draft_device)
    target_dir = resolve_model_dir(target)
    load = lambda dtype: _load_target(target_dir, target_lane, dtype, may_shard=target_device is None)  # noqa: E731
    tokenizer = functools.cache(lambda: load_tokenizer(target_dir))  # after the target, which names its own faults
    if dtype in (None, AUTO):
        choice, target_model = auto_dtype.choose(load, tokenizer, [target_lane.device, draft_lane.device])
    else:
        choice = auto_dtype.Choice(_dtype(dtype), "asked for")
        target_model = load(choice.dtype)
    dtype, target_config, tokenizer = choice.dtype, read_config(target_dir), tokenizer()
    draft_model, draft_name, draft_dir = None, None, None
    embedded = is_embedded(target)
    if draft == DEFAULT:
        draft = str(EMBEDDED_DRAFT) if embedded else None
    if draft:
        draft_model, draft_name, draft_dir = _load_draft(draft, target_dir, tokenizer, draft_lane, dtype,
                                                         target_model.model.embed_tokens.weight)
    eos = {tokenizer.eos_token_id} | set(_as_list(getattr(target_config, "eos_token_id", None)))
    return ModelPair(target_model, draft_model, tokenizer, target_lane, draft_lane,
                     target_name=EMBEDDED_NAME if embedded else target, draft_name=draft_name,
                     eos_ids=frozenset(i for i in eos if i is not None), draft_dir=draft_dir, dtype=choice)


AUTO = "auto"  # dtype: models/auto_dtype.py


def _load_target(target_dir: Path, lane: Lane, dtype: torch.dtype, may_shard: bool) -> Transformer:
    """The target on its lane; sharded over the lane's GPUs when it has several, or (may_shard) over
    every GPU when it is too big for its own. In bf16 on a CPU, with exact rows (models/exact.py)."""
    gpus = torch.cuda.device_count() if lane.device.type == "cuda" else 0
    if len(lane.devices) == 1 and not (may_shard and gpus > 1):
        model, _ = load_model(target_dir, lane.device, dtype)
        if dtype == torch.bfloat16 and lane.device.type == "cpu":  # rows that verify as vanilla's
            exact.convert(model)
        return model
    model, _ = load_model(target_dir, torch.device("cpu"), dtype)  # placed once its size is known
    if len(lane.devices) == 1:
        if not needs_sharding(model, lane.device):
            return model.to(lane.device)
        shard_lane(lane, [torch.device("cuda", i) for i in range(gpus)])
    return shard_over(model, lane.devices)


def _load_draft(draft: str, target_dir: Path, tokenizer, lane: Lane, dtype, target_embedding):
    dtype = _dtype(dtype)
    if draft.startswith("self:"):
        layers = _self_draft_layers(draft, target_dir)
        model, _ = load_model(target_dir, lane.device, dtype, num_layers=layers)
        return fp32_down_projections(model), draft, None
    draft_dir = resolve_model_dir(draft)
    check_same_vocabulary(tokenizer, load_tokenizer(draft_dir), draft)
    model, _ = load_model(draft_dir, lane.device, dtype, target_embedding=target_embedding)
    name = EMBEDDED_DRAFT.name if draft_dir == EMBEDDED_DRAFT else draft
    return fp32_down_projections(model), name, draft_dir


def fp32_down_projections(draft: Transformer) -> Transformer:
    """Keep the draft's MLP down projections in fp32 when drafting multiplies in int8 (their input,
    the gated activation, has outlier channels: models/linear.py has the measurement)."""
    for layer in draft.model.layers:
        layer.mlp.down_proj.int8 = False
    return draft


def _self_draft_layers(draft: str, target_dir: Path) -> int:
    from .loading import read_config

    total = read_config(target_dir).num_hidden_layers
    try:
        layers = int(draft.split(":", 1)[1])
    except ValueError:
        layers = -1
    if not 1 <= layers < total:
        raise MirrorSDError(f"draft {draft!r}: 'self:N' needs 1 <= N < {total} (the target's layer count)")
    return layers


def check_same_vocabulary(target_tokenizer, draft_tokenizer, draft_name: str):
    """Refuse a draft whose tokens mean something else: verification compares token ids."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return
    differ = sorted(set(target_vocab.items()) ^ set(draft_vocab.items()), key=lambda kv: kv[1])
    example = differ[0] if differ else None
    raise MirrorSDError(
        f"draft {draft_name!r} cannot be used with this target: its tokenizer differs "
        f"({len(draft_vocab)} vs {len(target_vocab)} tokens, {len(differ)} (token, id) entries differ, "
        f"e.g. {example!r}); speculative decoding needs a draft that shares the target's vocabulary")


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16,
             "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if dtype not in names:
        raise MirrorSDError(f"unknown dtype {dtype!r}: use one of {AUTO}, {', '.join(names)}")
    return names[dtype]


def _as_list(x):
    return x if isinstance(x, (list, tuple)) else [x]
