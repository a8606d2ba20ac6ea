"""The target run over the distilled examples, once: its feature and its argmax at every position.

The target runs causally, with no cache, over every example (prompt + answer, the last ``max_len``
tokens kept) and stores per token the feature f_i (the final-normed hidden state the LM head reads,
fp16), the target's argmax at that position (full head, exact) and, for a head with early layers,
its early features (``models/eagle.py``; fp16; such shards carry the layers in their name).
Shards of SHARD_EXAMPLES examples, named by a hash of their token ids, so one cache serves any
data set: a rerun, a grown data set or a mix that starts with the same folders reuses every shard
of the same SHARD_EXAMPLES examples, and never another data set's (a folder read after one whose
size is not a multiple of SHARD_EXAMPLES is cut into new shards). The EAGLE head learns from the features and the
argmax; the draft (``--labels target``) learns the argmax at every position, prompt tokens included.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..models.eagle import target_features
from ..models.loading import cache_root

SHARD_EXAMPLES = 64


def features_dir(features: Path | None, target_dir: Path) -> Path:
    """``features``, or the default cache for the target: ~/.cache/mirror-sd/eagle-features/<target>."""
    return Path(features) if features else cache_root() / "eagle-features" / target_dir.name


@torch.no_grad()
def causal_features(target, ids: torch.Tensor, early_layers=()):
    """ids [B, T] -> features [B, T, d] (final-normed hidden states), the target's argmax [B, T] and
    early features [B, T, len(early_layers) * d] (None without early layers)."""
    feats, early = target_features(target, ids, None, early_layers)
    return feats, target.lm_head(feats).argmax(-1), early


def shard_name(seqs: list[list[int]], early_layers=()) -> str:
    """A shard's file name: a hash of its sequences' token ids (the same examples, the same name)."""
    digest = hashlib.sha256(repr(seqs).encode()).hexdigest()[:20]
    early = f"-early{'_'.join(map(str, early_layers))}" if early_layers else ""
    return f"shard-{len(seqs)}-{digest}{early}.safetensors"


def extract_features(target, examples, folder: Path, max_len: int, batch_tokens: int = 4096,
                     early_layers=()) -> list[Path]:
    """Write shards of SHARD_EXAMPLES examples: ids, argmax (int32), feats (fp16), offsets and, with
    early layers, early (fp16). Resumable."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    starts = range(0, len(examples), SHARD_EXAMPLES)
    for start in tqdm(starts, desc="target features", unit="shard"):
        seqs = [(p + a)[-max_len:] for p, a in examples[start:start + SHARD_EXAMPLES]]
        path = folder / shard_name(seqs, early_layers)
        shards.append(path)
        if path.exists():
            continue
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        feats, argmax, early = [None] * len(seqs), [None] * len(seqs), [None] * len(seqs)
        i = 0
        while i < len(order):  # batches of similar length, right-padded (causal: padding is harmless)
            T = len(seqs[order[i]])
            group = order[i:i + max(1, batch_tokens // max(T, 1))]
            T = max(len(seqs[j]) for j in group)
            ids = torch.tensor([seqs[j] + [0] * (T - len(seqs[j])) for j in group], device=target.device)
            f, a, e = causal_features(target, ids, early_layers)
            f, a = f.half().cpu(), a.int().cpu()  # shards are kept on the CPU, whatever computed them
            e = e.half().cpu() if e is not None else None
            for row, j in enumerate(group):
                feats[j] = f[row, :len(seqs[j])]
                argmax[j] = a[row, :len(seqs[j])]
                if e is not None:
                    early[j] = e[row, :len(seqs[j])]
            i += len(group)
        offsets = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
        partial = path.with_suffix(".partial")  # a killed run leaves no half-written shard behind
        tensors = dict(ids=torch.tensor([t for s in seqs for t in s], dtype=torch.int32),
                       argmax=torch.cat(argmax), feats=torch.cat(feats).contiguous(), offsets=offsets)
        if early_layers:
            tensors["early"] = torch.cat(early).contiguous()
        save_file(tensors, str(partial))
        partial.replace(path)
    return shards


def load_sequences(shards: list[Path], feats: bool = True) -> list[dict]:
    """One dict per example: ids [L], argmax [L] and (feats=True) feats [L, d] and, where the shards
    hold them, early [L, n * d] (fp16)."""
    seqs = []
    for path in shards:
        s = load_file(str(path))
        off = s["offsets"].tolist()
        for a, b in zip(off[:-1], off[1:]):
            seq = dict(ids=s["ids"][a:b].long(), argmax=s["argmax"][a:b].long())
            if feats:
                seq["feats"] = s["feats"][a:b]
                if "early" in s:
                    seq["early"] = s["early"][a:b]
            seqs.append(seq)
    return seqs
