"""Task and device names, in one place: ``/job:ps/replica:0/task:1/device:CPU:0`` <-> ``ps:1``.

A *task* is ``job:index`` (``ps:1``), what users type and dtflab prints. A *device* is
TensorFlow's name (``/job:ps/task:1``, or in full ``/job:ps/replica:0/task:1/device:CPU:0``).
"""

from __future__ import annotations

import re

_DEVICE = re.compile(r"/job:([^/]+)(?:/replica:\d+)?/task:(\d+)")
_TASK = re.compile(r"([A-Za-z][\w-]*):(\d+)")


def task(device: str) -> str:
    """``/job:ps/replica:0/task:1/device:CPU:0`` -> ``ps:1`` (a task name stays as it is)."""
    match = _DEVICE.search(device)
    return f"{match.group(1)}:{match.group(2)}" if match else device


def short(device: str) -> str:
    """Like :func:`task`, but a device other than the task's CPU:0 keeps its kind:
    ``/job:worker/replica:0/task:0/device:GPU:0`` -> ``worker:0/GPU:0``."""
    parts = dict(part.split(":", 1) for part in device.strip("/").split("/") if ":" in part)
    if "job" not in parts:
        return device
    name = f"{parts['job']}:{parts.get('task', '0')}"
    kind = parts.get("device", "CPU:0")
    return name if kind.upper() == "CPU:0" else f"{name}/{kind}"


def split(name: str) -> tuple[str, int]:
    """``ps:1`` or any device of that task -> ``("ps", 1)``; ``ValueError`` otherwise."""
    match = _TASK.fullmatch(task(name.strip()))
    if not match:
        raise ValueError(f"{name!r} is not a task; write it as job:index, e.g. ps:0")
    return match.group(1), int(match.group(2))


def device(name: str) -> str:
    """``ps:1``, ``/job:ps/task:1`` or the full device -> ``/job:ps/task:1``; anything else
    is returned unchanged (for the caller to refuse)."""
    text = name.strip()
    match = re.fullmatch(r"/job:([^/]+)(?:/replica:\d+)?/task:(\d+)(?:/device:CPU:0)?", text) \
        or _TASK.fullmatch(text)
    return f"/job:{match.group(1)}/task:{int(match.group(2))}" if match else name


def full(name: str) -> str:
    """``ps:1`` -> ``/job:ps/replica:0/task:1/device:CPU:0``."""
    job, index = split(name)
    return f"/job:{job}/replica:0/task:{index}/device:CPU:0"


def find(text: str) -> tuple[str, int] | None:
    """The first task a text (an error message) names by device, if any."""
    match = _DEVICE.search(text)
    return (match.group(1), int(match.group(2))) if match else None
