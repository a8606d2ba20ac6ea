"""Argument types for ``python -m mirror_sd.train``: a bad value is one argparse line, not a traceback."""
from __future__ import annotations

import argparse
import math


def _number(kind, text: str, smallest, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not math.isfinite(value) or value < smallest:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, 1, "a whole number of at least 1")


def non_negative_int(text: str) -> int:
    return _number(int, text, 0, "a whole number of at least 0")


def positive_float(text: str) -> float:
    value = _number(float, text, 0.0, "a number above 0")
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    return _number(float, text, 0.0, "a number of at least 0")


def layer_list(text: str) -> list[int]:
    """A list of layer numbers, "0,1" -> [0, 1] ("" -> [])."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer numbers such as 0,1; got {text!r}") from None
