"""One colour per device, the same in every view of a step."""

from __future__ import annotations

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
           "#bcbd22", "#7f7f7f", "#aec7e8")  # Category10 without its red: red means transfer


def device_colors(devices) -> dict[str, str]:
    return {device: PALETTE[i % len(PALETTE)] for i, device in enumerate(devices)}
