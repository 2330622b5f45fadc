"""The placement board's kernel side: an anywidget whose front end (``widgets/placement.js``)
draws a box per device and a chip per variable. The kernel holds the plan; the page sends
moves, strategy choices and undo, and draws what the traits say."""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets


def _front_end(name: str) -> Path:
    """``widgets/NAME`` from the wheel (``dtflab/widgets``) or from a source checkout."""
    for folder in (Path(__file__).resolve().parents[1] / "widgets",
                   Path(__file__).resolve().parents[2] / "widgets"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"dtflab's front end {name} is missing; reinstall dtflab "
                            f"(pip install -e . from a checkout)")


class PlacementBoard(anywidget.AnyWidget):
    """What the page shows; see ``PlacementEditor`` for what drives it."""

    _esm = _front_end("placement.js")
    _css = _front_end("placement.css")

    devices = traitlets.List().tag(sync=True)      # [{"device": full name, "name": "ps:0"}]
    chips = traitlets.List().tag(sync=True)        # [{"name", "shape", "bytes", "device"}]
    loads = traitlets.Dict().tag(sync=True)        # {device: bytes placed there}
    imbalance = traitlets.Float(1.0).tag(sync=True)
    strategies = traitlets.List().tag(sync=True)   # [[key, label]]
    history = traitlets.List().tag(sync=True)      # [{"change", "bytes", "step_ms", "imbalance"}]
    status = traitlets.Unicode("").tag(sync=True)
    can_undo = traitlets.Bool(False).tag(sync=True)
