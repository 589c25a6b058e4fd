"""`MemoryEstimate`: the result of the memory estimate: the settings it was made for, parameter counts,
and the peak split into parts (bytes), with how each part is counted; as a dict, a rich table or text.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GiB = 2**30


@dataclass
class MemoryEstimate:
    model: str
    settings: dict
    total_params: int
    trainable_params: int
    breakdown: dict[str, int]
    notes: list[str] = field(default_factory=list)
    details: dict[str, str] = field(default_factory=dict, repr=False)  # how each line is counted
    host_bytes: int = 0  # pinned host memory outside the total: offloaded layer inputs

    LABELS = {
        "weights": "weights",
        "trainable_params": "trainable parameters",
        "autocast_copies": "half-precision copies of trained weights",
        "gradients": "gradients",
        "optimizer_states": "optimizer states",
        "activations": "activations",
        "logits_loss": "logits and loss",
        "optimizer_step": "optimizer step workspace",
        "not_concurrent": "minus: not alive at the same time",
        "overhead": "framework / allocator overhead",
        "vision_weights": "vision tower and projector (frozen)",  # roctune.memory.vision
        "vision_trained": "trained vision parameters, gradients, AdamW",
        "vision_activations": "vision activations kept for backward",
    }

    @property
    def total_bytes(self) -> int:
        return int(sum(self.breakdown.values()))

    @property
    def peak_tensor_bytes(self) -> int:
        """Peak of live tensor memory (what torch.cuda.max_memory_allocated reports): total less overhead."""
        return self.total_bytes - self.breakdown.get("overhead", 0)

    def fits(self, vram_bytes: int | float) -> bool:
        return self.total_bytes <= vram_bytes

    def to_dict(self) -> dict:
        return {"model": self.model, "settings": dict(self.settings), "total_params": self.total_params,
                "trainable_params": self.trainable_params, "breakdown_bytes": dict(self.breakdown),
                "total_bytes": self.total_bytes, "peak_tensor_bytes": self.peak_tensor_bytes,
                "host_bytes": self.host_bytes, "details": dict(self.details), "notes": list(self.notes)}

    def format_table(self, title: str | None = None):
        """A rich Table of the breakdown (lines that are zero are left out)."""
        from rich.table import Table

        s = self.settings
        t = Table(title=title or (f"{self.model}: {s['method']}, {s['dtype']}, batch {s['batch_size']} x "
                                  f"{s['max_length']} tokens"), show_footer=False)
        t.add_column("part")
        t.add_column("GiB", justify="right")
        t.add_column("how it is counted", overflow="fold")
        for k, v in self.breakdown.items():
            if v and not (k == "not_concurrent" and abs(v) < 0.005 * self.total_bytes):  # hide a rounding-size line
                t.add_row(self.LABELS.get(k, k), f"{v / GiB:.2f}", self.details.get(k, ""))
        t.add_row("[bold]total[/bold]", f"[bold]{self.total_bytes / GiB:.2f}[/bold]",
                  f"{self.trainable_params:,} of {self.total_params:,} parameters trained")
        return t

    def format_text(self) -> str:
        lines = [f"{self.model}: {self.settings['method']}, {self.settings['dtype']}, batch "
                 f"{self.settings['batch_size']} x {self.settings['max_length']}"]
        for k, v in self.breakdown.items():
            if v:
                lines.append(f"  {self.LABELS.get(k, k):<42} {v / GiB:8.2f} GiB")
        lines.append(f"  {'total':<42} {self.total_bytes / GiB:8.2f} GiB")
        return "\n".join(lines)
