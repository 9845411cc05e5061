"""Graph mode: ember's passes over a model's forward captured as an FX graph (``capture``), so that fusion reaches
any model torch can trace, not only the containers the module-level rewrite knows."""
