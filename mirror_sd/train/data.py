"""The data folders that ``python -m mirror_sd.train data`` writes, as the trainers read them.

A folder holds ``data.jsonl`` (one example a line: ``prompt_ids`` and ``answer_ids``) and
``config.json``, whose ``source`` says where its prompts and answers came from (:data:`ORIGIN`).
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from ..errors import MirrorSDError

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
