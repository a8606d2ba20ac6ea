"""A lean Llama-family transformer, in the spirit of gpt-fast's model.py.

Module names mirror Hugging Face's (``model.layers.0.self_attn.q_proj`` ...) so a HF state dict
loads with a strict ``load_state_dict``. Three things set it apart from ``transformers``' modules,
and speculative decoding needs all three:

* ``forward_layers(h, start, end, ...)`` runs any contiguous range of decoder layers, so Mirror-SD
  can run layers [0, l_e) and [l_e, N) separately over the same window, sharing one KV cache.
* ``KVCache`` is a preallocated buffer with a ``length`` pointer: rolling back to any committed
  length is a pointer move, and ``keep(slots)`` compacts a non-contiguous accepted tree path.
* Every forward accepts explicit position ids and a window attention mask (tree verification).

This is the plain forward, one operation after another; each operation's kernel is an attribute of
its module, set when the model is loaded or a stage captures it, never read from elsewhere in the
forward (``Linear``: models/linear.py; norm, rotary embedding, attention: models/tuning.py). A
stage's body runs models/tuned.py's layers in place of these, stream rows run copies of them
(models/streams.py): docs/architecture.md, "The model and its fast paths".

Supported families: Llama (incl. SmolLM), Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k RMSNorm).
Shapes: B batch, T window length, S cache slots in use, H query heads, K kv heads, D head dim.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from itertools import groupby

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import to_device
from ..errors import MirrorSDError, Stopped
from . import exact, tuning
from .linear import Linear

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelArgs:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    qk_norm: bool = False  # Qwen3: RMSNorm on each head's q and k
    sliding_window: int | None = None  # Mistral, Qwen2/3 with use_sliding_window: attention reaches back this far

    @classmethod
    def from_hf(cls, config) -> "ModelArgs":
        refuse_unsupported(config)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            max_position_embeddings=config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            attention_bias=config.model_type == "qwen2",
            qk_norm=config.model_type == "qwen3",
            sliding_window=sliding_window(config),
        )


def sliding_window(config) -> int | None:
    """How far back attention reaches in a model with sliding-window attention (Mistral's sliding_window;
    Qwen2's and Qwen3's when use_sliding_window is set), else None. This forward attends to every
    token, so it gives that model's logits only within the window (engine.encode_prompt keeps inside it)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def refuse_unsupported(config):
    """Options whose weights this forward has no place for, refused by name rather than as a
    state dict that does not load."""
    if config.model_type in ("llama", "qwen3") and getattr(config, "attention_bias", False):
        raise MirrorSDError(f"a {config.model_type} model with attention_bias (biases on q, k, v and o_proj) is not "
                            "supported: mirror-sd's forward has biases on q, k and v only (Qwen2's)")
    if getattr(config, "mlp_bias", False):
        raise MirrorSDError("a model with mlp_bias (biases on the MLP's products) is not supported")


def full_mask(tree_mask: torch.Tensor | None, T: int, start: int, device) -> torch.Tensor:
    """What each of T window rows may see among slots [0, start + T): [B|1, T, start + T] bool.

    tree_mask as in ``Transformer.window``: None (causal, the prefix visible), [T, T] or [B, T, T] over
    the window (the prefix visible), or [T, start + T] or [B, ...] over every slot."""
    if tree_mask is None:
        tree_mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    tree_mask = to_device(tree_mask, device, torch.bool)
    if tree_mask.dim() == 2:
        tree_mask = tree_mask.unsqueeze(0)
    if tree_mask.shape[-1] == T and start > 0:
        prefix = torch.ones(tree_mask.shape[0], T, start, dtype=torch.bool, device=device)
        tree_mask = torch.cat([prefix, tree_mask], dim=-1)
    return tree_mask


class KVCache(nn.Module):
    """Keys and values of every layer for the tokens decoded so far, in preallocated slots."""

    def __init__(self, args: ModelArgs, max_slots: int, batch: int = 1, dtype=torch.float32, device="cpu",
                 num_layers: int | None = None):
        super().__init__()
        shape = (num_layers or args.num_layers, batch, args.num_kv_heads, max_slots, args.head_dim)
        self.kv = torch.zeros((2, *shape), dtype=dtype, device=device)  # both in one: ``keep`` moves them at once
        self.k, self.v = self.kv[0], self.kv[1]  # [L, B, K, max_slots, D] each
        self.length = 0  # slots [0, length) hold committed tokens

    @property
    def max_slots(self) -> int:
        return self.k.shape[3]

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [B, K, T, D] at slots [start, start + T); return every slot up to there."""
        end = start + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.read(layer, end)

    def read(self, layer: int, end: int):
        """k, v [B, K, end, D] of slots [0, end)."""
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def rollback(self, length: int):
        """Forget every slot from ``length`` on (they are overwritten by later writes)."""
        if not 0 <= length <= self.max_slots:
            raise ValueError(f"cannot roll back to {length} (cache has {self.max_slots} slots)")
        self.length = length

    def keep(self, slots: list[int] | torch.Tensor, at: int):
        """Move the entries of ``slots`` (ascending) to ``at, at+1, ...`` and set the length after them.

        Used after tree verification: the accepted root-to-leaf path sits at scattered slots.
        """
        slots = to_device(slots, self.kv.device, torch.long)  # the index ops below run on this stream too
        n = len(slots)
        self.kv[:, :, :, :, at:at + n] = self.kv[:, :, :, :, slots]  # [2, L, B, K, n, D]
        self.length = at + n


class ShardedKVCache:
    """The KV cache of a model sharded over devices: one :class:`KVCache` per device, each holding
    the layers that device runs, behind the same interface (layer indices are the model's)."""

    def __init__(self, args: ModelArgs, max_slots: int, batch: int, dtype, layer_devices: list[torch.device]):
        self.parts: list[KVCache] = []
        self.part_of: list[tuple[KVCache, int]] = []  # model layer -> (its device's cache, index there)
        for device, run in groupby(layer_devices):  # runs of consecutive layers on one device
            count = len(list(run))
            part = KVCache(args, max_slots, batch, dtype, device, num_layers=count)
            self.parts.append(part)
            self.part_of += [(part, i) for i in range(count)]

    @property
    def length(self) -> int:
        return self.parts[0].length

    @length.setter
    def length(self, value: int):
        for part in self.parts:
            part.length = value

    @property
    def max_slots(self) -> int:
        return self.parts[0].max_slots

    def write(self, layer: int, start: int, k, v):
        part, i = self.part_of[layer]
        return part.write(i, start, k, v)

    def read(self, layer: int, end: int):
        part, i = self.part_of[layer]
        return part.read(i, end)

    def rollback(self, length: int):
        for part in self.parts:
            part.rollback(length)

    def keep(self, slots, at: int):
        for part in self.parts:
            part.keep(slots, at)


class Unstored:
    """A cache that a window reads and is not stored in (speculative stream rows): each layer's keys
    and values are the cache's committed slots followed by the rows' own, which serve this forward only."""

    def __init__(self, cache):
        self.cache = cache

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """k, v [B, K, n, D] -> every committed slot's, then the rows' [B, K, cache.length + n, D]."""
        k_all, v_all = self.cache.read(layer, self.cache.length)
        return torch.cat([k_all, k], dim=2), torch.cat([v_all, v], dim=2)


class RMSNorm(tuning.Planned, nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return tuning.norm(x, self.weight, self.eps, self.plan)  # weight * normalised x (in fp32, then x's dtype)


class Attention(tuning.Planned, nn.Module):
    exact = False  # exact.convert: attention as exact.attention (bf16 on CPU)

    def __init__(self, args: ModelArgs):
        super().__init__()
        h, d = args.hidden_size, args.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, d
        self.q_proj = Linear(h, args.num_heads * d, bias=args.attention_bias)
        self.k_proj = Linear(h, args.num_kv_heads * d, bias=args.attention_bias)
        self.v_proj = Linear(h, args.num_kv_heads * d, bias=args.attention_bias)
        self.o_proj = Linear(args.num_heads * d, h, bias=False)
        if args.qk_norm:
            self.q_norm = RMSNorm(d, args.rms_norm_eps)
            self.k_norm = RMSNorm(d, args.rms_norm_eps)
        self.qk_norm = args.qk_norm

    def forward(self, x, win: "Window", cache: KVCache | None, layer: int):
        """x [B, T, hidden] -> [B, T, hidden]: the window's rows attend to the cache's slots (their own
        keys and values stored there first) under the window's mask."""
        q, k, v = self.heads(self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q, k = tuning.rotary(q, k, win.cos, win.sin, self.plan)
        if cache is not None:
            k, v = cache.write(layer, win.start, k, v)  # [B, K, S, D]: every slot up to the window's end
        return self.out(self.attend(q, k, v, win))

    def attend(self, q, k, v, win: "Window") -> torch.Tensor:
        """q [B, H, T, D] over k, v [B, K, S, D] under the window's mask: [B, H, T, D]."""
        if self.exact:
            return exact.attention(q, k, v, win.mask, win.causal)
        return tuning.attention(q, k, v, win.mask, win.causal, self.plan)

    def heads(self, q, k, v):
        """The projections [B, T, heads * D] split into heads [B, heads, T, D], q and k normed where
        the model norms them (Qwen3)."""
        B, T, _ = q.shape
        q = q.view(B, T, self.num_heads, self.head_dim)
        k, v = k.view(B, T, self.num_kv_heads, self.head_dim), v.view(B, T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """The heads' outputs y [B, H, T, D] joined and projected: [B, T, hidden]."""
        B, H, T, D = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * D))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x, win: "Window", cache: KVCache | None, layer: int) -> torch.Tensor:
        """The layer's output hidden states for input x: [B, T, hidden]."""
        h = x + self.self_attn(self.input_layernorm(x), win, cache, layer)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    """Named ``model`` inside :class:`Transformer`, as in Hugging Face checkpoints."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


@dataclass
class Window:
    """Where a forward pass writes in the cache and what it may attend to.

    start: first cache slot of the window; T tokens go to slots [start, start + T).
    positions: [B, T] rotary positions (default start, start+1, ...; a tree uses depths).
    mask: [B or 1, 1, T, start + T] bool, True = may attend; None with causal=False: attend to all
    (one new token); causal=True: no cache, plain causal attention within the window (training).
    """

    start: int
    positions: torch.Tensor
    mask: torch.Tensor | None
    cos: torch.Tensor  # [B, 1, T, D]
    sin: torch.Tensor
    causal: bool = False

    def to(self, device: torch.device) -> "Window":
        """The same window with its tensors on ``device`` (a sharded model's next device)."""
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(self, positions=move(self.positions), mask=move(self.mask), cos=move(self.cos),
                       sin=move(self.sin))


class Transformer(nn.Module):
    exact = False  # exact.convert: row-invariant bf16 forwards, the KV cache in exact.WIDE

    def __init__(self, args: ModelArgs, rope_config=None, head_size: int | None = None):
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = Linear(args.hidden_size, head_size or args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # A draft may predict over a reduced vocabulary (as in EAGLE-3): head row i is target token
        # vocab_map[i]. None means the head covers the full vocabulary in order.
        self.vocab_map: torch.Tensor | None = None
        # Sharded over devices (see models/sharding.py): the device of each layer; None: one device.
        self.layer_devices: list[torch.device] | None = None
        # Set by the engine while a run that may be stopped uses this model (``check_stop``).
        self.stop: threading.Event | None = None
        self.init_rope(rope_config)

    def init_rope(self, rope_config=None, device=None):
        """RoPE inverse frequencies from the HF config (rope_config=None: plain RoPE, base 1e4)."""
        inv_freq, self.rope_scale = _rope_frequencies(rope_config, self.args)
        self.register_buffer("inv_freq", inv_freq.to(device), persistent=False)

    @property
    def num_layers(self) -> int:
        return self.args.num_layers

    @property
    def device(self) -> torch.device:
        """Where inputs go (the embedding's device) and where logits come back."""
        return self.model.embed_tokens.weight.device if self.layer_devices else self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def cache_dtype(self) -> torch.dtype:
        """The KV cache's dtype: the model's, or exact.WIDE for an exact model."""
        return exact.WIDE if self.exact else self.dtype

    def new_cache(self, max_slots: int, batch: int = 1) -> KVCache | ShardedKVCache:
        if self.layer_devices:
            return ShardedKVCache(self.args, max_slots, batch, self.cache_dtype, self.layer_devices)
        return KVCache(self.args, max_slots, batch, self.cache_dtype, self.device)

    # -- the forward pass, in pieces ---------------------------------------------------------
    def window(self, cache: KVCache | None, T: int, positions=None, tree_mask=None, batch: int = 1) -> Window:
        """Describe a window of T new tokens written right after the cache's committed slots.

        tree_mask: optional bool mask of what each window token sees: [T, T] (or [B, T, T]) over the
        window, the cached prefix always visible; or [T, start + T] (or [B, ...]) over every slot, for
        trees that grow over several forwards. cache=None: no cache (training: one causal sequence;
        or rows whose mask says what they see, as a stage's body and stream rows lay them out).
        """
        start = cache.length if cache is not None else 0
        if cache is not None and start + T > cache.max_slots:
            raise ValueError(f"KV cache full: {start} + {T} tokens > {cache.max_slots} slots")
        if positions is None:
            positions = torch.arange(start, start + T, device=self.device).expand(batch, T)
        mask = None
        causal = cache is None and tree_mask is None and T > 1
        if not causal and (tree_mask is not None or T > 1):
            mask = full_mask(tree_mask, T, start, self.device).unsqueeze(1)  # [B|1, 1, T, start + T]
        freqs = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1) * self.rope_scale
        cos = emb.cos().to(self.dtype).unsqueeze(1)  # [B, 1, T, D]
        sin = emb.sin().to(self.dtype).unsqueeze(1)
        return Window(start, positions, mask, cos, sin, causal)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)  # [B, T] -> [B, T, hidden]

    def forward_layers(self, h, cache: KVCache | None, win: Window, start_layer: int = 0, end_layer=None,
                       stack=None):
        """Run decoder layers [start_layer, end_layer) on hidden states h [B, T, hidden]. ``stack``:
        modules to run in their place, one per layer (the streams' adapted or merged copies,
        models/streams.py)."""
        end_layer = self.num_layers if end_layer is None else end_layer
        for i in range(start_layer, end_layer):
            self.check_stop()
            if self.layer_devices:  # sharded: hidden states and window follow the layers' devices
                h, win = h.to(self.layer_devices[i]), win.to(self.layer_devices[i])
            layer = self.model.layers[i] if stack is None else stack[i - start_layer]
            h = layer(h, win, cache, i)
        return h

    def check_stop(self):
        """Raise ``Stopped`` when the run using this model was asked to stop (``self.stop`` set): called
        before each layer, so a long prefill stops within one layer's time. Never while a CUDA graph is
        being captured, which an exception would leave broken."""
        if self.stop is not None and self.stop.is_set() and not (
                self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            raise Stopped

    def to_target_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """Head rows -> target token ids (the same for a full-vocabulary head)."""
        return rows if self.vocab_map is None else self.vocab_map[rows]

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: hidden [B, T, hidden] -> logits [B, T, vocab] (fp32, on ``device``)."""
        if self.layer_devices:
            h = self.model.norm(h.to(self.model.norm.weight.device))
            return self.lm_head(h.to(self.lm_head.weight.device)).float().to(self.device)
        return self.lm_head(self.model.norm(h)).float()

    def forward(self, ids, cache: KVCache | None, positions=None, tree_mask=None, commit: bool = True):
        """Logits [B, T, vocab] for tokens ids [B, T] written after the cache's committed slots.

        commit=True advances the cache length past the window; speculative methods pass False
        and decide afterwards how much of the window to keep (``cache.rollback`` / ``keep``).
        cache=None runs the ids as one causal sequence with no cache (training).
        """
        win = self.window(cache, ids.shape[1], positions, tree_mask, batch=ids.shape[0])
        logits = self.head(self.forward_layers(self.embed(ids), cache, win))
        if commit and cache is not None:
            cache.length = win.start + ids.shape[1]
        return logits


def _rope_frequencies(rope_config, args: ModelArgs):
    """Inverse RoPE frequencies and scale, computed by transformers' own rope functions (imported
    here, when a model is made: importing Llama's modeling module takes seconds)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    if rope_config is None:
        base = 10000.0
        inv = 1.0 / (base ** (torch.arange(0, args.head_dim, 2, dtype=torch.float) / args.head_dim))
        return inv, 1.0
    rope_type = (getattr(rope_config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(rope_config)
    return ROPE_INIT_FUNCTIONS[rope_type](rope_config, None)
