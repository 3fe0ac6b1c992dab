"""The spread of one figure over repeated runs: median, range and every value, so that no table
rests on one lucky run."""

from __future__ import annotations

import statistics


def spread(values: list[float], digits: int = 3) -> dict:
    """{"median", "min", "max", "runs"} of `values`, rounded to `digits`."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": [round(v, digits) for v in values]}
