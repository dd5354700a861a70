"""JSON as the commands print it: strict JSON, whatever a figure came to."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every NaN and infinite float as ``None``: JSON has neither, and Python's ``json`` writes them as
    bare ``NaN`` / ``Infinity``, which strict parsers (JSON.parse, Go's encoding/json, jq) refuse. A figure comes to
    one from inputs the commands accept (a pool price of 1e308 USD, ``--load 1e-308``, a throughput of 1e-320)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, indent: int | None = 2) -> str:
    """``value`` as strict JSON (:func:`finite`)."""
    return json.dumps(finite(value), indent=indent, allow_nan=False)
