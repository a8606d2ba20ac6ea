"""Argument types for ``python -m mirror_sd.train``: a bad value is one argparse line, not a traceback."""
from __future__ import annotations

import argparse
import math


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
