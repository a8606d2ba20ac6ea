"""Model cards: the README.md a trainer writes beside the weights it saves.

A trainer builds its card (:class:`ModelCard`: a title, an opening paragraph and sections) from the
run's training record, the dict its ``train()`` returns and saves beside the weights as JSON
(training.json, or streams.json for streams). What the cards share lives here: the layout and the
writing, the training stages of a run that went on from an earlier one (``--init``), and the
sentences every card repeats.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

DECODING_NUMBERS = "- Decoding numbers (tau, speedup) are in the project README, with the command that measures them."


@dataclass
class ModelCard:
    """A README.md: ``# title``, the opening paragraph, then each section as ``## heading`` and body
    (markdown without a trailing newline), a blank line between parts."""

    title: str
    intro: str
    sections: dict[str, str]

    def text(self) -> str:
        return f"# {self.title}\n\n{self.intro}\n" + "".join(f"\n## {h}\n{body}\n" for h, body in self.sections.items())

    def write(self, out: Path) -> Path:
        path = Path(out) / "README.md"
        path.write_text(self.text())
        return path


def stage_history(earlier: dict | None, record: dict, stage_of: Callable[[dict], dict]) -> list[dict]:
    """The training stages a card lists: those of the run it went on from (``--init``; its own
    ``stages``, or the run itself for a record from before stages were kept), then this run's."""
    before = (earlier.get("stages") or [stage_of(earlier)]) if earlier else []
    return before + [stage_of(record)]


def stage_lines(stages: list[dict], line: Callable[[dict], str]) -> str:
    """The card's list of training stages, one line each."""
    return "\n".join(line(stage) for stage in stages)


def trained_on(record: dict) -> str:
    """Where the run trained (records from before the hardware was kept: the project's CPU)."""
    return record.get("hardware", "2 CPU cores")
