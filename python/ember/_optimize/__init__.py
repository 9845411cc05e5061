"""The implementation of ``ember.optimize`` (one job per file: api, bf16_modules, autocast_forward,
fused_optimizer, report; split-BF16 itself lives in ember.bf16)."""
