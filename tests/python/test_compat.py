"""ember._compat on the running torch (the suite runs under torch 1.13 and 2.x): every private torch name ember
uses answers as its docstring says, and no other module of the package reaches for one."""

import ast
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from ember import _compat

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "ember"
TORCH_2 = int(torch.__version__.split(".")[0]) >= 2


def test_profiler_enabled_follows_the_profiler():
    assert _compat.profiler_enabled() is False
    with torch.autograd.profiler.profile():
        assert _compat.profiler_enabled() is True
    assert _compat.profiler_enabled() is False


def test_tracing_state_is_set_only_while_jit_traces():
    seen = []

    def f(x):
        seen.append(_compat.tracing_state() is not None)
        return x + 1

    assert _compat.tracing_state() is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates jit.trace; 1.13 to 2.x have it
        torch.jit.trace(f, torch.ones(2), check_trace=False)
    assert seen == [True]


def test_interposed_dispatch_sees_a_profiler_and_nothing_otherwise():
    assert _compat.interposed_dispatch() is False
    with torch.autograd.profiler.profile():
        assert _compat.interposed_dispatch() is True


def test_is_compiling_is_false_in_eager_code():
    assert _compat.is_compiling() is False


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile arrived in torch 2.0")
def test_untraced_runs_a_function_as_python_under_torch_compile():
    seen = []

    def note(x: torch.Tensor) -> int:
        seen.append(torch.compiler.is_compiling() if hasattr(torch, "compiler") else False)
        return x.data_ptr()  # what dynamo could not follow on torch 2.8 to 2.11

    assert _compat.untraced(note) is _compat.untraced(note)  # one wrapper, or dynamo recompiles its callers

    def traced(x: torch.Tensor) -> torch.Tensor:
        return x + (_compat.untraced(note)(x) != 0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dynamo's note on the graph break
        compiled = torch.compile(traced, backend="eager")
        x = torch.ones(3)
        torch.testing.assert_close(compiled(x), x + 1)
    assert seen == [False]  # run once, as Python: not traced, not compiling


def test_autograd_below_skips_autograd():
    x = torch.ones(3, requires_grad=True)
    guard = _compat.autograd_below()
    try:
        y = x * 2
    finally:
        del guard
    assert y.grad_fn is None


def test_optimizer_step_hooks_in_torchs_order():
    opt = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1)
    hooks = _compat.optimizer_step_hooks(opt)
    if not TORCH_2:
        assert hooks is None
        return
    own = opt.register_step_pre_hook(lambda *a: None)
    post = opt.register_step_post_hook(lambda *a: None)
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    glob = register_optimizer_step_pre_hook(lambda *a: None)
    try:
        pre_hooks, post_hooks = _compat.optimizer_step_hooks(opt)
        assert len(pre_hooks) == 2 and len(post_hooks) == 1
    finally:
        own.remove(), post.remove(), glob.remove()
    _compat.mark_optimizer_stepped(opt)  # the profiler's entry point exists and takes no argument


def test_state_dict_hooks_rewrite_entries_both_ways():
    linear = nn.Linear(2, 2)
    _compat.register_state_dict_hook(
        linear, lambda m, sd, prefix, meta: sd.__setitem__(prefix + "weight", sd[prefix + "weight"] * 0)
    )
    seen = []
    _compat.register_load_state_dict_pre_hook(linear, lambda m, sd, prefix, *rest: seen.append(sorted(sd)))
    state = linear.state_dict()
    assert torch.equal(state["weight"], torch.zeros(2, 2))
    linear.load_state_dict(state)
    assert seen == [["bias", "weight"]]


def test_module_attributes():
    assert _compat.attention_packs_in_proj(nn.MultiheadAttention(8, 2)) is True
    assert _compat.attention_packs_in_proj(nn.MultiheadAttention(8, 2, kdim=4, vdim=4)) is False
    assert _compat.conv_reversed_padding(nn.Conv2d(1, 1, 3, padding=(1, 2))) == [2, 2, 1, 1]


def test_operator_schema_names_an_overloads_arguments():
    schema = _compat.operator_schema(torch.ops.aten.gelu.default)
    assert [a.name for a in schema.arguments] == ["self", "approximate"]
    assert _compat.operator_schema(torch.relu) is None
    assert _compat.operator_schema("relu") is None


PRIVATE_METHODS = {"_register_state_dict_hook", "_register_load_state_dict_pre_hook", "_optimizer_step_code",
                   "_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_qkv_same_embed_dim",
                   "_reversed_padding_repeated_twice", "_schema"}  # fmt: skip


def _private_torch_names(tree):
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if node.attr in PRIVATE_METHODS:
            yield node
            continue
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        private = node.attr.startswith("_") and not node.attr.startswith("__")
        if private and isinstance(root, ast.Name) and root.id == "torch":
            yield node


@pytest.mark.skipif(not PACKAGE.is_dir(), reason="the source tree is not beside the tests")
@pytest.mark.skipif(not hasattr(torch, "export"), reason="symbolic sizes: torch.export, torch >= 2.1")
def test_size_hint_reads_a_symbolic_size_as_its_example():
    class Rows(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    batch = torch.export.Dim("batch")
    program = torch.export.export(Rows(), (torch.ones(5, 3),), dynamic_shapes=({0: batch},))
    [x] = [n for n in program.graph.nodes if n.op == "placeholder"]
    rows, cols = x.meta["val"].shape
    assert not isinstance(rows, int) and _compat.size_hint(rows) == 5
    assert _compat.size_hint(cols) == 3 and _compat.size_hint(3) == 3 and _compat.size_hint("3") is None


def test_no_other_module_uses_a_private_torch_name():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        for node in _private_torch_names(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
    assert not found, found
