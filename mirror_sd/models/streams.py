"""Speculative Streaming (Bhendawade et al., 2024): speculative streams on a Llama's top layers.

Stream j (1..γ) at position t predicts the token j places after the one the main stream predicts
there: main at t predicts x[t+1], stream j predicts x[t+1+j]. Streams enter at layer
L0 = N - N_s as ``S_j = M_t + P_j`` (M_t: the main stream's hidden state entering layer L0 at t,
P_j: a learned stream embedding), attend to the main stream's keys and values up to t and to
streams 1..j at t, share the model's final norm and LM head, and keep no KV cache.

Low-rank adapters (LoRA) on the top layers' linear maps act on stream rows only: stream rows run
copies of those layers whose linear maps carry the adapters (``Streams.layers_for``: the adapter
beside each map while training, merged into it at inference), with a cache that stores nothing
(``llama.Unstored``). They run in a pass of their own after the main rows' forward
(``Streams.forward``; ``forward_with_streams``: every window row's, in the step), so no main row sees
them and the main stream computes exactly what the model alone computes: with a frozen target,
decoding with streams attached is the target (the lossless form of the method).

The head may cover a reduced vocabulary (``vocab_map``: target id of each head row, rows of the
model's own LM head), as drafts here do: a draft token outside it is simply never proposed.

Shapes: B batch, R main rows that get streams, G streams per row (γ), d hidden size.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..devices import on_cpu_worker, to_device
from ..errors import MirrorSDError
from . import exact, tuning
from .forwards import LayerRange, layers, stream_layers
from .linear import int8_view, linear
from .llama import DecoderLayer, KVCache, ModelArgs, Transformer, full_mask

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class StreamConfig:
    num_streams: int = 4  # γ: stream j predicts j tokens past the main stream's next token
    stream_layers: int = 4  # N_s: top layers where streams run (multi-stream attention)
    rank: int = 16  # LoRA rank on stream rows (0: stream embeddings only, as in the paper)
    alpha: float = 32.0  # LoRA scale = alpha / rank
    embedding_scale: float | None = None  # P_j = scale * trained vector; None: 1, or the hidden RMS when training
    next_token_rank: int = 0  # >0: streams also see the next token's embedding through a rank-r map (see below)


class Adapted(nn.Module):
    """A linear map with a low-rank adapter beside it: base(x) + (alpha / rank) B A x."""

    def __init__(self, base: nn.Module, a: nn.Parameter, b: nn.Parameter, scale: float):
        super().__init__()
        self.base, self.a, self.b, self.scale = base, a, b, scale  # a [r, in], b [out, r]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.T) @ self.b.T * self.scale


def _linear_shapes(args: ModelArgs) -> dict[str, tuple[int, int]]:
    d, kv, q, ff = args.hidden_size, args.num_kv_heads * args.head_dim, args.num_heads * args.head_dim, \
        args.intermediate_size
    return dict(q_proj=(d, q), k_proj=(d, kv), v_proj=(d, kv), o_proj=(q, d),
                gate_proj=(d, ff), up_proj=(d, ff), down_proj=(ff, d))


class Streams(tuning.Planned, nn.Module):
    """The trainable part: stream embeddings P [G, d] and LoRA pairs on the top N_s layers."""

    stream_rows = True  # a stage range with Streams in place of the head runs its rows (models/forwards.py)
    stage_name = "streams"
    # Streams run in a pass of their own only draft: int8 on a CPU lane with int8 drafting
    # (``ModelPair.drafting``), through int8 views of their layers (``layers_for``)
    int8_products = False

    def __init__(self, args: ModelArgs, config: StreamConfig, vocab_map: torch.Tensor | None = None):
        super().__init__()
        if not 1 <= config.stream_layers <= args.num_layers:
            raise MirrorSDError(f"stream_layers must be between 1 and {args.num_layers}, got {config.stream_layers}")
        self.config = config
        self.first_layer = args.num_layers - config.stream_layers  # L0
        # P = embedding_scale * embeddings [G, d]: the trainer sets the scale to the RMS size of the hidden
        # states entering L0 (about 12-22 in SmolLM2), so P trains at the rate of the states it is added to.
        self.embeddings = nn.Parameter(torch.randn(config.num_streams, args.hidden_size) * 0.02)
        self.lora_a, self.lora_b = nn.ParameterDict(), nn.ParameterDict()
        if config.rank:
            for layer in range(self.first_layer, args.num_layers):
                for name, (n_in, n_out) in _linear_shapes(args).items():
                    a = torch.randn(config.rank, n_in) / math.sqrt(n_in)  # [r, in]
                    self.lora_a[_key(layer, name)] = nn.Parameter(a)
                    self.lora_b[_key(layer, name)] = nn.Parameter(torch.zeros(n_out, config.rank))  # [out, r]
        if config.next_token_rank:  # U = token_b @ token_a [d, d], starts at zero
            self.token_a = nn.Parameter(torch.randn(config.next_token_rank, args.hidden_size) / math.sqrt(args.hidden_size))
            self.token_b = nn.Parameter(torch.zeros(args.hidden_size, config.next_token_rank))
        self.register_buffer("vocab_map", vocab_map, persistent=False)
        self.head_weight = None  # rows of the model's LM head for vocab_map (set by attach)

    @property
    def num_streams(self) -> int:
        return self.config.num_streams

    def attach(self, model: Transformer) -> "Streams":
        """Move to the model's device and dtype; take the head rows from its (frozen) LM head.

        A model whose head already covers a reduced vocabulary (a draft with ``vocab_map``) lends
        its whole head, and its map to target ids."""
        self.to(device=model.device, dtype=model.dtype)
        weight = model.lm_head.weight.detach()
        if model.vocab_map is not None:
            self.vocab_map = model.vocab_map.to(model.device)
            self.head_weight = weight
        else:
            self.head_weight = weight if self.vocab_map is None else weight[self.vocab_map.to(model.device)]
        return self

    def layers_for(self, model: Transformer, a: int, b: int):
        """The layers [a, b) that stream rows run: the model's own, or copies whose linear maps carry
        the adapters, beside each map while training and on a sharded model (``adapted_layers``), else
        merged into it (``merged_layers``: one product per map, joined and tuned as the model's own).
        Streams that draft in int8 run int8 views of them (``int8_layers``)."""
        if not self.lora_a:
            own = model.model.layers[self.first_layer:]
        elif torch.is_grad_enabled() or model.layer_devices:
            own = self.adapted_layers(model)
        else:
            own = self.merged_layers(model)
        if self.int8_products:
            own = self.int8_layers(own, model)
        return own[a - self.first_layer:b - self.first_layer]

    def int8_layers(self, layers: nn.ModuleList, model: Transformer) -> nn.ModuleList:
        """Views of ``layers`` (L0..N) whose products take int8 weights (``linear.int8_view``): the
        model's own modules, or the merged copies, stay as they are. Kept until the layers change."""
        return self._kept("_int8", tuple(layers), lambda i: int8_view(layers[i - self.first_layer]), model)

    def adapted_layers(self, model: Transformer) -> nn.ModuleList:
        """Views of ``model``'s layers L0..N whose linear maps are :class:`Adapted`, on the model's and
        the streams' own parameters (gradients reach the adapters). Made at first use."""
        return self._kept("_adapted", id(model), lambda i: self._adapted_layer(model, i), model)

    def _adapted_layer(self, model: Transformer, i: int) -> DecoderLayer:
        """Layer i with each linear map in an :class:`Adapted`; every other module is the model's own."""
        scale, layer = self.config.alpha / self.config.rank, _view(model.model.layers[i])
        for part in ("self_attn", "mlp"):
            own = layer._modules[part] = _view(layer._modules[part])
            for name in set(LINEARS) & own._modules.keys():
                a, b = self.lora_a[_key(i, name)], self.lora_b[_key(i, name)]
                own._modules[name] = Adapted(own._modules[name], a, b, scale)
        return layer

    def merged_layers(self, model: Transformer) -> nn.ModuleList:
        """Copies of ``model``'s layers L0..N with the adapters merged into their linear maps,
        W' = W + (alpha / rank) B A: on a stream row, W' x is W x plus the adapter's delta. Made at first
        use and again when the streams' parameters or the model's device change; kept outside the
        module's state (``save`` writes the adapters only)."""
        changes = sum(0 if p.is_inference() else p._version for p in self.parameters())  # (inference tensors: none)
        return self._kept("_merged", (id(model), model.device, model.dtype, changes),
                          lambda i: self._merged_layer(model, i), model)

    def _kept(self, name: str, key, make, model: Transformer) -> nn.ModuleList:
        """[make(i) for layers L0..N], kept as ``name`` until ``key`` changes, outside the module's
        state (``save`` writes the adapters only)."""
        kept = self.__dict__.get(name)
        if kept is None or kept[0] != key:
            layers = nn.ModuleList(make(i) for i in range(self.first_layer, model.num_layers))
            kept = self.__dict__[name] = (key, layers)
        return kept[1]

    def _merged_layer(self, model: Transformer, i: int) -> DecoderLayer:
        own = model.model.layers[i]
        with torch.device("meta"):
            layer = DecoderLayer(model.args)
        layer = layer.to_empty(device=model.device).to(model.dtype).requires_grad_(False)
        scale = self.config.alpha / self.config.rank
        with torch.no_grad():
            for name, p in layer.named_parameters():
                p.copy_(own.get_parameter(name))
            for path, merged in layer.named_modules():
                name = path.rpartition(".")[2]  # "self_attn.q_proj" -> "q_proj"
                if name in LINEARS:
                    delta = self.lora_b[_key(i, name)].float() @ self.lora_a[_key(i, name)].float() * scale  # [out, in]
                    merged.weight.add_(delta.to(merged.weight.dtype))
                    merged.int8 = own.get_submodule(path).int8
        return exact.convert(layer) if model.exact else layer  # the model's formulations, and its cache's dtype

    def inputs(self, model: Transformer, h: torch.Tensor, positions: torch.Tensor, gamma: int,
               next_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [B, R*g, d] and positions [B, R*g] of streams 1..g for main rows h [B, R, d] entering
        layer L0 at ``positions`` [B, R]: S_j = M_t + P_j (+ U e(x_{t+1}), see forward), at t + j."""
        B, R, d = h.shape
        P = self.embeddings[:gamma] * (self.config.embedding_scale or 1.0)  # [g, d]
        if self.config.next_token_rank:
            if next_ids is None:
                raise MirrorSDError("these streams were trained to see the next token: pass next_ids")
            h = h + model.embed(next_ids) @ self.token_a.T @ self.token_b.T  # [B, R, d]
        rows = (h[:, :, None, :] + P).reshape(B, R * gamma, d)
        offsets = torch.arange(1, gamma + 1, device=h.device)
        return rows, (positions[:, :, None] + offsets).reshape(B, R * gamma)

    def logits(self, model: Transformer, out: torch.Tensor) -> torch.Tensor:
        """The shared final norm and LM head (its rows for ``vocab_map``): [B, n, d] -> [B, n, head rows]."""
        return linear(model.model.norm(out), self.head_weight, int8=self.int8_products, plan=self.plan).float()

    def forward(self, model: Transformer, cache: KVCache, h: torch.Tensor, at: torch.Tensor,
                positions: torch.Tensor | None = None, seen: torch.Tensor | None = None,
                next_ids: torch.Tensor | None = None, gamma: int | None = None) -> torch.Tensor:
        """Stream logits [B, R, G, head rows] for main rows h [B, R, d] entering layer L0, in a
        forward of their own after the main stream's (streams 1..gamma only, if given).

        at [B, R]: cache slot of each row's main token. The cache must hold the main stream's keys
        and values there in layers L0..N. By default a row sees the slots up to its own and sits at
        position = slot; a tree laid out in the cache passes the main token's ``positions`` [B, R]
        and the slots each main row ``seen`` [B, R, cache.length] instead. The streams' own keys
        and values are not stored.

        next_ids [B, R] (streams with ``next_token_rank``): the token after each main row, already
        committed when the streams run (in ``ss``, the step's correction or bonus). Its embedding,
        through a learned rank-r map U, joins every stream: S_j = M_t + P_j + U e(x_{t+1}). Stream 1
        then predicts x_{t+2} knowing x_{t+1}, as an EAGLE head does.
        """
        B, R, _ = h.shape
        G = gamma or self.num_streams
        rows, stream_positions = self.inputs(model, h, at if positions is None else positions, G, next_ids)
        mask = stream_mask(at, cache.length, G, seen)  # [B, R*G, cache.length + R*G]
        return stream_layers(model, self, rows, cache, stream_positions, mask).view(B, R, G, -1)

    def to_target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Head-row indices -> target token ids."""
        return rows if self.vocab_map is None else self.vocab_map[rows]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- files -----------------------------------------------------------------------------
    def save(self, folder: Path, meta: dict | None = None, dtype=torch.float16):
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        if self.vocab_map is not None:
            tensors["vocab_map"] = self.vocab_map.cpu()
        save_file(tensors, folder / "streams.safetensors")
        (folder / "streams.json").write_text(json.dumps(dict(config=asdict(self.config), **(meta or {})), indent=1))

    @classmethod
    def load(cls, folder: Path, args: ModelArgs) -> "Streams":
        folder = Path(folder)
        if not (folder / "streams.safetensors").exists():
            raise MirrorSDError(f"no trained streams in {folder} (expected streams.safetensors + streams.json)")
        info = json.loads((folder / "streams.json").read_text())
        tensors = load_file(folder / "streams.safetensors")
        vocab_map = tensors.pop("vocab_map", None)
        streams = cls(args, StreamConfig(**info["config"]), vocab_map)
        streams.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
        streams.meta = info
        return streams


def split_forward(model, ids, cache, first_layer: int, positions=None, tree_mask=None):
    """Logits [1, T, V] for ids [1, T] after the cache, and the hidden states entering layer
    first_layer [1, T, d] (where streams start). The caller advances cache.length. On stages for a
    stage cache (models/forwards.py, at the ranges ``split_ranges`` gives)."""
    below, above = split_ranges(first_layer)
    h0 = layers(model, ids, cache, below, positions, tree_mask)
    logits = layers(model, h0, cache, above, positions, tree_mask)
    return logits, h0


def split_ranges(first_layer: int) -> list[LayerRange]:
    """The layer ranges ``split_forward`` runs (for ``ModelPair.new_cache``): the layers below
    ``first_layer`` (hidden states out), then the rest and the LM head."""
    return [LayerRange(0, first_layer), LayerRange(first_layer, lm_head=True)]


def stream_ranges(streams: Streams) -> list:
    """The ranges of ``split_forward`` at the streams' first layer, then the pass of their rows
    (``Streams.forward``), for ``ModelPair.new_cache``."""
    return [*split_ranges(streams.first_layer), LayerRange(streams.first_layer, streams=streams)]


def forward_with_streams(model, streams: Streams, ids, cache, gamma: int, rows=None, positions=None, tree_mask=None):
    """The main logits [1, T, V] of ids [1, T] after the cache (``split_forward``), then the logits
    [1, R, gamma, head rows] of streams 1..gamma of window rows ``rows`` (default: all T), each seeing
    what its main row sees and streams 1..j of its own row, no main row seeing them: the paper's form,
    for streams trained without the next-token input (what this step decides). The caller advances
    cache.length."""
    T, start = ids.shape[1], cache.length
    logits, h0 = split_forward(model, ids, cache, streams.first_layer, positions, tree_mask)  # [1, T, V], [1, T, d]
    if positions is None:
        positions = torch.arange(start, start + T, device=h0.device)[None]  # [1, T]
    rows = torch.arange(T, device=h0.device) if rows is None else to_device(rows, h0.device)  # [R]
    seen = full_mask(tree_mask, T, start, h0.device)[:, rows]  # [1, R, start + T]: what each main row sees
    cache.length = start + T  # the stream rows read the window's main rows, stored by split_forward
    try:
        ahead = streams(model, cache, h0[:, rows], start + rows[None], positions[:, rows], seen, gamma=gamma)
    finally:
        cache.length = start
    return logits, ahead  # [1, T, V], [1, R, gamma, head rows]


def _view(module: nn.Module) -> nn.Module:
    """A shallow copy of ``module`` whose submodules may be replaced without touching the original's."""
    view = copy.copy(module)
    view._modules = dict(module._modules)  # a shallow copy would share the dict of submodules
    return view


def _key(layer: int, name: str) -> str:
    return f"layer{layer}_{name}"  # ParameterDict keys cannot contain dots


def stream_mask(at: torch.Tensor, start: int, G: int, seen: torch.Tensor | None = None) -> torch.Tensor:
    """What stream rows see: [B, R*G, start + R*G] bool.

    Row (r, j) sees the cached slots its main row sees (``seen`` [B, R, start]; by default the
    slots up to at[r]: the main stream's past and its own main token) and streams 1..j of the same
    main row r.
    """
    B, R = at.shape
    if seen is None:
        seen = torch.arange(start, device=at.device) <= at[:, :, None]  # [B, R, start]
    past = seen.repeat_interleave(G, dim=1)  # [B, R*G, start]
    block = torch.ones(G, G, dtype=torch.bool, device=at.device).tril()  # stream j sees 1..j
    own = torch.kron(torch.eye(R, device=at.device), block.float()).bool()  # [R*G, R*G]
    return torch.cat([past, own.expand(B, -1, -1)], dim=-1)


ASSETS = Path(__file__).resolve().parents[1] / "assets"
EMBEDDED_STREAMS = ASSETS / "ss-smollm2-135m"  # trained by `python -m mirror_sd.train ss`, next-token input on
EMBEDDED_ONE_FORWARD_STREAMS = ASSETS / "ss-paper-smollm2-135m"  # `... train ss --next-token-rank 0`


def target_streams(pair, one_forward: bool = False) -> Streams:
    """The trained streams of the pair's target, loaded once: for ``ss`` with one_forward, streams that
    ride in the verify forward (trained without the next-token input), else streams run in a pass of
    their own, which only draft (in int8 where the pair drafts so: ``ModelPair.drafting``, set here,
    when a run takes them). For the embedded target both ship; streams attached with use_streams
    serve either form they fit."""
    attr = "one_forward_streams" if one_forward else "streams"
    streams = getattr(pair, attr)
    if streams is None and not pair.attached_streams:
        if not pair.embedded_target:
            raise MirrorSDError(f"method 'ss' needs speculative streams trained for {pair.target_name!r}; "
                                "streams ship only for the embedded target (train others with python -m "
                                "mirror_sd.train ss --target ... --out STREAMS, then pass --add-on STREAMS, or "
                                "load_pair(add_ons=[STREAMS]))")
        folder = EMBEDDED_ONE_FORWARD_STREAMS if one_forward else EMBEDDED_STREAMS
        streams = Streams.load(folder, pair.target.args).attach(pair.target)
        setattr(pair, attr, streams)
    if one_forward and streams is None:
        raise MirrorSDError("one_forward=1 needs streams trained without the next-token input (they ride in the "
                            "verify forward, which decides the next token); the attached streams see it: train "
                            "others with `python -m mirror_sd.train ss --next-token-rank 0`, or use one_forward=0")
    return pair.drafting(streams, None if one_forward else pair.target_lane)  # one_forward: they verify, not draft


def draft_streams(pair) -> Streams:
    """The speculative streams trained for the pair's draft (the draft folder's ``streams/``),
    loaded once: with them the draft proposes a whole window in one forward."""
    if pair.draft_streams is None:
        folder = pair.draft_dir / "streams" if pair.draft_dir else None
        if pair.draft is None or folder is None or not (folder / "streams.safetensors").exists():
            raise MirrorSDError(f"streams=on needs a draft with trained speculative streams, and draft "
                                f"{pair.draft_name!r} has none (train them with "
                                "`python -m mirror_sd.train ss --model DRAFT_FOLDER --out DRAFT_FOLDER/streams`)")
        pair.draft_streams = Streams.load(folder, pair.draft.args).attach(pair.draft)
    return pair.drafting(pair.draft_streams, pair.draft_lane)


def use_streams(pair, folder: Path | str) -> Streams:
    """Attach streams trained for the pair's target (``python -m mirror_sd.train ss --out folder``),
    for both forms of ``ss`` if they were trained without the next-token input, else for one_forward=0.

    They load on the CPU worker, as load_pair's models do (devices.on_cpu_worker): loaded on the
    caller's thread, they would start an OpenMP pool there and slow decoding down."""
    streams = on_cpu_worker(lambda: Streams.load(Path(folder), pair.target.args).attach(pair.target))
    pair.streams, pair.attached_streams = streams, True
    pair.one_forward_streams = None if streams.config.next_token_rank else streams
    return streams
