"""Elementwise operations after a Linear or convolution fused into its kernel's epilogue: any chain of the
activations the kernels apply (ReLU, GELU erf and tanh, SiLU, Sigmoid, Tanh, Hardswish, Hardsigmoid, Mish, ELU,
LeakyReLU, clamp, ReLU6, Hardtanh), multiplications and additions of a constant, and one tensor operand (a residual
add, or a multiplication by a tensor of the output's shape: the gate of a gated MLP, ``act(x W1) * (x W3)``, is
x W1's epilogue [act, multiply by x W3]), in module, functional, method or ATen form.

A step joins the layer only when the layer's output so far has no other user: a user of an intermediate value
needs that value, which the fused kernel never writes. A step after a permutation of a Linear's output joins it
too (an elementwise step commutes with the permutation): the permutation then reads the layer's result, and a
tensor operand is read in the layer's own layout, permuted back (ConvNeXt's blocks add their input to their last
Linear's output permuted to [N, C, H, W]).
"""

from __future__ import annotations

from torch import fx

from ember._graph.ops import call_of
from ember._graph.patterns import is_reshape, permutation, recorded_shape
from ember._optimize.graph.epilogue import step_of
from ember._optimize.graph.nodes import FusedLayer, FusedLinear
from ember._optimize.graph.refs import has_hooks, module_of, with_operand


def fuse_epilogues(gm: fx.GraphModule) -> int:
    """Fuses every step the rules above allow; returns how many."""
    fused = 0
    for node in list(gm.graph.nodes):
        layer = module_of(node, gm)
        if not isinstance(layer, FusedLayer):
            continue
        while len(node.users) == 1:
            (user,) = node.users
            # A reshape between the layer and an activation (Hugging Face's Conv1D, which flattens its input's
            # rows and restores them after the GEMM) changes no element: the activation joins the layer and the
            # reshape then reads the layer's result. So does a residual add after it, where the graph records the
            # shapes: the layer reads the residual in its own rows (FusedLayer.operand_reshaped).
            reshape = user if is_reshape(user) and len(user.users) == 1 else None
            permute, dims = _permute_after(layer, user)
            moved = reshape if reshape is not None else permute
            if moved is not None:
                (user,) = moved.users
            if has_hooks(module_of(user, gm)):
                break  # the activation module's hooks would not run
            call = call_of(user, gm)
            found = None if call is None else step_of(call, moved or node, layer.has_operand)
            if found is None:
                break
            step, operand = found
            if operand is not None:
                if reshape is not None:
                    if not _residual_through_reshape(layer, node, reshape, operand, step.op):
                        break
                    layer.operand_reshaped = True
                elif permute is not None and dims is not None:
                    if not _same_shape(gm, permute, operand, step.op == "product"):
                        break
                    layer.operand_permuted = _inverse(dims)
                elif not _same_shape(gm, node, operand, step.op == "product"):
                    break  # a broadcast operand (a squeeze-excitation's scale) is torch's
                # The fused node (and the reshape after it) moves to the add or multiply, after its operand is
                # computed; nothing between the two read the layer's output (the add or multiply was its only user).
                user.prepend(node)
                if moved is not None:
                    user.prepend(moved)
                with_operand(node, operand)
            layer.append(step)
            user.replace_all_uses_with(moved or node)
            gm.graph.erase_node(user)
            fused += 1
    gm.recompile()
    return fused


def _permute_after(layer: FusedLayer, user: fx.Node) -> tuple[fx.Node | None, tuple[int, ...] | None]:
    """``user`` and its dimensions where it permutes a Linear's output with dimensions the graph holds as numbers, is
    read by one node, and the layer reads no operand yet (the permutation of one operand is the layer's to keep);
    else (None, None)."""
    if not isinstance(layer, FusedLinear) or layer.has_operand or len(user.users) != 1:
        return None, None
    dims = permutation(user)
    return (user, dims) if dims is not None else (None, None)


def _inverse(dims: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes ``x.permute(dims)``."""
    rank = len(dims)
    normalized = [d % rank for d in dims]
    return tuple(normalized.index(i) for i in range(rank))


def _same_shape(gm: fx.GraphModule, layer_node: fx.Node, operand: fx.Node, proof_needed: bool) -> bool:
    """Whether ``operand`` has the layer's output shape, so that the step needs no broadcast: the shapes the graph
    records are equal, or, in a graph that records none, ``operand`` is another Linear's output (no tensor operand
    of its own) reading the layer's input with as many outputs. Without ``proof_needed`` (a residual add, which
    rarely broadcasts) only recorded shapes that differ refuse it: the kernel checks the shape on every call and
    leaves a broadcast to torch."""
    shapes = recorded_shape(layer_node), recorded_shape(operand)
    if None not in shapes:
        return shapes[0] == shapes[1]
    if not proof_needed:
        return True
    layer, other = module_of(layer_node, gm), module_of(operand, gm)
    if not (isinstance(layer, FusedLinear) and isinstance(other, FusedLinear)) or other.has_operand:
        return False
    if operand.args[0] is not layer_node.args[0]:
        return False
    try:
        return bool(layer.state.weight().shape[0] == other.state.weight().shape[0])
    except TypeError:  # weights the graph passes: unknown here
        return False


def _residual_through_reshape(
    layer: FusedLayer, layer_node: fx.Node, reshape: fx.Node, operand: fx.Node, op: str
) -> bool:
    """Whether a residual added after a reshape of a Linear's output can join it, read in the layer's rows: the
    graph records the shapes, the residual's is the reshape's, and the reshape keeps the last dimension (so
    ``residual.reshape(*x.shape[:-1], n)`` is the element-for-element match of the layer's output)."""
    if op != "residual" or not isinstance(layer, FusedLinear):
        return False
    out, reshaped, residual = (recorded_shape(n) for n in (layer_node, reshape, operand))
    if out is None or reshaped is None or residual is None or not out or not reshaped:
        return False
    return reshaped == residual and out[-1] == reshaped[-1]
