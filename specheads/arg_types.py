"""argparse types shared by the command lines: a bad value is a one-line usage error before anything loads."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: a count that must be at least 1 (a batch, a shard, a length)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a temperature (0 = greedy; a negative one has no meaning)."""
    value = _float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 (0 = greedy), got {text}")
    return value


def probability(text: str) -> float:
    """An argparse type: a top-p mass, in (0, 1] (1 keeps every token)."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] (1 = no cut), got {text}")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def fraction(text: str) -> float:
    """An argparse type: a share held out, in [0, 1) (0 = none)."""
    value = _float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1) (0 = none), got {text}")
    return value


def available_device(text: str) -> str:
    """An argparse type: a device this machine has, as torch names it (``auto``: a GPU when there is one)."""
    from specheads.target import resolve_device_dtype

    try:
        return str(resolve_device_dtype(text, "auto")[0])
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
