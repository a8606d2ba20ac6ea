"""The data folders that ``python -m mirror_sd.train data`` writes, as the trainers read them.

A folder holds ``data.jsonl`` (one example a line: ``prompt_ids`` and ``answer_ids``) and
``config.json``, whose ``source`` says where its prompts and answers came from (:data:`ORIGIN`) and
whose ``target`` names the model that wrote the answers (:func:`target_name`): token ids mean
something only to its tokenizer, and a trainer learns that model's answers, so the trainers refuse a
folder made for another target (:func:`check_data_target`).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from ..errors import MirrorSDError
from ..models.loading import EMBEDDED_NAME, is_embedded, model_name

ORIGIN = {  # --source -> what such a folder holds: the data README's first sentence, the EAGLE card's data line
    "corpora": "Prompts from offline corpora (`mirror_sd/train/prompts.py`), answers written by the target model itself",
    "self-instruct": "Prompts written by the target itself from its chat template (`mirror_sd/train/instruct.py`), "
                     "answers written by the target model itself",
    "reference": "Off-policy data: prompts from offline corpora, each with a reference answer taken from the same "
                 "corpus (`mirror_sd/train/reference.py`); no model wrote anything",
}

IGNORE = -100  # the label of a position that no loss counts (cross-entropy's ignore_index)


def data_folders(data_dirs: Path | list[Path]) -> list[Path]:
    """One data folder or several, as a list."""
    return [Path(data_dirs)] if isinstance(data_dirs, (str, Path)) else [Path(d) for d in data_dirs]


def data_source(data_dir: Path) -> str:
    """The ``--source`` a data folder was built from (its config.json; "corpora" when it names none)."""
    config = Path(data_dir) / "config.json"
    return json.loads(config.read_text()).get("source", "corpora") if config.exists() else "corpora"


def target_name(target: str | None) -> str:
    """How a data folder names the target it was made with: the embedded target's name, a local
    folder's own name, or a Hugging Face id."""
    if is_embedded(target):
        return EMBEDDED_NAME
    path = Path(target).expanduser()
    return model_name(path.resolve()) if path.exists() else str(target)


def data_target(data_dir: Path) -> str:
    """The target a data folder's answers come from (its config.json; folders made before the
    option: the embedded target)."""
    config = Path(data_dir) / "config.json"
    return json.loads(config.read_text()).get("target", EMBEDDED_NAME) if config.exists() else EMBEDDED_NAME


def check_data_target(data_dirs: Path | list[Path], target: str | None):
    """Refuse data folders made with another target than ``target`` (a name as ``--target`` takes)."""
    want = target_name(target)
    for data_dir in data_folders(data_dirs):
        made_for = data_target(data_dir)
        if made_for != want:
            raise MirrorSDError(f"{data_dir} holds data made with target {made_for!r}, not {want!r}: its token ids and "
                                f"answers are that model's (build data for this target with python -m mirror_sd.train "
                                f"data {f'--target {target} ' if target else ''}--out DIR)")


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """A prompt's ids as the engine encodes it (``ModelPair.encode``): through the chat template, or
    the turns joined by newlines where the tokenizer has none."""
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer("\n".join(m["content"] for m in messages), add_special_tokens=True)["input_ids"])
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(enc["input_ids"])


def read_examples(data_dirs: Path | list[Path], targets_answers: bool = False) -> list[tuple[list[int], list[int]]]:
    """[(prompt_ids, answer_ids)] from each folder's data.jsonl, folder after folder.

    A partial last line (a writer still running) is skipped. ``targets_answers``: the caller learns
    the answers' tokens as labels, so they must be the target's own; folders of reference answers
    (``data --source reference``) are refused.
    """
    examples = []
    for data_dir in data_folders(data_dirs):
        if targets_answers and data_source(data_dir) == "reference":
            raise MirrorSDError(f"{data_dir} holds reference answers, not the target's: this trainer learns the "
                                "answer tokens themselves (use it for `eagle`, or `draft --labels target`)")
        if not (data_dir / "data.jsonl").exists():
            raise MirrorSDError(f"no data.jsonl in {data_dir}: build it with python -m mirror_sd.train data --out {data_dir}")
        for line in (data_dir / "data.jsonl").read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if row.get("answer_ids"):
                examples.append((row["prompt_ids"], row["answer_ids"]))
    return examples


def build_vocab_map(examples, size: int, always: set[int]) -> torch.Tensor:
    """Target ids of the head rows: the ``size`` most frequent answer tokens (plus ``always``)."""
    counts = Counter(t for _, answer in examples for t in answer)
    keep = [t for t in always] + [t for t, _ in counts.most_common() if t not in always]
    return torch.tensor(sorted(keep[:size]), dtype=torch.long)
