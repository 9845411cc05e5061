"""Run by the launcher tests: torch's OpenMP runtime binds the main thread, then a second libgomp loads (the one
scikit-learn's wheel carries, imported after torch ran a parallel op): it must not warn about its places."""

import torch

torch.ones(1 << 16).add_(1)  # torch's libgomp has bound the main thread to its first place by now

from sklearn.datasets import load_digits  # noqa: E402 - after torch's runtime started, on purpose

print(len(load_digits().target))
