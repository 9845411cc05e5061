"""Capturing a model's forward as an FX graph, the input of graph mode's passes.

Two ways to capture, tried in order; each that fails leaves its reason in the result, which the report shows:

1. ``torch.fx`` symbolic tracing (torch 1.13 and 2.x). It needs no input and keeps torch's modules as calls
   (``call_module``), so a graph reads as the model's own code. It fails on Python control flow over tensor values or
   shapes (``if x.shape[1] > 4``), which many Hugging Face models have. A function the model's library wrapped
   (``torch.fx.wrap``) stays one call; where one takes the model's parameters (torchvision's Swin attention), what it
   computes is hidden from the passes, and torch.export's graph, which traces through it, is preferred where it
   captures.
2. ``torch.export`` (torch 2.x), driven by ``sample_input``. It traces through Python control flow that depends on
   shapes or configuration, specializing the branch taken, and gives a graph of ATen operators. Batch and sequence
   sizes are left dynamic (every dimension of every tensor input that torch finds free to vary), so other sizes run
   the same graph without capturing again. An image's height and width are the sample's (a server resizes its
   images to one resolution; :func:`_is_image`). Where torch's reasoning over the symbolic sizes runs past a budget
   (:data:`DYNAMIC_EXPORT_BUDGET_S`), the batch alone is left dynamic. Inputs of sizes a graph fixed run the model's
   forward (the report says so).

When neither captures, graph mode is not used and the module-level rewrite runs as before.

A captured graph is checked before it is used: where ``sample_input`` is given, the graph's outputs must equal the
model's, exactly, on it. Capturing runs the forward's Python as a trace does, and copies nothing: the graph holds
the model's own parameters and buffers.
"""

from __future__ import annotations

import contextlib
import inspect
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

__all__ = ["Capture", "capture", "split_sample_input"]

# What a Capture's path is named in the report.
SYMBOLIC_TRACE = "torch.fx symbolic trace"
EXPORT = "torch.export"
MODULES = "module rewrite"

# How long torch.export may take with every size dynamic before capture asks for a dynamic batch alone. Its symbolic
# shape reasoning is seconds on most models (Hugging Face BERT, GPT-2, an 8-layer Llama: 2-3 s on a 2-core Zen 5) and
# minutes on a few (Hugging Face Swin's window padding: 280 s a part; batch alone: 2.7 s).
DYNAMIC_EXPORT_BUDGET_S = 15.0
# The same budget where symbolic tracing gave a graph but one that hides layers in a wrapped function: past it the
# export fixes every size but the batch (torchvision's Swin-T: its export needs minutes with every size dynamic; with
# the batch alone, 2-3 s on a 2-core Sapphire Rapids, and the graph ran 1.27x the trace's there, whose attention
# runs in torch). Short, as the trace's graph is there to fall back on: with 5 s, Swin-T's setup took 10.4 s on the
# 16-core Xeon, past the 10 s ember.optimize is allowed.
PREFERRED_EXPORT_BUDGET_S = 2.0


@dataclass
class Capture:
    """The result of capture(): the graph, the path that gave it, and why the paths before it did not."""

    graph: fx.GraphModule | None
    path: str
    failures: list[tuple[str, str]] = field(default_factory=list)  # (path, why it did not capture)

    def describe(self) -> str:
        """One line for the report: the path taken, then each path that failed and why."""
        text = f"forward captured by {self.path}" if self.graph is not None else "forward not captured"
        return text + "".join(f"; {path}: {why}" for path, why in self.failures)


def split_sample_input(sample_input: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``sample_input`` as ``ember.optimize`` takes it (a tensor, a tuple or list of positional inputs, or a dict of
    keyword inputs) as positional and keyword arguments."""
    if isinstance(sample_input, dict):
        return (), dict(sample_input)
    if isinstance(sample_input, (tuple, list)):
        return tuple(sample_input), {}
    return (sample_input,), {}


def capture(model: nn.Module, sample_input: Any = None, autocast: torch.dtype | None = None) -> Capture:
    """Captures ``model``'s forward (an eval-mode model) as an FX graph, or says why it could not. ``autocast``: the
    dtype of the ``torch.autocast("cpu")`` the graph will run under (the check runs both the model and the graph
    under it: a graph that bakes in the dtypes of its fp32 trace, as torch.export's does, must still match)."""
    attempts = _Attempts(model, sample_input, autocast)
    graph = attempts.checked(SYMBOLIC_TRACE, attempts.symbolic_trace())
    hidden = [] if graph is None else hidden_layers(graph)
    if graph is not None and not hidden:
        return Capture(graph, SYMBOLIC_TRACE, attempts.failures)
    if graph is not None:
        # A wrapped function (torch.fx.wrap: torchvision's Swin attention) keeps its Linears and attention out of
        # the passes' sight; torch.export traces through it. Its graph is taken where it captures: with every size
        # dynamic within a shorter budget, else with the batch alone dynamic (inputs of other sizes then run the
        # model's forward, as the report says); the trace's graph where neither captures.
        exported = attempts.checked(EXPORT, attempts.export(PREFERRED_EXPORT_BUDGET_S))
        if exported is None:
            return Capture(graph, SYMBOLIC_TRACE, attempts.failures)
        why = f"captured, but calls {', '.join(sorted(set(hidden)))} on the model's parameters as one opaque call"
        attempts.failures.append((SYMBOLIC_TRACE, why))
        return Capture(exported, EXPORT, attempts.failures)
    graph = attempts.checked(EXPORT, attempts.export())
    if graph is not None:
        return Capture(graph, EXPORT, attempts.failures)
    return Capture(None, MODULES, attempts.failures)


def hidden_layers(gm: fx.GraphModule) -> list[str]:
    """The functions a symbolic trace kept as single calls (``torch.fx.wrap``) that take a parameter of the model:
    what they compute with it (a Linear, an attention) is out of the passes' sight. Functions of torch, Python's
    operators and builtins are the graph's own operations."""
    hidden = []
    for node in gm.graph.nodes:
        module = getattr(node.target, "__module__", None) or ""
        if node.op != "call_function" or module.split(".")[0] in _OWN_MODULES:
            continue
        for operand in node.all_input_nodes:
            if operand.op == "get_attr" and _is_parameter(gm, str(operand.target)):
                hidden.append(getattr(node.target, "__qualname__", str(node.target)))
                break
    return hidden


_OWN_MODULES = {"torch", "_operator", "operator", "builtins", "math", "typing"}


def _is_parameter(gm: fx.GraphModule, target: str) -> bool:
    try:
        gm.get_parameter(target)
    except AttributeError:
        return False
    return True


def _first_line(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0] if message else ''}".rstrip(": ")


class _Attempts:
    """The paths tried on one model and sample input, the reasons of those that failed, and the model's own outputs
    on the sample (computed once, for every graph checked against them)."""

    def __init__(self, model: nn.Module, sample_input: Any, autocast: torch.dtype | None = None) -> None:
        self.model = model
        self.autocast = autocast
        self.has_sample = sample_input is not None
        self.args, self.kwargs = split_sample_input(sample_input) if self.has_sample else ((), {})
        self.failures: list[tuple[str, str]] = []
        self._expected: list[torch.Tensor] | None = None
        self._check_autocast = autocast  # the autocast the check runs under (see _reference)
        self._dynamic_over_budget = False  # an export with every size dynamic ran past its budget

    def symbolic_trace(self) -> fx.GraphModule | None:
        try:
            graph = fx.symbolic_trace(self.model)
        except Exception as error:  # any failure of tracing user code means "not this path"
            self.failures.append((SYMBOLIC_TRACE, _first_line(error)))
            return None
        # Annotations written as strings (a module with `from __future__ import annotations`) become globals of the
        # generated code that pickle cannot name, and the model would no longer torch.save: they are only hints.
        if any(isinstance(node.type, str) for node in graph.graph.nodes):
            for node in graph.graph.nodes:
                if isinstance(node.type, str):
                    node.type = None
            graph.recompile()
        return graph

    def export(self, budget: float | None = None) -> fx.GraphModule | None:
        """torch.export's graph of the model, or None with the reason. ``budget``: seconds for the export with every
        size dynamic (:data:`DYNAMIC_EXPORT_BUDGET_S` by default); past it, the batch alone is dynamic."""
        budget = DYNAMIC_EXPORT_BUDGET_S if budget is None else budget
        export = getattr(torch, "export", None)
        auto = getattr(getattr(export, "Dim", None), "AUTO", None)
        if export is None or auto is None:
            # torch.export before Dim.AUTO (torch < 2.6) fails on any size the model's code specializes on; a graph
            # of static shapes would need a capture per input size.
            self.failures.append((EXPORT, f"torch {torch.__version__} has no torch.export.Dim.AUTO (dynamic sizes)"))
            return None
        if not self.has_sample:
            self.failures.append((EXPORT, "needs sample_input"))
            return None
        # torch.export keeps a dimension of size 0 or 1 in the sample at that size (its "0/1 specialization"): a
        # sample of batch 1 would give a graph of batch 1 only. The batch is doubled for the capture (the sample
        # twice over), and the sample as given is the fallback for a model that refuses the doubled one.
        samples = [(self.args, self.kwargs)]
        if (widened := _widened_batch(self.args, self.kwargs)) is not None:
            samples.insert(0, widened)
        module: Any = None
        failure = ""
        for args, kwargs in samples:
            module, failure = self._export_one(export, args, kwargs, auto, budget)
            if module is not None:
                break
        if module is None:
            self.failures.append((EXPORT, failure))
            return None
        if not isinstance(module, fx.GraphModule):
            self.failures.append((EXPORT, f"gave a {type(module).__name__}, not an FX GraphModule"))
            return None
        return module

    def _export_one(
        self, export: Any, args: tuple[Any, ...], kwargs: dict[str, Any], auto: Any, budget: float
    ) -> tuple[Any, str]:
        """The exported module for one sample, or None and why. Every size dynamic first; where torch's reasoning
        over symbolic sizes runs past ``budget``, again with every size but the batch fixed."""
        try:
            shapes = _dynamic_shapes(self.model, args, kwargs, auto)
            batch_shapes = _dynamic_shapes(self.model, args, kwargs, auto, batch_only=True)
        except ValueError as error:
            return None, _first_line(error)
        if any(_is_image(t) for t in _outputs((args, kwargs))):
            reason = "an image's sizes but the batch are fixed to the sample's (other sizes run the model's forward)"
            if (EXPORT, reason) not in self.failures:
                self.failures.append((EXPORT, reason))
        # Where the batch is all that may vary (images alone), its export needs no budget.
        attempts = [batch_shapes] if self._dynamic_over_budget or shapes == batch_shapes else [shapes, batch_shapes]
        for dynamic_shapes in attempts:
            expiry = _Expiry()
            try:
                # Traced under the autocast the graph will run under: the dtypes torch.export records (and checks,
                # in regions where the model turns autocast off) are then the ones the graph meets. Without grad:
                # the graph serves inference, and the trace records no autograd state (20-30% of its time).
                deadline = None if dynamic_shapes is batch_shapes else budget
                with torch.no_grad(), self._autocast(), _deadline(deadline, model_code(self.model)) as expiry:
                    exported = export.export(self.model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
                return exported.module(), ""
            except _OverBudget:
                pass
            except Exception as error:  # any failure of exporting user code means "not this sample"
                # ... unless the deadline passed: torch code that catches what a call raises can turn the expiry
                # into an error of its own (its argument parser, unpacking a symbolic size, raised a TypeError
                # holding _OverBudget: T5-small on a loaded 2-core Zen 3).
                if not expiry.fired:
                    return None, _first_line(error)
            self._dynamic_over_budget = True  # (the next sample would take as long)
            self.failures.append(
                (
                    f"{EXPORT} with every size dynamic",
                    f"over {budget:g} s; exported with sizes other than the batch fixed to the "
                    "sample's (other sizes run the model's forward)",
                )
            )
        return None, "over its time budget"

    def _autocast(self, check: bool = False) -> torch.autocast:
        """The CPU autocast the graph will run under (a disabled one for fp32); ``check``: the one the check runs
        under (see _reference)."""
        dtype = self._check_autocast if check else self.autocast
        return torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None)

    def _reference(self) -> list[torch.Tensor]:
        """The model's own outputs on the sample, under the autocast the graph will run under; where the model's own
        forward cannot run under it in this torch (torch 1.13 refuses a LayerNorm's bf16 input beside fp32 weights,
        which ember's norm kernel takes), in fp32: the check then compares the graph's operations, as the model runs
        them."""
        if self._expected is None:
            try:
                with torch.no_grad(), self._autocast():
                    self._expected = list(_outputs(self.model(*self.args, **self.kwargs)))
            except RuntimeError:
                if self.autocast is None:
                    raise
                self._check_autocast = None
                with torch.no_grad():
                    self._expected = list(_outputs(self.model(*self.args, **self.kwargs)))
        return self._expected

    def checked(self, path: str, graph: fx.GraphModule | None) -> fx.GraphModule | None:
        """``graph`` if it computes what the model does on the sample input, bit for bit (or there is no sample to
        check on); else None, with the reason."""
        if graph is None or not self.has_sample:
            return graph
        try:
            expected = self._reference()
            with torch.no_grad(), self._autocast(check=True):
                got = list(_outputs(graph(*self.args, **self.kwargs)))
        except Exception as error:  # a graph that cannot run the sample is not used
            self.failures.append((path, f"the captured graph failed on sample_input ({_first_line(error)})"))
            return None
        if len(got) != len(expected) or not all(
            g.shape == e.shape and g.dtype == e.dtype and torch.equal(g, e) for g, e in zip(got, expected)
        ):
            self.failures.append((path, "the captured graph's outputs differ from the model's on sample_input"))
            return None
        return graph


def _dynamic_shapes(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], auto: Any, batch_only: bool = False
) -> dict[str, Any]:
    """Every dimension of every tensor input may vary (``Dim.AUTO``: torch keeps dynamic the ones the model's code
    lets vary, batch and sequence among them), keyed by the forward's argument names; with ``batch_only``, the
    first dimension alone. An image's (see _is_image) batch alone is dynamic in either case."""

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            fixed = batch_only or _is_image(value)
            return dict.fromkeys(range(1 if fixed else value.dim()), auto) if value.dim() else None
        if isinstance(value, (tuple, list)):
            return type(value)(spec(v) for v in value)
        if isinstance(value, dict):
            return {k: spec(v) for k, v in value.items()}
        return None

    parameters = list(inspect.signature(model.forward).parameters.values())
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) > len(positional):
        raise ValueError(f"sample_input has {len(args)} positional inputs; forward names {len(positional)}")
    return {**{name: spec(a) for name, a in zip(positional, args)}, **{k: spec(v) for k, v in kwargs.items()}}


def _is_image(value: torch.Tensor) -> bool:
    """A floating-point input of four or more dimensions: images ([batch, channels, height, width]) or video. Its
    height and width stay the sample's in an exported graph. A server resizes its images to the model's resolution,
    so a graph for one resolution serves every call; and reasoning over symbolic heights and widths is where
    torch.export spends minutes (Hugging Face Swin's window padding: past the 15 s budget, where the batch alone
    takes 3 s on a 2-core Sapphire Rapids)."""
    return value.is_floating_point() and value.dim() >= 4


class _OverBudget(BaseException):
    """Raised into an export that ran past its budget. A BaseException: torch's own ``except Exception`` handlers
    inside the export must not take it for a failure of theirs."""


class _Expiry:
    """Whether a deadline has passed (and raised :class:`_OverBudget`), whatever became of what it raised."""

    fired = False


def model_code(model: nn.Module) -> tuple[str, ...]:
    """The Python packages of ``model``'s own code, where a deadline may interrupt it (see :func:`_deadline`): the
    top-level package of each of its modules' classes (``transformers``, ``torchvision``, a script's ``__main__``),
    and for torch's own layers ``torch.nn.modules``, not the rest of torch."""
    packages = set()
    for module in model.modules():
        top = type(module).__module__.split(".")[0]
        packages.add("torch.nn.modules" if top == "torch" else top)
    return tuple(sorted(packages))


@contextlib.contextmanager
def _deadline(seconds: float | None, code: tuple[str, ...] = ()) -> Iterator[_Expiry]:
    """Raises :class:`_OverBudget` into the block it wraps once ``seconds`` have passed, at the next call made by or
    into code of the packages ``code`` names (the model's: :func:`model_code`); the record it yields says whether it
    did. No deadline where none is asked, off the main thread, or where the program has a SIGALRM handler, timer or
    profiler of its own, which this one would displace.

    Where it raises is the point. A SIGALRM handler that raised at once would interrupt whatever Python runs at the
    expiry, and inside torch.export that is often torch's own Python called back from C++ (a symbolic size's
    methods, a dispatch mode), where an exception torch did not plan for can end the process (a T5 test died so in
    CI, the export past its budget on a loaded 2-core machine). The handler only installs a profile function, and
    that raises from the model's own code, where an export meets user errors every day and unwinds cleanly: at a
    call of one of its functions, or before a call it makes into torch. Slow exports are slow in symbolic
    arithmetic the model's code asks for, so the next such call is near (T5-small: 0.02-0.19 s past the expiry on a
    2-core Zen 3); a single arithmetic step that takes long ends before it is raised (Hugging Face Swin with its
    height and width dynamic: 1.8-19 s late there, under load)."""
    expiry = _Expiry()
    if seconds is None or not code or not _alarm_and_profiler_are_free():
        yield expiry
        return
    prefixes = tuple(f"{package}." for package in code)

    def raise_in_model_code(frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "c_call"):
            return
        name = frame.f_globals.get("__name__", "")
        if name in code or name.startswith(prefixes):
            sys.setprofile(None)
            expiry.fired = True
            raise _OverBudget

    def expire(signum: int, frame: Any) -> None:
        if sys.getprofile() is None:  # (a profiler the program started inside the block keeps its place)
            sys.setprofile(raise_in_model_code)

    previous_hook = sys.unraisablehook

    def ignored(unraisable: Any) -> None:
        # The expiry was raised in a finalizer or a weakref callback of the model's (a garbage collection inside the
        # export), where Python reports what it raises instead of raising it: raised again at the next call.
        if isinstance(unraisable.exc_value, _OverBudget) and sys.unraisablehook is ignored:
            expire(signal.SIGALRM, None)
            return
        previous_hook(unraisable)

    previous = signal.signal(signal.SIGALRM, expire)
    sys.unraisablehook = ignored
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield expiry
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if sys.getprofile() is raise_in_model_code:
            sys.setprofile(None)
        sys.unraisablehook = previous_hook


def _alarm_and_profiler_are_free() -> bool:
    """Whether a deadline may take SIGALRM, the interval timer and the profile hook: on the main thread (signals
    reach it alone), where the program uses none of them."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
        and sys.getprofile() is None
    )


def _widened_batch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The sample with every tensor whose first dimension is 1 repeated along it to 2, or None when it has none."""
    changed = False

    def widen(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == 1:
            changed = True
            return torch.cat([value, value])
        if isinstance(value, (tuple, list)):
            return type(value)(widen(v) for v in value)
        if isinstance(value, dict):
            return {k: widen(v) for k, v in value.items()}
        return value

    widened = (tuple(widen(a) for a in args), {k: widen(v) for k, v in kwargs.items()})
    return widened if changed else None


def _outputs(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of a forward's result, in order (tuples, lists, dicts and Hugging Face ModelOutputs)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _outputs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _outputs(v)
    elif hasattr(value, "to_tuple"):
        yield from _outputs(value.to_tuple())
