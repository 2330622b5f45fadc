"""Colours a label can be read on: WCAG 2's contrast ratio, and the label colour (black or
white) that reads best on a cell's colour. One of the two reads at 4.58:1 or better on any
colour."""

from __future__ import annotations

DARK, WHITE = "#000000", "#ffffff"


def contrast(one: str, other: str) -> float:
    """WCAG 2's contrast ratio of two ``#rrggbb`` colours (1 to 21; text wants 4.5 or more)."""
    def luminance(colour: str) -> float:
        channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    light, dark = sorted((luminance(one), luminance(other)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def label_colour(cell: str) -> str:
    """The label colour that reads best on ``cell``."""
    return max((DARK, WHITE), key=lambda text: contrast(text, cell))
