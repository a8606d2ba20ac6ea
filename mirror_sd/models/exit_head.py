"""Mirror-SD's trained early exit: a head on the exit layer, before the target's own norm and LM head.

Mirror-SD's early exit reads the hidden state h [.., d] after ``exit_layer`` target layers with the
target's own final norm and LM head (``methods/mirror.py: early_exit``): a "logit lens", never
trained to read a middle layer. An exit head moves h first, and the same norm and head read it:

    head(h) = h + rms(h) * correction(h / rms(h))

with one of two corrections (``new_exit_head``):

    low rank ("tuned lens", Belrose et al., 2023)   up(down(x))                down: d -> rank; up: rank -> d
    SwiGLU (an MLP as the target's layers have)    down(silu(gate(x)) * up(x))  gate, up: d -> mlp; down: mlp -> d

The last projection has a bias and starts at zero, so an untrained head is exactly the logit lens.
The correction is scaled by rms(h), so what the final norm (which divides the scale out) sees
depends on h's direction only: the head learns from the cached early features (h through the exit
layer's own input norm, ``train/features.py``), from which h / rms(h) is the feature divided by
that norm's weight. The SwiGLU head is nonlinear, so it reaches further into what the layers above
the exit would have made of h (docs/experiments/mirror_hits.md).

A head belongs to one target and one exit layer: config.json records both (the target's shape and
a few of its norm weights, which tell targets of the same shape apart), and loading checks them.
A pair keeps a head per exit layer (``pair.exit_heads``); the embedded target ships heads for a few
layers (``embedded_exit_heads``: the default exit layer 22, and earlier ones, whose longer suffix
leaves a GPU's rollouts more time to hide under).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import MirrorSDError
from .linear import Linear, linear
from .llama import Transformer

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_EXIT_HEAD = ASSETS / "exit-head-smollm2-135m"  # exit layer 22, mirror's default


@functools.cache
def embedded_exit_heads() -> dict[int, Path]:
    """Exit layer -> folder of each head shipped for the embedded target (``exit-head-smollm2-135m*``);
    read once: the shipped assets do not change while the process runs."""
    heads = {}
    for folder in sorted(ASSETS.glob("exit-head-smollm2-135m*")):
        if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
            heads[json.loads((folder / "config.json").read_text())["exit_layer"]] = folder
    return heads


def _linear(n_in: int, n_out: int, zero: bool = False) -> Linear:
    # the input has the residual stream's outlier channels: fp32 even when drafting in int8 (models/linear.py)
    layer = Linear(n_in, n_out, bias=zero, int8=False)
    if zero:  # the correction's last projection: an untrained head is the logit lens
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
    return layer


class ExitHead(nn.Module):
    """head(h) = h + rms(h) * correction(h / rms(h)); the subclasses give the correction and ``size``,
    what config.json records of it."""

    architecture = ""

    def __init__(self, exit_layer: int, eps: float):
        super().__init__()
        self.exit_layer, self.eps = exit_layer, eps

    @property
    def size(self) -> dict:
        raise NotImplementedError

    def correction(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Hidden states after the exit layer [.., d] -> hidden states for the final norm [.., d]."""
        h = h.to(self.device)
        rms = (h.float().pow(2).mean(-1, keepdim=True) + self.eps).sqrt()  # [.., 1]
        delta = self.correction((h.float() / rms).to(next(self.parameters()).dtype))  # [.., d]
        return h + (delta.float() * rms).to(h.dtype)


class LowRankExitHead(ExitHead):
    architecture = "tuned lens: h + rms(h) * up(down(h / rms(h))) before the target's final norm and LM head"

    def __init__(self, hidden_size: int, rank: int, exit_layer: int, eps: float):
        super().__init__(exit_layer, eps)
        self.down, self.up = _linear(hidden_size, rank), _linear(rank, hidden_size, zero=True)

    @property
    def size(self) -> dict:
        return dict(rank=self.down.out_features)

    def correction(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


class SwiGLUExitHead(ExitHead):
    architecture = ("SwiGLU: h + rms(h) * down(silu(gate(x)) * up(x)), x = h / rms(h), before the target's final "
                    "norm and LM head")

    def __init__(self, hidden_size: int, mlp: int, exit_layer: int, eps: float):
        super().__init__(exit_layer, eps)
        self.gate, self.up = _linear(hidden_size, mlp), _linear(hidden_size, mlp)
        self.down = _linear(mlp, hidden_size, zero=True)

    @property
    def size(self) -> dict:
        return dict(mlp=self.gate.out_features)

    def correction(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def new_exit_head(target: Transformer, exit_layer: int, rank: int = 64, mlp: int = 0) -> ExitHead:
    """A fresh head (the logit lens) for ``target`` at ``exit_layer``, on its device and dtype: SwiGLU
    with ``mlp`` hidden units where ``mlp`` > 0, else low rank ``rank``."""
    if not 0 < exit_layer < target.num_layers:
        raise MirrorSDError(f"exit layer must be in 1..{target.num_layers - 1} (the target has "
                            f"{target.num_layers} layers), got {exit_layer}")
    d, eps = target.args.hidden_size, target.args.rms_norm_eps
    head = SwiGLUExitHead(d, mlp, exit_layer, eps) if mlp > 0 else LowRankExitHead(d, rank, exit_layer, eps)
    return head.to(target.device, target.dtype)


class EarlyExit(nn.Module):
    """What Mirror-SD's token channel reads the exit layer's hidden states with: the trained head
    (if given), then the target's final norm and LM-head ``rows`` (the draft's vocabulary, or the
    whole head), then log_softmax: [B, T, d] -> log-probs [B, T, rows] (fp32); ``vocab_map``: the
    target id of each row (None: the whole head). A module, so that a stage can run it in place of
    the LM head (models/forwards.py)."""

    def __init__(self, target: Transformer, rows: torch.Tensor, head: ExitHead | None = None,
                 vocab_map: torch.Tensor | None = None):
        super().__init__()
        self.norm, self.rows, self.head, self.vocab_map = target.model.norm, rows, head, vocab_map

    @property
    def stage_name(self) -> str:
        return "trained early exit" if self.head is not None else "early exit"

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.head is not None:
            h = self.head(h)
        return torch.log_softmax(linear(self.norm(h), self.rows).float(), dim=-1)


def signature(target: Transformer, exit_layer: int) -> list[float]:
    """A few weights the head reads through (the final norm's, the exit layer's input norm's): they
    tell one target from another of the same shape."""
    w = torch.cat([target.model.norm.weight[:8], target.model.layers[exit_layer].input_layernorm.weight[:8]]).detach()
    return [round(float(x), 4) for x in w]


def target_shape(target: Transformer) -> dict:
    a = target.args
    return dict(hidden_size=a.hidden_size, num_layers=a.num_layers, vocab_size=a.vocab_size)


def save_exit_head(head: ExitHead, out: Path, target: Transformer, target_name: str, card: dict):
    """fp32 weights, config.json (the target and exit layer it belongs to) and training.json in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.float().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = dict(architecture=head.architecture, target=target_name, exit_layer=head.exit_layer, **head.size,
                  **target_shape(target), signature=signature(target, head.exit_layer), torch_dtype="float32")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "training.json").write_text(json.dumps(card, indent=2))


def load_exit_head(folder: Path, target: Transformer) -> ExitHead:
    """The head in ``folder`` on the target's device and dtype; refuse one made for another target."""
    folder = Path(folder)
    if not (folder / "config.json").exists() or not (folder / "model.safetensors").exists():
        raise MirrorSDError(f"no early-exit head in {folder} (needs config.json and model.safetensors)")
    config = json.loads((folder / "config.json").read_text())
    wrong = {k: (config.get(k), v) for k, v in target_shape(target).items() if config.get(k) != v}
    layer = config.get("exit_layer")
    if not wrong and not (isinstance(layer, int) and 0 < layer < target.num_layers):
        wrong = dict(exit_layer=(layer, f"1..{target.num_layers - 1}"))
    if not wrong and not torch.allclose(torch.tensor(config.get("signature", [])), torch.tensor(signature(target, layer)),
                                        rtol=1e-2, atol=1e-3):
        wrong = dict(norm_weights="differ")
    if wrong:
        raise MirrorSDError(f"the early-exit head in {folder} was trained for another target "
                            f"({config.get('target')!r}): (head, target) differ in {wrong}")
    head = new_exit_head(target, layer, rank=config.get("rank", 64), mlp=config.get("mlp", 0))
    head.load_state_dict({k: v.to(target.dtype) for k, v in load_file(str(folder / "model.safetensors")).items()})
    return head.eval().requires_grad_(False)


def attach_exit_head(pair, head: ExitHead):
    """Use ``head`` for every mirror run on this pair at the head's exit layer (in place of a shipped one
    there; ``load_exit_head`` checks that a saved head belongs to the pair's target)."""
    pair.exit_heads[head.exit_layer] = head.to(pair.target.device, pair.target.dtype).eval().requires_grad_(False)


def available_exit_head(pair, exit_layer: int) -> ExitHead | None:
    """The trained head for ``exit_layer`` if this pair has one (attached, or shipped with the embedded
    target, loaded once and kept on the pair), else None: Mirror-SD then reads the exit through the
    logit lens. A pair with ``exit_heads[layer]`` None has no head at that layer."""
    if exit_layer not in pair.exit_heads and pair.embedded_target:
        folder = embedded_exit_heads().get(exit_layer)
        if folder is not None:
            pair.exit_heads[exit_layer] = load_exit_head(folder, pair.target)
    return pair.exit_heads.get(exit_layer)
