"""Run by the launcher tests: torch's thread count before and after ember's first kernels in an instance.

Under ember-run GNU OpenMP binds the main thread to one CPU; ember once took its default budget from that mask
and its oneDNN calls then set the thread's OpenMP count, torch's, to 1.
"""

import json

import torch

import ember

before = torch.get_num_threads()
model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Flatten(), torch.nn.Linear(8 * 14 * 14, 10)).eval()
optimized = ember.optimize(model, dtype=torch.bfloat16)
with torch.inference_mode():
    optimized(torch.randn(2, 3, 16, 16))
print(json.dumps({"before": before, "after": torch.get_num_threads(), "ember": ember._C.num_threads()}))
