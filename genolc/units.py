"""Parsing of human-written sizes: sequence lengths count tokens with k = 1024 (``512k`` = 524288)."""

from __future__ import annotations

import re

from genolc.errors import ConfigError

_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)\s*$", re.IGNORECASE)


def parse_length(text: str | int, what: str = "length") -> int:
    """Parse ``512k``, ``1M``, ``1m``, ``524288`` (or an int) into a positive number of tokens.

    Suffixes are binary (k = 1024, M = 1024²) because window lengths are powers of two in practice.
    """
    if isinstance(text, int):
        value = text
    else:
        match = _PATTERN.match(str(text))
        if not match:
            raise ConfigError(
                f"cannot read {what} {text!r}",
                fix="write a whole number of tokens, optionally with k or M (k = 1024), e.g. 512k, 1M, 524288",
            )
        number, suffix = match.groups()
        scaled = float(number) * _SUFFIX[suffix.lower()]
        if scaled != int(scaled):
            raise ConfigError(f"{what} {text!r} is not a whole number of tokens", fix="use e.g. 512k or 524288")
        value = int(scaled)
    if value <= 0:
        raise ConfigError(f"{what} must be positive, got {text!r}")
    return value


def format_length(tokens: int) -> str:
    """Inverse of :func:`parse_length` for display: 524288 -> '512k', 1048576 -> '1M', 1000 -> '1000'."""
    for suffix, scale in (("M", 1024**2), ("k", 1024)):
        if tokens >= scale and tokens % scale == 0:
            return f"{tokens // scale}{suffix}"
    return str(tokens)
