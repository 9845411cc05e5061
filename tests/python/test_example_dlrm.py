"""examples/dlrm.py runs end to end at a small size and prints its comparison table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dlrm.py"


def test_the_dlrm_example_trains_both_models_and_prints_the_table():
    run = subprocess.run(
        [sys.executable, "-W", "ignore", str(EXAMPLE), "--steps", "12", "--batch", "64", "--max-rows", "500"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {m.group(1): (float(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^(torch|ember) \(.*?\)\s+([\d.]+)\s+([\d.]+)$", run.stdout, re.M)}  # fmt: skip
    assert set(rows) == {"torch", "ember"}, run.stdout
    (torch_rate, torch_loss), (ember_rate, ember_loss) = rows["torch"], rows["ember"]
    assert torch_rate > 0 and ember_rate > 0
    # Same weights and batches: the bf16 run follows the fp32 one (here after 12 small steps, far from converged).
    assert abs(ember_loss - torch_loss) <= 0.1 * torch_loss
    assert re.search(r"ember / torch: [\d.]+x", run.stdout)
