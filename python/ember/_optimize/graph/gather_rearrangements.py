"""Chains of data-movement operations run as one gather of rows (:class:`~ember._optimize.graph.rearrangement_node.
FusedRearrangement`).

Swin's shifted windows move every activation twice a block: before the attention a roll over the two spatial
dimensions (torch rolls one dimension after the other, a copy each) and a permuted copy into windows; after it, the
permuted copy back and the roll back. Each is a pass over memory with no arithmetic, and between two of ember's
kernels they cost as much as the kernels did (about a quarter of Swin-T's batch-1 forward on the 16-core Xeon). The
whole chain is one permutation of the input's rows, which a gather makes in one pass.

What a chain is: operations that only move elements (views, reshapes, permutes and transposes, ``contiguous`` and
``clone``, rolls, slices by ``x[a:b]`` or ``narrow``, squeezes, flattens), each reading the one before it, every one
but the last read by nothing else (a value read elsewhere ends the chain before it). Replaced where it copies at
least twice (a roll counts twice: torch rolls each dimension apart; a contiguous copy once, where a permute or a slice
came before it), so that one gather saves something; the node
checks at its first call of each shape that the chain moves whole rows and copies at all, and runs the chain itself
otherwise.
"""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from ember._graph.ops import movement_of
from ember._optimize.graph.rearrangement_node import FusedRearrangement

# Of the movements (ember._graph.ops.movement_of), those that copy when the layout before them is not dense, and
# those that leave a view that is not dense.
_MATERIALIZING = {"contiguous", "clone", "reshape", "flatten"}
_RELAYING = {"permute", "transpose", "slice", "narrow"}


def gather_rearrangements(gm: fx.GraphModule) -> int:
    """Replaces every chain of data-movement operations that copies at least twice with one gather; returns how
    many."""
    replaced = 0
    for index, node in enumerate(list(gm.graph.nodes)):
        if node.graph is not gm.graph or movement_of(node) is None or _continues(node):
            continue  # (erased, not a movement, or not the first of its chain)
        chain = _chain(node)
        if _copies(chain) >= 2:
            _install(gm, chain, f"ember_rearrangement_{index}")
            replaced += 1
    gm.recompile()
    return replaced


def _continues(node: fx.Node) -> bool:
    """Whether ``node`` continues the chain of the movement before it (the one reader of that movement)."""
    before = _source(node)
    return movement_of(before) is not None and len(before.users) == 1


def _source(node: fx.Node) -> Any:
    return node.args[0]


def _chain(first: fx.Node) -> list[fx.Node]:
    """``first`` and the movements after it, each the one reader of the one before."""
    chain = [first]
    while len(chain[-1].users) == 1:
        (reader,) = chain[-1].users
        if movement_of(reader) is None or _source(reader) is not chain[-1]:
            break
        chain.append(reader)
    return chain


def _copies(chain: list[fx.Node]) -> int:
    """How many times the chain copies its data: twice a roll (torch rolls each dimension apart), once a
    materializing operation after a permute or a slice."""
    copies, relaid = 0, False
    for node in chain:
        name = movement_of(node)
        if name == "roll":
            copies += 2
        elif name in _RELAYING:
            relaid = True
        elif name in _MATERIALIZING and relaid:
            copies, relaid = copies + 1, False
    return copies


def _install(gm: fx.GraphModule, chain: list[fx.Node], name: str) -> None:
    x = _source(chain[0])
    sizes: list[fx.Node] = []  # the chain's other node arguments (sizes computed from the inputs)
    for n in chain:
        for arg in n.all_input_nodes:
            if arg is not x and arg not in chain and arg not in sizes:
                sizes.append(arg)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {x: graph.placeholder("x")}
    for i, size in enumerate(sizes):
        env[size] = graph.placeholder(f"size_{i}")
    for n in chain:
        env[n] = graph.node_copy(n, lambda a: env[a])
    graph.output(env[chain[-1]])
    gm.add_submodule(name, FusedRearrangement(fx.GraphModule(nn.Module(), graph), chain[-1].name))
    last = chain[-1]
    with gm.graph.inserting_before(last):
        node = gm.graph.call_module(name, (x, *sizes))
    node.meta = dict(last.meta)
    last.replace_all_uses_with(node)
    for n in reversed(chain):
        gm.graph.erase_node(n)
