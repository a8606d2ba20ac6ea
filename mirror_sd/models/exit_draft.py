"""Early-exit drafts: the target's own first N layers, read by the exit head trained for layer N.

``--draft exit:N`` (``load_pair(draft="exit:N")``) makes a draft of growing capacity from the target
itself: its embedding and layers [0, N), then the exit head trained for layer N
(models/exit_head.py: the pair's, shipped with the embedded target or attached with ``--add-on``),
the target's final norm and the LM-head rows of the shipped draft's vocabulary (the rows the
embedded target's heads were trained to score; another target's draft reads the whole head). So
one family of drafts, from a tenth of the target's cost per token to most of it, all reading the
same vocabulary, without training a model per size: only a head per layer. ``self:N`` is the same
draft without the trained head (the bare logit lens), which accepts far less.

The head and the norm sit where the draft's final norm sits (``ExitNorm``), so every forward that
reads a draft (plain, int8, staged, captured) runs the head with no branch of its own.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from ..errors import MirrorSDError
from .exit_head import ExitHead
from .llama import Transformer
from .loading import VOCAB_MAP_KEY, load_model, load_state_dict

PREFIX = "exit:"


class ExitNorm(nn.Module):
    """The exit head, then the target's final norm: what an early-exit draft's LM head reads."""

    def __init__(self, head: ExitHead, norm: nn.Module):
        super().__init__()
        self.head, self.norm = head, norm

    @property
    def weight(self) -> torch.Tensor:  # the norm's, for code that reads a final norm's weight
        return self.norm.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.head(h))


def load_exit_draft(spec: str, head: ExitHead | None, target: Transformer, target_dir: Path,
                    rows_from: Path | None, device: torch.device, dtype: torch.dtype) -> Transformer:
    """The draft ``exit:N`` (module docstring) on ``device``: the target's layers [0, N) from
    ``target_dir``, then ``head`` (the pair's exit head for layer N; None: the error that says how
    to get one), the final norm and the LM-head rows of the draft in ``rows_from`` (the rows the
    embedded target's heads were trained to score; None: the whole head)."""
    layer = exit_layer_of(spec, target.num_layers)
    if head is None:
        raise MirrorSDError(f"draft {spec!r} needs an early-exit head trained for layer {layer} of this target: "
                            f"train one with python -m mirror_sd.train exit-head --exit-layer {layer} and pass it "
                            f"with --add-on (load_pair(add_ons=[...])), or use 'self:{layer}' (no head)")
    model, _ = load_model(target_dir, device, dtype, num_layers=layer)
    weight = target.lm_head.weight.detach()
    if rows_from is not None:  # a reduced vocabulary: the rows of these target ids
        vocab_map = load_state_dict(rows_from, torch.device("cpu"))[VOCAB_MAP_KEY].long()
        weight = weight[vocab_map.to(weight.device)]  # [rows, d]
        model.vocab_map = vocab_map.to(device)
    model.lm_head.weight = nn.Parameter(weight.to(device, dtype).clone(), requires_grad=False)
    model.lm_head.out_features = weight.shape[0]
    model.model.norm = ExitNorm(copy.deepcopy(head).to(device), model.model.norm)
    return model


def exit_layer_of(spec: str, total: int) -> int:
    """N of ``exit:N``, checked against the target's ``total`` layers."""
    try:
        layer = int(spec[len(PREFIX):])
    except ValueError:
        layer = -1
    if not 1 <= layer < total:
        raise MirrorSDError(f"draft {spec!r}: 'exit:N' needs 1 <= N < {total} (the target's layer count)")
    return layer
