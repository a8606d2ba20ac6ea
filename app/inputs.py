"""The race's settings, checked: a value out of range is brought into range with a message that says so,
so the visitor sees the value used (the box is updated too) and never a traceback.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import gradio as gr


@dataclass(frozen=True)
class Limit:
    label: str  # as the page names the box
    low: float
    high: float
    default: float
    whole: bool = False  # an integer setting


LIMITS = {
    "max_new": Limit("Max new tokens", 1, 512, 48, whole=True),
    "temperature": Limit("Temperature", 0.0, 2.0, 0.0),
    "top_p": Limit("top_p", 0.01, 1.0, 1.0),
    "seed": Limit("seed", 0, 2**31 - 1, 0, whole=True),
    "runs": Limit("Runs", 1, 5, 1, whole=True),
}


def settle(name: str, value) -> tuple[float | int, str | None]:
    """(the value to use, a message when it differs from what was given, else None)."""
    limit = LIMITS[name]
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number):
        used = limit.default
        given = "the box is empty" if value is None or not str(value).strip() else f"{str(value)!r} is not a number"
        why = f"{limit.label}: {given}; using the default {_show(limit.default)}."
    elif number < limit.low or number > limit.high:
        used = min(max(number, limit.low), limit.high)
        used = round(used) if limit.whole else used
        why = (f"{limit.label}: {_show(number)} is out of range ({_show(limit.low)} to {_show(limit.high)}); "
               f"using {_show(used)}.")
    elif limit.whole and number != round(number):
        used, why = round(number), f"{limit.label}: {_show(number)} is not a whole number; using {round(number)}."
    else:
        return (round(number) if limit.whole else number), None
    return (int(used) if limit.whole else float(used)), why


def settle_all(**values) -> tuple[dict, list[str]]:
    """Every given setting settled: ({name: value to use}, [messages])."""
    used, messages = {}, []
    for name, value in values.items():
        used[name], why = settle(name, value)
        if why:
            messages.append(why)
    return used, messages


def _show(x: float) -> str:
    return f"{x:g}"


class ClampedSlider(gr.Slider):
    """A slider whose value typed into its box beyond its range is brought into the range. Gradio's own
    slider refuses such a value before any handler runs, and every view the slider drives shows an
    error instead. (Gradio writes a type stub, inputs.pyi, beside a module that defines a component;
    .gitignore leaves it out.)"""

    is_template = True  # drawn by Gradio's own slider in the browser

    def preprocess(self, payload: float) -> float:
        if isinstance(payload, (int, float)):
            payload = min(max(payload, self.minimum), self.maximum)
        return super().preprocess(payload)


def show_in_range(slider: ClampedSlider):
    """Its box shows the value in range that a typed value was brought to (a value already in range comes
    back unchanged, which starts no further event)."""
    slider.change(lambda value: value, [slider], [slider], queue=False, api_name=False)
