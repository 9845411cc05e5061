"""ember.show_config, cpu_features, the ISA cap and verbose log, and what importing ember leaves alone."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ember


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def test_version_is_the_build_version() -> None:
    assert ember.__version__ == ember._C.build_info()["version"]
    assert ember.__version__.count(".") == 2


def test_show_config_names_every_component() -> None:
    out = io.StringIO()
    ember.show_config(file=out)
    text = out.getvalue()
    for needle in (f"ember {ember.__version__}", f"torch {torch.__version__}", "oneDNN 3.", "oneTBB", "ISA:", "CPU:"):
        assert needle in text, f"{needle!r} missing from:\n{text}"
    c = ember.config()
    assert c["onednn"]["version"].startswith("3."), "ember must run on oneDNN 3.x even beside torch's own oneDNN"
    assert c["threads"]["ember"] == torch.get_num_threads()


def test_cpu_features_are_consistent() -> None:
    f = ember.cpu_features()
    assert f["vendor"] in ("GenuineIntel", "AuthenticAMD") or f["vendor"]
    for sub in ("avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_fp16", "avx512_vnni"):
        assert not f[sub] or f["avx512f"], sub
    assert not f["amx_permitted"] or f["amx_tile"]
    with open("/proc/cpuinfo") as cpuinfo:
        flags = cpuinfo.read().split("flags", 2)[1].split("\n", 1)[0].split()
    assert f["avx2"] == ("avx2" in flags)
    assert f["avx512f"] == ("avx512f" in flags)
    assert f["avx512_bf16"] == ("avx512_bf16" in flags)
    assert f["amx_tile"] == ("amx_tile" in flags)


def test_isa_cap_api() -> None:
    levels = ember.isa.supported_levels()
    assert levels[0] == "ref" and levels[-1] == ember.isa.detected_isa()
    for level in levels:
        with ember.isa.capped(level):
            assert ember.isa.active_isa() == level
    assert ember.isa.active_isa() == ember.isa.detected_isa()
    with pytest.raises(ValueError, match="isa must be one of"):
        ember.isa.set_max_isa("sse2")
    with pytest.raises(TypeError, match="isa must be a str"):
        ember.isa.set_max_isa(3)  # type: ignore[arg-type]


def test_environment_caps_isa_and_turns_on_the_log() -> None:
    proc = run_python(
        """
        import torch, ember
        print(ember.isa.active_isa(), ember.isa.max_isa())
        ember.bf16.round(torch.ones(5))
        """,
        EMBER_MAX_ISA="ref",
        EMBER_VERBOSE="1",
    )
    assert proc.stdout.split() == ["ref", "ref"]
    assert "ember_verbose,bf16.round,ref,n=5" in proc.stderr


def test_the_log_names_the_attention_norm_rotary_and_pooling_kernels() -> None:
    """The attention, norm, rotary and pooling kernels log their calls as the matmuls do (a profile of a forward
    reads each kernel's own time from these lines), with the path that ran and the sizes."""
    proc = run_python(
        """
        import torch, ember
        from ember import _C
        from ember._tensor import dlpack
        ember.isa.set_verbose(True)
        q = torch.randn(1, 2, 5, 8)
        _C.scaled_dot_product_attention(dlpack(q), dlpack(q), dlpack(q), None, True, 0.5, dlpack(torch.empty_like(q)))
        x, w = torch.randn(3, 8), torch.ones(8)
        _C.row_norm("rms", dlpack(x), dlpack(x), dlpack(w), None, 1e-6, dlpack(torch.empty_like(x)))
        table = torch.randn(1, 1, 5, 8)
        _C.rotary_embedding(dlpack(q), dlpack(table), dlpack(table), dlpack(torch.empty_like(q)))
        image = torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last)
        pooled = torch.empty(1, 3, 2, 2).to(memory_format=torch.channels_last)
        _C.max_pool2d(dlpack(image), [2, 2], [2, 2], [0, 0], [1, 1], False, False, dlpack(pooled))
        """
    )
    assert "ember_verbose,scaled_dot_product_attention," in proc.stderr
    assert ",b=1,hq=2,hkv=2,lq=5,lk=5,d=8,causal,float32," in proc.stderr
    assert "ember_verbose,rms_norm," in proc.stderr and ",rows=3,cols=8,residual,float32," in proc.stderr
    assert "ember_verbose,rotate_half," in proc.stderr and ",b=1,h=2,l=5,d=8,float32," in proc.stderr
    assert "ember_verbose,max_pool2d," in proc.stderr and ",n=1,c=3,out=2x2,window=2x2," in proc.stderr


def test_the_log_names_a_matmuls_output_and_where_its_epilogue_ran() -> None:
    """A Linear's line says which post-ops its primitive ran (and its operand's dtype) and which ran after it: a
    forward's profile tells an add fused into the primitive from one in a pass of its own."""
    proc = run_python(
        """
        import torch, ember
        from ember import _C
        from ember._tensor import dlpack
        ember.isa.set_verbose(True)
        layer = _C.Linear(dlpack(torch.randn(6, 8)), None, "float32", True, 64)
        x, residual, out = torch.randn(3, 8), torch.randn(3, 6), torch.empty(3, 6)
        layer.forward(dlpack(x), None, dlpack(out), ["add", "relu"], dlpack(residual), kernel="onednn")
        layer.forward(dlpack(x), None, dlpack(out), [], None, kernel="onednn")
        """
    )
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ember_verbose,linear,")]
    assert len(lines) == 2, proc.stderr
    assert ",m=3,n=6,k=8,float32,out=float32,fused=add(float32),after=relu," in lines[0]
    assert ",m=3,n=6,k=8,float32,out=float32," in lines[1] and "fused=" not in lines[1]


def test_bad_environment_cap_is_reported_and_ignored() -> None:
    proc = run_python("import ember; print(ember.isa.max_isa())", EMBER_MAX_ISA="sse9")
    assert proc.stdout.strip() == "amx"
    assert "ignoring EMBER_MAX_ISA=sse9" in proc.stderr


def test_import_changes_nothing_in_torch() -> None:
    probe = """
        import os, torch
        state = lambda: (torch.get_num_threads(), torch.get_num_interop_threads(), torch.get_default_dtype(),
                         torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled(),
                         torch.backends.mkldnn.enabled, torch.nn.Linear.forward, torch.Tensor.__add__,
                         torch.optim.Adam.step, torch.nn.functional.linear, sorted(os.environ.items()))
        before = state()
        torch.manual_seed(0); x = torch.randn(64, 64); w = torch.nn.Linear(64, 64)
        y_before = w(x)
        import ember
        after = state()
        assert before == after, [(a, b) for a, b in zip(before, after) if a != b]
        assert torch.equal(w(x), y_before)
        print("unchanged")
        """
    assert run_python(probe).stdout.strip() == "unchanged"


def test_threading_backends() -> None:
    assert ember._C.threading_backend() in ("tbb", "openmp")
    with pytest.raises(ValueError, match="backend must be 'tbb' or 'openmp'"):
        ember._C.set_threading_backend("pthreads")
    with pytest.raises(ValueError, match="n must be >= 1"):
        ember._C.set_num_threads(0)


@pytest.mark.parametrize(
    ("kind", "python_error"),
    [("type", TypeError), ("value", ValueError), ("index", IndexError), ("runtime", RuntimeError)],
)
def test_core_exceptions_become_python_exceptions(kind: str, python_error: type) -> None:
    with pytest.raises(python_error) as info:
        ember._C._raise_error(kind, "op: arg must be something")
    assert type(info.value) is python_error  # not a subclass standing in for another
    assert str(info.value) == "op: arg must be something"


def test_onednn_errors_become_runtime_errors() -> None:
    with pytest.raises(RuntimeError, match=r"oneDNN error \(status 2\): could not create a primitive descriptor"):
        ember._C._raise_error("dnnl", "ignored: oneDNN messages are literals")
