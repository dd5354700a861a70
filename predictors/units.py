"""The one place where human-written sizes and counts become integers.

Counts (tokens, steps, parameters) take decimal suffixes: ``2k`` = 2,000, ``1.5M``, ``2B``/``2G``, ``1T``,
and scientific notation (``1.5e9``). Sequence lengths follow the ML habit instead: ``4k`` = 4,096 tokens.
Byte sizes take SI (``24GB`` = 24e9) and IEC (``80Gi``/``80GiB`` = 80 * 2**30) suffixes.
"""

from __future__ import annotations

import math
import re
import sys

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY_RE = re.compile(rf"^\s*({_NUMBER})\s*([A-Za-z]*)\s*$")

_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_BINARY = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_BYTE_SI = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
            "t": 10**12, "tb": 10**12}
_BYTE_IEC = {"ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30,
             "ti": 2**40, "tib": 2**40}


# Unrendered template values: $VAR / ${VAR} (envsubst), {{ .Values.x }} (helm, Jinja), and the placeholder words
# repositories leave for a sed to fill (PLACEHOLDER_NUM_NODES, <NUM_GPUS>, __REPLICAS__, %NODES%, @NODES@, CHANGEME)
_TEMPLATE_RE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\{\{.*?\}\}|\bPLACEHOLDER\w*|<[A-Za-z_][\w-]*>"
                          r"|__[A-Za-z][A-Za-z0-9_]*__|%[A-Za-z_][A-Za-z0-9_]*%|@[A-Za-z_][A-Za-z0-9_]*@"
                          r"|\b(?:REPLACE[_-]?ME|CHANGE[_-]?ME|TODO|TBD)\b", re.IGNORECASE)


_FLOAT_MAX_INT = int(sys.float_info.max)


class QuantityError(ValueError):
    """A size or count could not be read; the message says what was expected."""


def _split(value: object, what: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise QuantityError(f"{what} must be a number; got {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise QuantityError(f"{what} must be a finite number; got {value!r}")
        if isinstance(value, int) and abs(value) > _FLOAT_MAX_INT:  # float() of it overflows
            raise QuantityError(f"{what} is too large to be a number; got an integer of {len(str(abs(value)))} "
                                "digits")
        return float(value), ""
    if not isinstance(value, str):
        raise QuantityError(f"{what} must be a number or a string like '2k'; got {type(value).__name__}")
    match = _QUANTITY_RE.match(value.replace("_", "").replace(",", ""))
    if not match and _TEMPLATE_RE.search(value):
        raise QuantityError(f"{what} must be a number; got {value!r}, an unfilled template variable (render the "
                            "manifest first: envsubst, helm template, kustomize)")
    if not match:
        raise QuantityError(f"{what} must be a number with an optional unit suffix; got {value!r}")
    number = float(match.group(1))
    if not math.isfinite(number):  # "1e400" reads as infinity
        raise QuantityError(f"{what} must be a finite number; got {value!r}")
    return number, match.group(2)


def _finite(number: float, what: str, original: object) -> float:
    """``number`` (a value times its unit), or an error where the product overflowed to infinity."""
    if not math.isfinite(number):
        raise QuantityError(f"{what} is too large to be a number; got {original!r}")
    return number


def _to_int(number: float, what: str, original: object) -> int:
    rounded = round(_finite(number, what, original))
    if abs(number - rounded) > 1e-6 * max(1.0, abs(number)):
        raise QuantityError(f"{what} must be a whole number; got {original!r}")
    return int(rounded)


def parse_count(value: object, what: str = "value", *, binary_k: bool = False) -> int:
    """Read a count such as ``2k``, ``1.5e9``, ``2B`` or ``7`` as an int.

    With ``binary_k`` (sequence lengths), ``k`` means 1,024 so that ``4k`` is 4,096 tokens.
    """
    number, suffix = _split(value, what)
    key = suffix.lower()
    if binary_k and key == "k":
        factor = 1024
    elif key in _DECIMAL:
        factor = _DECIMAL[key]
    elif key in _BINARY:
        factor = _BINARY[key]
    else:
        raise QuantityError(f"{what} has an unknown suffix {suffix!r} (use k, M, B/G, T or Ki, Mi, Gi)")
    return _to_int(number * factor, what, value)


def parse_float_count(value: object, what: str = "value") -> float:
    """Like :func:`parse_count` but keeps fractions (``2.5e9`` tokens, ``1.5M``)."""
    number, suffix = _split(value, what)
    key = suffix.lower()
    if key not in _DECIMAL:
        raise QuantityError(f"{what} has an unknown suffix {suffix!r} (use k, M, B/G or T)")
    return _finite(number * _DECIMAL[key], what, value)


def parse_bytes(value: object, what: str = "size") -> int:
    """Read a byte size: ``80Gi``, ``80GiB``, ``24GB``, ``1.5e9`` or a plain integer."""
    number, suffix = _split(value, what)
    key = suffix.lower()
    if key in _BYTE_IEC:
        factor = _BYTE_IEC[key]
    elif key in _BYTE_SI:
        factor = _BYTE_SI[key]
    else:
        raise QuantityError(f"{what} has an unknown unit {suffix!r} (use B, KB, MB, GB, TB or Ki, Mi, Gi, Ti)")
    return _to_int(number * factor, what, value)


GIB = 2**30


def format_bytes(n_bytes: float) -> str:
    """Human form used in tables: GiB with two decimals (MiB below 1 GiB, TiB from 10,000 GiB, PiB from 10,000
    TiB, so absurd sizes stay in the table's columns)."""
    if abs(n_bytes) >= 10_000 * 2**40:
        return f"{n_bytes / 2**50:,.1f} PiB"
    if abs(n_bytes) >= 10_000 * GIB:
        return f"{n_bytes / 2**40:.2f} TiB"
    if abs(n_bytes) >= GIB:
        return f"{n_bytes / GIB:.2f} GiB"
    return f"{n_bytes / 2**20:.1f} MiB"
