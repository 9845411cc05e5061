"""``ember.optimize`` for inference (a model in eval mode): oneDNN layers with prepacked weights, fused post-ops,
BatchNorm folding and dropout removal, each installed beside the original modules, never in place of their
parameters."""
