"""How a program tells ``ember-run --autotune`` how fast it runs.

The launcher starts each candidate layout with EMBER_AUTOTUNE=1 in the environment and reads the program's
standard output for lines of the form::

    EMBER_THROUGHPUT <number> [unit]

A candidate's score is, for each instance, the median of the numbers it printed after the first (the first is
taken as warm-up, unless it is the only one), summed over its instances. Higher is better. Print such a line
every so often (every few iterations or seconds) or call :func:`report_throughput`, which prints it only while
autotuning so the normal run's output stays clean. Any program can speak the protocol; it need not import ember.
"""

from __future__ import annotations

import os
import re
import sys

__all__ = ["THROUGHPUT_LINE", "autotuning", "parse_throughput", "report_throughput"]

THROUGHPUT_LINE = re.compile(r"^EMBER_THROUGHPUT\s+([-+0-9.eE]+)(?:\s+(\S+))?\s*$")


def autotuning() -> bool:
    """True while the program runs as an ``ember-run --autotune`` candidate (it may then shorten its run)."""
    return os.environ.get("EMBER_AUTOTUNE") == "1"


def report_throughput(value: float, unit: str = "items/s") -> None:
    """Reports a throughput figure to ``ember-run --autotune`` (no-op outside autotuning).

    Args:
        value: work done per second since the last report (or over the run so far); higher is better.
        unit: shown in the autotune table.
    """
    if autotuning():
        print(f"EMBER_THROUGHPUT {float(value):.6g} {unit}", file=sys.stdout, flush=True)


def parse_throughput(line: str) -> tuple[float, str] | None:
    """(value, unit) from a protocol line, or None for any other line."""
    match = THROUGHPUT_LINE.match(line.strip())
    if match is None:
        return None
    try:
        return float(match.group(1)), match.group(2) or ""
    except ValueError:
        return None
