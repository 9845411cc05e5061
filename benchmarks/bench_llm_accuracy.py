"""ember.llm's accuracy on a small Llama trained from text every machine has: CPython's own standard-library sources.

    python benchmarks/bench_llm_accuracy.py [--minutes 8] [--prompts 8] [--new-tokens 256] [--retrain]

The fixture: a byte-level Llama (vocabulary of 256 bytes, 4 layers of 256, 8 query heads over 4 key/value heads) is
trained with AdamW in plain float32 torch for --minutes on the standard library's .py files (held-out files kept
apart), once, and kept in benchmarks/.cache/ for later runs (--retrain makes it again). No weights are downloaded.

What is measured, against Hugging Face's eager model (SDPA attention) on the same weights, from --prompts prompts cut
from held-out files, --new-tokens greedy tokens each (``compared``: the model set beside it):
- float32: whether ember's greedy tokens are eager float32's, token for token (the issue asks identical);
- bfloat16: agreement with eager bfloat16, two ways: free-running (the share of positions where the two
  generations hold the same token; once they part, their contexts differ) and teacher-forced (both models read eager's
  generation; the share of positions where their next-token argmax agrees: the per-step agreement the issue's 99%
  is about, with one model's divergence not counted again at every later step);
- the held-out text's perplexity under each;
- the floor of those agreements: torch's own bf16 model under its math attention ("eager") beside its SDPA, the
  default, which round differently in the same places.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ember
import harness

CACHE = Path(__file__).resolve().parent / ".cache"
SHAPE = {"vocab_size": 256, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 1024}  # fmt: skip


def corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """(training bytes, held-out bytes): the standard library's .py files in path order, every 20th file held out."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    train, held = bytearray(), bytearray()
    for i, path in enumerate(files):
        (held if i % 20 == 0 else train).extend(path.read_bytes() + b"\n")
    return torch.frombuffer(train, dtype=torch.uint8).long(), torch.frombuffer(held, dtype=torch.uint8).long()


def trained_model(minutes: float, retrain: bool) -> torch.nn.Module:
    import transformers

    train, _ = corpus()
    key = hashlib.sha256(f"{SHAPE}{minutes}{len(train)}".encode()).hexdigest()[:12]
    path = CACHE / f"llm-accuracy-{key}.pt"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE))
    if path.exists() and not retrain:
        model.load_state_dict(torch.load(path))
        print(f"fixture: {path.name} (trained before)")
        return model.eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    start, step, batch, length = time.time(), 0, 16, 256
    model.train()
    while time.time() - start < 60 * minutes:
        at = torch.randint(0, len(train) - length - 1, (batch,), generator=gen)
        x = torch.stack([train[i : i + length + 1] for i in at.tolist()])
        logits = model(x[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 50 == 0:
            print(f"  step {step}: loss {loss.item():.3f} nats/byte", flush=True)
    CACHE.mkdir(exist_ok=True)
    torch.save(model.state_dict(), path)
    print(f"fixture: trained {step} steps in {time.time() - start:.0f} s, loss {loss.item():.3f}; kept as {path.name}")
    return model.eval()


def greedy(model: torch.nn.Module, ids: torch.Tensor, new: int) -> torch.Tensor:
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0)  # fmt: skip
    return out[:, ids.shape[1] :]


def argmax_agreement(a: torch.nn.Module, b: torch.nn.Module, sequence: torch.Tensor, prompt: int) -> float:
    """Both models read `sequence`; the share of its generated positions where their next-token argmax agrees."""
    with torch.no_grad():
        pa = a(sequence).logits[:, prompt - 1 : -1].argmax(-1)
        pb = b(sequence).logits[:, prompt - 1 : -1].argmax(-1)
    return (pa == pb).float().mean().item()


def perplexity(model: torch.nn.Module, text: torch.Tensor, length: int = 512) -> float:
    losses = []
    with torch.no_grad():
        for i in range(0, min(len(text) - length - 1, 16 * length), length):
            x = text[i : i + length + 1].unsqueeze(0)
            logits = model(x[:, :-1]).logits.float()
            losses.append(F.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1)).item())
    return math.exp(sum(losses) / len(losses))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--retrain", action="store_true")
    args = parser.parse_args()

    bench = harness.Benchmark("llm_accuracy", "ember.llm's tokens beside Hugging Face eager on a trained small Llama")
    model = trained_model(args.minutes, args.retrain)
    _, held = corpus()
    gen = torch.Generator().manual_seed(1)
    starts = torch.randint(0, len(held) - args.prompt_length, (args.prompts,), generator=gen).tolist()
    prompts = [held[s : s + args.prompt_length].unsqueeze(0) for s in starts]
    cases = [("ember", torch.float32), ("ember", torch.bfloat16), ("torch math attention", torch.bfloat16)]
    for compared, dtype in cases:
        eager = copy.deepcopy(model).to(dtype).eval()
        if compared == "ember":
            ours = ember.llm.optimize(copy.deepcopy(model), dtype=dtype)
        else:  # the floor: the same model under torch's other attention kernel, whose roundings differ alike
            ours = copy.deepcopy(model).to(dtype).eval()
            ours.config._attn_implementation = "eager"
        identical, free, forced = 0, [], []
        for ids in prompts:
            want, got = greedy(eager, ids, args.new_tokens), greedy(ours, ids, args.new_tokens)
            identical += int(torch.equal(want, got))
            free.append((want == got).float().mean().item())
            forced.append(argmax_agreement(eager, ours, torch.cat([ids, want], dim=1), ids.shape[1]))
        row = {"compared": compared, "dtype": str(dtype).replace("torch.", ""), "prompts": len(prompts),
               "new_tokens": args.new_tokens,
               "identical_generations": identical, "free_running_agreement_pct": 100 * sum(free) / len(free),
               "teacher_forced_agreement_pct": 100 * sum(forced) / len(forced)}  # fmt: skip
        row["perplexity_eager"], row["perplexity_compared"] = perplexity(eager, held), perplexity(ours, held)
        bench.record(row)
    bench.note(f"Corpus: CPython {sys.version.split()[0]}'s standard library (.py files), bytes as tokens; "
               f"prompts of {args.prompt_length} bytes from held-out files.")  # fmt: skip
    bench.write()


if __name__ == "__main__":
    main()
