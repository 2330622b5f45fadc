"""Memory and CPU time of task processes, as the machine accounts for them."""

from __future__ import annotations


def proportional_mb(pid: int) -> float | None:
    """Proportional set size of ``pid`` in MiB, or ``None`` if it cannot be read.

    PSS divides each shared page among the processes mapping it, so the PSS of several task
    servers adds up to what they really cost together (TensorFlow's library pages are shared).
    Falls back to RSS where the OS has no PSS (not Linux).
    """
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.Error, OSError):
        return None
    return round(getattr(info, "pss", info.rss) / 2**20, 1)


def cpu_seconds(pids) -> float:
    """CPU seconds (user and system) the processes ``pids`` have used so far, summed; a pid
    that is ``None`` or has ended counts 0 (so the sum can fall when a task restarts)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times() if pid else None
        except (psutil.Error, OSError):
            times = None
        total += times.user + times.system if times else 0.0
    return total
