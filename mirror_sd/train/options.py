"""The options of ``python -m mirror_sd.train``: argument types (a bad value is one argparse line,
not a traceback), and the options the trainers share (:class:`TrainerOptions`, with each trainer's
:class:`Defaults`).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass


def _number(kind, text: str, valid, what: str):
    """``kind(text)`` if it is a finite number for which ``valid`` holds, else an argparse error."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not (math.isfinite(value) and valid(value)):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 1, "a whole number of at least 1")


def non_negative_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 0, "a whole number of at least 0")


def positive_float(text: str) -> float:
    return _number(float, text, lambda v: v > 0, "a number above 0")


def non_negative_float(text: str) -> float:
    return _number(float, text, lambda v: v >= 0, "a number of at least 0")


def layer_list(text: str) -> list[int]:
    """A list of layer numbers, "0,1" -> [0, 1] ("" -> [])."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer numbers such as 0,1; got {text!r}") from None


@dataclass(frozen=True)
class Defaults:
    """One trainer's defaults for the options the trainers share; its ``train()`` takes the same
    values as keyword defaults, so the command line and the function agree."""

    epochs: float
    lr: float
    eval_every: int
    vocab_size: int = 8192
    batch_tokens: int = 4096
    max_len: int = 512
    holdout: float = 0.03
    seed: int = 0
    threads: int = 2
    device: str = "cpu"


# The options the trainers share: argparse keywords, with the help's {holds}, {rows} and {computes}
# filled in by each trainer; the default is that trainer's Defaults field of the same name (vocab:
# vocab_size), the keyword its train() takes for the option.
SHARED_OPTIONS = dict(
    data=dict(required=True, nargs="+",
              help="folder(s) with data.jsonl from the data subcommand, read in the order given"),
    out=dict(required=True, help="output folder: {holds}"),
    target=dict(default=None, help="the target to train for: a Hugging Face id or a local model folder (default: "
                                   "the embedded SmolLM2-135M-Instruct); --data must hold its answers "
                                   "(python -m mirror_sd.train data --target ...)"),
    vocab=dict(type=positive_int, help="{rows} (default %(default)s)"),
    epochs=dict(type=positive_float, help="passes over the training examples; fractions allowed (default %(default)s)"),
    lr=dict(type=positive_float, help="peak AdamW learning rate: a linear warm-up to it, then a cosine decay to a "
                                      "tenth of it (default %(default)s)"),
    batch_tokens=dict(type=positive_int, help="tokens per batch, examples of similar length together "
                                              "(default %(default)s)"),
    max_len=dict(type=positive_int, help="tokens of context per example, the end kept (default %(default)s)"),
    eval_every=dict(type=positive_int, help="steps between held-out evaluations, each saving the checkpoint and "
                                            "loss.png (default %(default)s)"),
    features=dict(default=None, help="cache of the target's features and argmax per token, shared by draft and "
                                     "eagle (default: ~/.cache/mirror-sd/eagle-features/<target>)"),
    seed=dict(type=int, help="random seed of the held-out split, the batch order and any random initial weights "
                             "(default %(default)s)"),
    threads=dict(type=positive_int, help="torch CPU threads (default %(default)s)"),
    device=dict(help="where {computes}: cpu (default) or cuda[:N]; fp32 either way"),
)
_KEYWORD = dict(vocab="vocab_size", target="target_dir")  # option -> train() keyword, where they differ


class TrainerOptions:
    """Adds the options the trainers share (:data:`SHARED_OPTIONS`) to one trainer's subcommand, with
    that trainer's :class:`Defaults` and wording: ``holds`` (what its output folder holds), ``rows``
    (what its head's vocabulary is), ``computes`` (what runs on ``--device``). A trainer adds them in
    runs among its own options, so its ``--help`` lists them in the order it chooses."""

    def __init__(self, parser: argparse.ArgumentParser, defaults: Defaults, *, holds: str, rows: str, computes: str):
        self.parser, self.defaults = parser, defaults
        self.words = dict(holds=holds, rows=rows, computes=computes)

    def add(self, *names: str):
        for name in names:
            kwargs = dict(SHARED_OPTIONS[name])
            kwargs["help"] = kwargs["help"].format(**self.words)
            keyword = _KEYWORD.get(name, name)
            if hasattr(self.defaults, keyword):
                kwargs["default"] = getattr(self.defaults, keyword)
            self.parser.add_argument("--" + name.replace("_", "-"), **kwargs)


def train_kwargs(args: argparse.Namespace) -> dict:
    """The ``train()`` keywords of the shared options a trainer's parser added, but --data and --out
    (which every ``train()`` takes first, as paths). --target becomes the target's folder (None: the
    embedded target), once --data is checked to hold that target's answers."""
    kwargs = {_KEYWORD.get(name, name): getattr(args, name) for name in SHARED_OPTIONS
              if name not in ("data", "out") and hasattr(args, name)}
    if "target_dir" in kwargs:
        from ..models.loading import is_embedded, resolve_model_dir
        from .data import check_data_target

        check_data_target(args.data, args.target)
        kwargs["target_dir"] = None if is_embedded(args.target) else resolve_model_dir(args.target)
    return kwargs
