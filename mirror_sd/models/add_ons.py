"""Trained add-ons for a pair's target, loaded from the folders ``python -m mirror_sd.train`` writes.

Three kinds, told apart by the files in the folder:

* an EAGLE head (``train eagle``): config.json with ``target_vocab_size``, model.safetensors; for ``eagle``;
* an early-exit head (``train exit-head``): config.json with ``exit_layer``, model.safetensors; for
  ``mirror`` at that exit layer (one folder per layer);
* speculative streams (``train ss``): streams.json, streams.safetensors; for ``ss``.

The embedded target's ship in ``mirror_sd/assets/`` and load on first use; for any other target,
``load_pair(..., add_ons=[folder, ...])`` or the command line's ``--add-on FOLDER`` attaches them.
Each loader refuses an add-on made for another target, with a message that says how they differ.
A draft's own streams need no add-on: the engine finds them in the draft's folder (``streams/``).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..devices import on_cpu_worker
from ..errors import MirrorSDError
from .eagle import attach_head, load_head
from .exit_head import attach_exit_head, load_exit_head
from .streams import use_streams

KINDS = ("EAGLE head", "early-exit head", "speculative streams")


def add_on_kind(folder: Path) -> str:
    """Which of :data:`KINDS` ``folder`` holds, or a clear error."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise MirrorSDError(f"add-on {folder}: no such folder")
    if (folder / "streams.json").exists():
        return "speculative streams"
    try:
        config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    except ValueError as e:
        raise MirrorSDError(f"add-on {folder}: its config.json is not JSON ({e})") from None
    if "exit_layer" in config:
        return "early-exit head"
    if "target_vocab_size" in config:
        return "EAGLE head"
    raise MirrorSDError(f"{folder} is not an add-on this engine knows: expected an EAGLE head, an early-exit head "
                        f"or speculative streams, as python -m mirror_sd.train eagle, exit-head or ss writes them")


def attach_add_on(pair, folder: Path | str) -> str:
    """Load the add-on in ``folder`` for ``pair``'s target and use it from now on; returns its kind
    (and, for an early-exit head, its layer), e.g. "early-exit head (layer 14)"."""
    folder = Path(folder).expanduser()
    kind = add_on_kind(folder)
    if kind == "speculative streams":
        use_streams(pair, folder)
    elif kind == "EAGLE head":
        attach_head(pair, on_cpu_worker(load_head, folder, pair.target))
    else:
        head = on_cpu_worker(load_exit_head, folder, pair.target)
        attach_exit_head(pair, head)
        kind = f"{kind} (layer {head.exit_layer})"
    pair.add_ons.append(f"{kind}: {folder}")  # in every trace's meta (ModelPair.describe)
    return kind
