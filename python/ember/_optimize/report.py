"""What ``ember.optimize(..., report=True)`` prints: what was converted, what was left alone, and why."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OptimizeReport:
    """Collected while optimizing; ``str()`` is the printed report."""

    converted: list[tuple[str, int]] = field(default_factory=list)  # (parameter name, numel)
    left: list[tuple[str, str]] = field(default_factory=list)  # (parameter name, reason)
    actions: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = ["ember.optimize report"]
        lines += [f"  {action}" for action in self.actions]
        if self.converted:
            numel = sum(n for _, n in self.converted)
            lines.append(f"  split-BF16 parameters: {len(self.converted)} ({numel:,} values)")
            lines += [f"    {name} ({n:,})" for name, n in self.converted]
        if self.left:
            lines.append(f"  left as they were: {len(self.left)}")
            lines += [f"    {name}: {reason}" for name, reason in self.left]
        return "\n".join(lines)
