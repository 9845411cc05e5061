"""ember's demo: what it runs on, and split-BF16 master weights on a real model.

Run with `bash scripts/demo.sh` (sets everything up first) or, once built, `.venv/bin/python examples/demo.py`.
The demo grows as ember does; for now it shows the foundation: the DLPack boundary, ISA dispatch, and the
bf16 kernels that the training path will keep its master weights in.
"""

from __future__ import annotations

import time

import torch

import ember


def timed(fn, repeats: int = 20) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


def main() -> None:
    ember.show_config()
    print()

    torch.manual_seed(0)
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True), num_layers=4
    )
    params = [p for p in model.parameters() if p.dtype == torch.float32]
    n = sum(p.numel() for p in params)
    print(
        f"A 4-layer transformer encoder: {len(params)} fp32 tensors, {n / 1e6:.1f}M parameters, {4 * n / 2**20:.0f} MiB"
    )

    # Split every weight into a bf16 half the model computes with and the 16 bits that make it exact again.
    halves = [ember.bf16.split(p) for p in params]
    exact = all(torch.equal(ember.bf16.join(top, bottom), p.detach()) for p, (top, bottom) in zip(params, halves))
    print(f"  split into bf16 tops + int16 bottoms: {4 * n / 2**20:.0f} MiB in all, no second fp32 copy")
    print(f"  join(top, bottom) == the fp32 weights, bit for bit: {exact}")

    with torch.no_grad():
        x = torch.randn(8, 128, 512)
        reference = model.eval()(x)
        for p, (top, _) in zip(params, halves):
            p.copy_(top.float())
        truncated = model(x)
        for p, (top, bottom) in zip(params, halves):
            p.copy_(ember.bf16.join(top, bottom))
        restored = model(x)
    print(f"  output with bf16 (truncated) weights: max |diff| {float((truncated - reference).abs().max()):.3g}")
    print(f"  output after joining back:            max |diff| {float((restored - reference).abs().max()):.3g}")

    # Every ISA path gives the same bits; the widest one this CPU has is the default.
    big = torch.randn(16 * 2**20)
    print(f"\nRounding {big.numel() // 2**20}M floats to bf16 (median of 20):")
    print(f"  torch .to(torch.bfloat16)        {timed(lambda: big.to(torch.bfloat16)) * 1e3:7.2f} ms")
    reference_bits = None
    for level in ember.isa.supported_levels():
        with ember.isa.capped(level):
            out = ember.bf16.round(big)
            bits = out.view(torch.int16)
            same = reference_bits is None or torch.equal(bits, reference_bits)
            reference_bits = bits if reference_bits is None else reference_bits
            impl = ember._C.bf16_implementation("round")
            # A level runs the widest kernel it allows: at "amx" that is the avx512_bf16 one (rounding has no tiles).
            print(f"  ember.bf16.round at {level:<12} {timed(lambda: ember.bf16.round(big)) * 1e3:7.2f} ms"
                  f"   ({impl} kernel; same bits as ref: {same})")  # fmt: skip

    try:
        ember.bf16.round(torch.ones(3, dtype=torch.float64))
    except TypeError as error:
        print(f"\nA wrong argument is a clear Python exception: TypeError: {error}")


if __name__ == "__main__":
    main()
