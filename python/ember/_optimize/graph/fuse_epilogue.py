"""Elementwise operations after a Linear or convolution fused into its kernel's epilogue: any chain of the
activations the kernels apply (ReLU, GELU erf and tanh, SiLU, Sigmoid, Tanh, Hardswish, Hardsigmoid, Mish, ELU,
LeakyReLU, clamp, ReLU6, Hardtanh), multiplications and additions of a constant, and one residual add, in module,
functional, method or ATen form.

A step joins the layer only when the layer's output so far has no other user: a user of an intermediate value
needs that value, which the fused kernel never writes.
"""

from __future__ import annotations

from torch import fx

from ember._graph.ops import call_of
from ember._optimize.graph.epilogue import step_of
from ember._optimize.graph.nodes import FusedLayer
from ember._optimize.graph.refs import has_hooks, module_of, with_residual


def fuse_epilogues(gm: fx.GraphModule) -> int:
    """Fuses every step the rules above allow; returns how many."""
    fused = 0
    for node in list(gm.graph.nodes):
        layer = module_of(node, gm)
        if not isinstance(layer, FusedLayer):
            continue
        while len(node.users) == 1:
            (user,) = node.users
            if has_hooks(module_of(user, gm)):
                break  # the activation module's hooks would not run
            call = call_of(user, gm)
            found = None if call is None else step_of(call, node, layer.has_residual)
            if found is None:
                break
            step, residual = found
            if residual is not None:
                # The fused node moves to the add, after the residual is computed; nothing between the two read the
                # layer's output (the add was its only user).
                user.prepend(node)
                with_residual(node, residual)
            layer.append(step)
            user.replace_all_uses_with(node)
            gm.graph.erase_node(user)
            fused += 1
    gm.recompile()
    return fused
