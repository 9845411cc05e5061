"""Dropout: ember.nn.functional.dropout (every ISA path) beside torch's, at BERT-base's training shapes.

Shapes: the hidden-state dropouts of a BERT-base step (batch 16 x 128 tokens x 768) and its attention-probability
dropouts (16 x 12 heads x 128 x 128), float32 and bfloat16, p = 0.1. "forward" allocates the output as a model's
call does; "forward + backward" also runs autograd's backward with a given gradient (torch multiplies by the mask
it kept, ember regenerates the mask from the seed). Bytes: a forward must read the input and write the output, a
backward read the gradient and write the input's gradient; torch also writes (and in backward reads) its mask.

    python benchmarks/bench_dropout.py [--p 0.1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness
from ember.nn.functional import dropout

SHAPES = {"hidden 16x128x768": (16, 128, 768), "attention 16x12x128x128": (16, 12, 128, 128)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--p", type=float, default=0.1)
    args = parser.parse_args()
    p = args.p

    bench = harness.Benchmark("dropout", f"Dropout (training, p = {p}) at BERT-base shapes")
    stream_fn, stream_bytes = harness.stream_kernel()
    for shape_name, shape in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(shape).to(dtype)
            leaf = x.clone().requires_grad_()
            grad = torch.randn(shape).to(dtype)
            n, size = x.numel(), x.element_size()

            def forward_backward(fn, leaf=leaf, grad=grad) -> None:
                leaf.grad = None
                fn(leaf, p).backward(grad)

            for pass_name, ember_bytes in (("forward", 2 * size * n), ("forward + backward", 4 * size * n)):
                if pass_name == "forward":
                    cases = {"torch": lambda x=x: F.dropout(x, p)}
                    ours = lambda x=x: dropout(x, p)  # noqa: E731
                else:
                    cases = {"torch": lambda: forward_backward(F.dropout)}
                    ours = lambda: forward_backward(dropout)  # noqa: E731
                for level in ember.isa.supported_levels():
                    with ember.isa.capped(level):
                        name = f"ember {ember._C.dropout_implementation()}"
                    if name not in cases:

                        def capped(level: str = level, fn=ours) -> None:
                            with ember.isa.capped(level):
                                fn()

                        cases[name] = capped
                timings = bench.interleaved({"ceiling": stream_fn, **cases}, min_time=1.0 * (len(cases) + 1))
                ceiling = stream_bytes / timings.pop("ceiling").median / 1e9
                baseline = timings["torch"]
                for impl, t in timings.items():
                    bench.add(shape=shape_name, dtype=str(dtype).replace("torch.", ""), pass_=pass_name, impl=impl,
                              time=t, ns_per_elem=t.median / n * 1e9, bytes=ember_bytes, baseline=baseline,
                              ceiling_gbs=ceiling)  # fmt: skip
    bench.note(
        "GB/s counts the input read and output written (and in backward the gradient read and written): the least "
        "any dropout must move; torch moves its mask besides. Each shape's cases and the memory ceiling (in-place "
        "a += b) were timed round-robin. `speedup` is over torch. The ref path is the scalar definition."
    )
    bench.write()


if __name__ == "__main__":
    main()
