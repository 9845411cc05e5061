"""examples/generate.py runs end to end on its small random Llama: the prompt and the new tokens printed, the
speed line after them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "generate.py"


def test_the_generate_example_streams_tokens_and_prints_the_rate() -> None:
    pytest.importorskip("transformers")
    run = subprocess.run([sys.executable, "-W", "ignore", str(EXAMPLE), "--max-new-tokens", "12", "Hello"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("Hello")
    assert len(run.stdout.encode(errors="replace")) > len("Hello")
    speed = re.search(r"5 prompt tokens, 12 new: first token after \d+ ms, then ([\d.]+) tokens/s", run.stderr)
    assert speed is not None, run.stderr[-2000:]
    assert float(speed.group(1)) > 0
