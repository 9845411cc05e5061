"""The implementation of ``ember.optimize`` (one job per file: api, bf16_modules, checkpoints, autocast_forward,
fused_optimizer, report)."""
