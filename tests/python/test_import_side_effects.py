"""What ``import ember`` does to torch (ember/__init__.py says it): it adds its operators under torch.ops.ember and
changes nothing else: no torch function, module or optimizer is replaced, no thread count or setting changes."""

import json
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import json, torch, torch.nn.functional as F

    def snapshot():
        return {
            "threads": torch.get_num_threads(),
            "interop": torch.get_num_interop_threads(),
            "functions": [id(f) for f in (F.linear, F.conv2d, F.dropout, F.gelu, torch.matmul, torch.add)],
            "modules": [id(m.forward) for m in (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Dropout,
                                                torch.nn.MultiheadAttention, torch.nn.BatchNorm2d)],
            "optimizers": [id(o.step) for o in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)],
            "tensor": [id(getattr(torch.Tensor, n)) for n in ("__add__", "matmul", "to", "bfloat16")],
            "grad": torch.is_grad_enabled(),
            "dtype": str(torch.get_default_dtype()),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
        }

    before = snapshot()
    import ember
    after = snapshot()
    print(json.dumps({"before": before, "after": after, "ops": hasattr(torch.ops.ember, "interaction")}))
    """
)


def test_importing_ember_only_adds_its_own_operators():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["before"] == seen["after"]
    assert seen["ops"], "torch.ops.ember.interaction is defined at import"
