"""An EAGLE-1 style draft head (Li et al., 2024): it autoregresses on the target's features.

Feature f_i: the target's final-normed hidden state at position i (what its LM head reads).
Head input at position i: concat(f_i, embedding(x_{i+1})) -> Linear(2d -> d) -> one Llama decoder
layer (``llama.DecoderLayer``) -> f^_{i+1}, a prediction of the next feature. Tokens come from the
target's own frozen LM head, restricted to ``vocab_map`` (head row r is target token vocab_map[r]):
logits = f^ @ W_lm[vocab_map]^T. Deeper drafts feed the head its own predicted features.

Early features (``early_layers``, EAGLE-3's idea of reading more than the last layer): the hidden
state entering target layer l, through that layer's own input norm, for each l listed. A head with
early layers adds fuse(early features) to f_i wherever f_i is a true target feature (never where the
head reads its own prediction); fuse is a Linear(len(early_layers) * d -> d) that starts at zero, so
a head given early layers starts as exactly the head it was.

Only fc, fuse and the decoder layer are trained and shipped (fp16); the embedding and the LM-head rows are
borrowed from the target at load time. The head has its own :class:`KVCache` (one layer), with the
same rollback / keep as the target's, and takes the same position ids and tree masks.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from weakref import WeakKeyDictionary

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import MirrorSDError
from . import tuning
from .forwards import LayerRange, layers, staged
from .linear import Linear, linear
from .llama import DecoderLayer, KVCache, ModelArgs, Transformer
from .loading import EMBEDDED_NAME
from .stages import MAX_WIDTH, OwnStage, Stage, Stages, copy_into
from .tuned import run_layers

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_HEAD = ASSETS / "eagle-smollm2-135m"


def target_features(target: Transformer, ids: torch.Tensor, cache, early_layers=(), positions=None, tree_mask=None):
    """The target's layers over ids [B, T] written after the cache's slots (cache None: one causal
    sequence, as in training): features [B, T, d] (final-normed hidden states) and early features
    [B, T, len(early_layers) * d] (None without early layers). The cache's length does not move. On
    stages for a stage cache (models/forwards.py, at the ranges ``stage_ranges`` gives: the final
    norm inside the last one's stage)."""
    h, early, on_stages = ids, [], staged(target, cache) is not None
    for a, b in feature_ranges(target, early_layers):
        last = b == target.num_layers
        norm = final_norm(target) if on_stages and last else None  # on stages, the final norm in the last one's
        h = layers(target, h, cache, LayerRange(a, b, reader=norm), positions, tree_mask)
        if not last:
            early.append(early_feature(target, h, b))
    return (h if on_stages else final_feature(target, h)), (torch.cat(early, dim=-1) if early else None)


def feature_ranges(target: Transformer, early_layers=()) -> list[tuple[int, int]]:
    """The layer ranges [a, b) that end at each early-feature layer, then at the last layer."""
    bounds = [0, *early_layers, target.num_layers]
    return list(zip(bounds, bounds[1:]))


def stage_ranges(target: Transformer, early_layers=()) -> list[LayerRange]:
    """``feature_ranges`` as models/forwards.py's ranges, for ``ModelPair.new_cache``: the last one
    ends in the final norm (``FinalNorm``), so the features come out of its stage."""
    ranges = feature_ranges(target, early_layers)
    return [LayerRange(a, b) for a, b in ranges[:-1]] + [LayerRange(*ranges[-1], reader=final_norm(target))]


class FinalNorm(nn.Module):
    """The target's final norm in the place of its LM head: a layer range that ends in features
    (models/forwards.py names its stages "features a-b")."""

    stage_name = "features"

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)


FINAL_NORMS: "WeakKeyDictionary" = WeakKeyDictionary()  # target -> its FinalNorm


def final_norm(target: Transformer) -> FinalNorm:
    """The target's one ``FinalNorm`` (a stage set knows a range by its module)."""
    if target not in FINAL_NORMS:
        FINAL_NORMS[target] = FinalNorm(target.model.norm)
    return FINAL_NORMS[target]


def early_feature(target: Transformer, h: torch.Tensor, layer: int) -> torch.Tensor:
    """The early feature of hidden states h [B, T, d] entering ``layer``: that layer's input norm of them."""
    norm = target.model.layers[layer].input_layernorm
    return norm(h.to(norm.weight.device)).to(target.device)


def final_feature(target: Transformer, h: torch.Tensor) -> torch.Tensor:
    """The feature of the last layer's hidden states h [B, T, d]: the target's final norm of them."""
    return target.model.norm(h.to(target.model.norm.weight.device)).to(target.device)


def check_early_layers(target: Transformer, early_layers) -> tuple[int, ...]:
    """``early_layers`` as a tuple, or a clear error if the target has no such layers."""
    early_layers = tuple(early_layers)
    if any(not 0 < l < target.num_layers for l in early_layers) or list(early_layers) != sorted(set(early_layers)):
        raise MirrorSDError(f"early layers must be increasing, in 1..{target.num_layers - 1} (the target has "
                            f"{target.num_layers} layers); got {list(early_layers)}")
    return early_layers


class EagleHead(tuning.Planned, nn.Module):
    layer_devices = None  # never sharded (models/stages.py asks)
    num_layers = 1
    int8_products = False  # the head only drafts: int8 on a CPU lane with int8 drafting (linear.convert_to_int8)

    def __init__(self, args: ModelArgs, vocab_map: torch.Tensor, embed_weight: torch.Tensor,
                 head_rows: torch.Tensor, inv_freq: torch.Tensor, rope_scale: float, early_layers=()):
        super().__init__()
        self.args = ModelArgs(**{**args.__dict__, "num_layers": 1})
        d = args.hidden_size
        # fc and fuse read raw target features: fp32 even when drafting in int8 (models/linear.py)
        self.fc = Linear(2 * d, d, bias=True, int8=False)
        self.early_layers = tuple(early_layers)
        if self.early_layers:
            self.fuse = Linear(len(self.early_layers) * d, d, bias=False, int8=False)
            nn.init.zeros_(self.fuse.weight)
        self.layer = DecoderLayer(self.args)
        self.register_buffer("vocab_map", vocab_map.clone(), persistent=True)  # [rows] target ids
        # borrowed from the target, frozen, never saved:
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)  # [V, d]
        self.register_buffer("head_rows", head_rows.detach().clone(), persistent=False)  # [rows, d]
        self.register_buffer("inv_freq", inv_freq.clone(), persistent=False)
        self.rope_scale = rope_scale

    @classmethod
    def from_target(cls, target: Transformer, vocab_map: torch.Tensor, early_layers=()) -> "EagleHead":
        """A fresh, randomly initialised head for ``target`` (copying a target layer starts far worse:
        the last layers of SmolLM2 write very large activations into the residual stream)."""
        early_layers = check_early_layers(target, early_layers)
        head = cls(target.args, vocab_map, target.model.embed_tokens.weight,
                   target.lm_head.weight[vocab_map.to(target.device)], target.inv_freq, target.rope_scale,
                   early_layers)
        return head.to(target.device, target.dtype)

    def with_early_layers(self, target: Transformer, early_layers) -> "EagleHead":
        """This head with (zero-initialised) fuse weights for ``early_layers``: the same outputs at first."""
        head = EagleHead.from_target(target, self.vocab_map, early_layers)
        head.load_state_dict(self.state_dict(), strict=False)
        return head

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    window = Transformer.window  # same windows (positions, tree masks) as the target's

    def new_cache(self, max_slots: int) -> KVCache:
        return KVCache(self.args, max_slots, 1, self.dtype, self.device)

    def forward(self, feats, ids, cache: KVCache | None, positions=None, tree_mask=None, early=None) -> torch.Tensor:
        """feats [B, T, d] (f_i), ids [B, T] (x_{i+1}) -> predicted features [B, T, d] (f^_{i+1}).

        early [B, T, len(early_layers) * d]: the early features of true target features (None where
        feats are the head's own predictions). With a cache, the T entries go to the slots after
        ``cache.length``, which moves past them. With the cache of a :class:`HeadStages`, on its
        stage (at most 64 rows).
        """
        stages = staged(self, cache)
        T = ids.shape[1]
        if stages is not None and T <= MAX_WIDTH and ids.shape[0] == stages.cache.k.shape[1]:
            early = early if self.early_layers else None
            h = stages.run(HeadStages.name(early), ids, positions, tree_mask, feats=feats, early=early)
            cache.length += T
            return h
        x = self.inputs(feats, ids, early)
        win = self.window(cache, T, positions, tree_mask, batch=ids.shape[0])
        h = self.layer(x, win, cache, 0)
        if cache is not None:
            cache.length = win.start + T
        return h

    def inputs(self, feats, ids, early=None) -> torch.Tensor:
        """The decoder layer's input for (feature, token) pairs feats [B, T, d], ids [B, T]: [B, T, d]."""
        if early is not None and self.early_layers:
            feats = feats.to(self.dtype) + self.fuse(early.to(self.dtype))
        return self.fc(torch.cat([feats.to(self.dtype), nn.functional.embedding(ids, self.embed_weight)], dim=-1))

    def logits(self, feats: torch.Tensor) -> torch.Tensor:
        """Predicted features [..., d] -> logits over the head's rows [..., rows] (fp32)."""
        return linear(feats, self.head_rows, int8=self.int8_products, plan=self.plan).float()


class HeadStage(Stage):
    """The head's forward at a fixed width (models/stages.py): a Stage's token ids, positions, mask
    and write slots, and static buffers of its own for the features (and early features) the pairs
    bring."""

    def __init__(self, head: EagleHead, width: int, cache, early: bool):
        super().__init__(head, width, cache, layers=(0, 1), head=False)  # self.x: the pairs' token ids
        B, d = self.batch, head.args.hidden_size
        self.feats = torch.zeros(B, width, d, dtype=head.dtype, device=head.device)
        self.early = (torch.zeros(B, width, len(head.early_layers) * d, dtype=head.dtype, device=head.device)
                      if early else None)

    def run(self, ids, positions=None, mask=None, feats=None, early=None) -> torch.Tensor:
        """The head's output [B, T, d] for T pairs of token ids [B, T] and features ``feats`` [B, T, d]
        (see ``EagleHead.forward``); the cache's length does not move."""
        with torch.inference_mode():
            T = self.load_pairs(ids, positions, mask, feats, early)
            self.replay()
        return self.out[:, :T].clone()

    def load_pairs(self, ids, positions, mask, feats, early) -> int:
        """``load`` the pairs' token ids and copy their features in; return T. Padding rows keep old
        numbers, as ``load`` leaves them in x."""
        T = self.load(ids, positions, mask)
        copy_into(self.feats[:, :T], feats)
        if self.early is not None:
            copy_into(self.early[:, :T], early)
        return T

    def body(self) -> torch.Tensor:
        head = self.model
        self.settle()
        x = head.inputs(self.feats, self.x, self.early)  # [B, W, d]
        win = head.window(None, self.width, positions=self.positions, batch=self.batch)
        return run_layers([head.layer], x, self.writer, replace(win, mask=self.mask, causal=False), 0)


class HeadStages(Stages):
    """An EAGLE head's stages: its forward over pairs with early features and without, at every width,
    and the whole greedy draft at the settings a run names (models/eagle_tree.py: ``TreeDraft``)."""

    def __init__(self, head: EagleHead, max_slots: int, batch: int = 1, graphs: bool | None = None, stream=None):
        super().__init__(head, max_slots, batch, graphs, stream)
        self.kinds = {self.name(None): None, **({self.name(True): None} if head.early_layers else {})}

    @staticmethod
    def name(early) -> str:
        return "pairs" if early is None else "pairs + early features"

    def make(self, name: str, width: int) -> HeadStage:
        if isinstance(self.kinds[name], OwnStage):  # a forward that makes its own kind of stage (TreeDraft)
            return super().make(name, width)
        return HeadStage(self.model, width, self.cache, early=name == self.name(True))


def save_head(head: EagleHead, out: Path, card: dict):
    """fp16 weights (fc, layer, vocab_map), config.json and training.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(torch.float16) if v.is_floating_point() else v).contiguous().cpu()
             for k, v in head.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    a = head.args
    config = dict(architecture="eagle-1 head: fc(2d->d) + 1 Llama decoder layer, target's frozen LM head rows"
                               + (", fuse(early features) added to true features" if head.early_layers else ""),
                  target=card.get("target"), early_layers=list(head.early_layers),
                  hidden_size=a.hidden_size, num_heads=a.num_heads,
                  num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, intermediate_size=a.intermediate_size,
                  target_vocab_size=a.vocab_size, head_vocabulary=len(head.vocab_map), torch_dtype="float16")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "training.json").write_text(json.dumps(card, indent=2))


def load_head(folder: Path, target: Transformer) -> EagleHead:
    """The head in ``folder`` on the target's device and dtype; refuse one made for another target."""
    folder = Path(folder)
    if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
        raise MirrorSDError(f"no EAGLE head in {folder} (needs config.json and model.safetensors)")
    config = json.loads((folder / "config.json").read_text())
    a = target.args
    want = dict(hidden_size=a.hidden_size, num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim,
                intermediate_size=a.intermediate_size, target_vocab_size=a.vocab_size)
    wrong = {k: (config.get(k), v) for k, v in want.items() if config.get(k) != v}
    if wrong:
        raise MirrorSDError(f"the EAGLE head in {folder} was made for another target: (head, target) differ in {wrong}")
    state = load_file(str(folder / "model.safetensors"))
    head = EagleHead.from_target(target, state["vocab_map"].long(), config.get("early_layers", ()))
    head.load_state_dict({k: v.to(target.dtype) if v.is_floating_point() else v for k, v in state.items()})
    return head.eval().requires_grad_(False)


HEADS: "WeakKeyDictionary" = WeakKeyDictionary()  # target Transformer -> its EagleHead


def head_for(pair) -> EagleHead:
    """The pair's EAGLE head: attached with ``attach_head``, or the shipped one for the embedded target.
    It only drafts, on the target's lane: in int8 where the pair drafts so there (``ModelPair.drafting``)."""
    head = HEADS.get(pair.target)
    if head is not None:
        return pair.drafting(head, pair.target_lane)
    if pair.target_name not in (EMBEDDED_NAME, "default"):
        raise MirrorSDError(f"method 'eagle' needs an EAGLE head trained for target {pair.target_name!r}; only the "
                            f"embedded target ({EMBEDDED_NAME}) ships one (train one with python -m mirror_sd.train "
                            f"eagle --target ... --out HEAD, then pass --add-on HEAD, or load_pair(add_ons=[HEAD]))")
    head = load_head(EMBEDDED_HEAD, pair.target)
    HEADS[pair.target] = head
    return pair.drafting(head, pair.target_lane)


def attach_head(pair, head: EagleHead):
    """Use ``head`` for every eagle run on this pair's target."""
    HEADS[pair.target] = head.to(pair.target.device, pair.target.dtype).eval().requires_grad_(False)
