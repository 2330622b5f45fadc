"""Who sees what: the elements each reader of one data service job received in an epoch, per
processing mode and sharding policy, with a data worker killed part way through and restarted.

In [1]: seen = train.visits(cluster, mode="distributed_epoch")
In [2]: seen = train.visits(cluster, mode="distributed_epoch", kill="data_worker:1")
In [3]: seen.times_seen          # {1: 598, 0: 2}: two elements lost with the killed worker

The readers are threads of this process, each with its own iterator on the same job, standing in
for the trainers of a job (what TensorFlow's service sees is the same: consumers of one job).
What TensorFlow documents, and what a run here showed once (2 data workers, 1,000 elements):
``distributed_epoch`` (``DYNAMIC``) visits each element at most once, and a restarted worker
loses the elements it had in hand (2 of 1,000); static ``DATA`` sharding restarts the worker's
shard from the beginning, so its elements come twice (94 of 1,000); ``parallel_epochs``
(``OFF``) has every data worker make the whole epoch, so every element comes once per worker.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

#: How often the killer looks at the count of elements received (s).
POLL_S = 0.002


@dataclass
class Visits:
    """What each reader received (``received[reader]``: the element indices, in order), of
    ``elements`` in the epoch, read in ``mode`` from ``data_workers`` data workers; ``killed``
    and ``restarted`` say what was done to which worker after how many elements; a reader in
    ``waiting`` had not reached the end of the epoch at the time limit."""

    mode: str
    elements: int
    data_workers: int
    received: dict[str, list[int]]
    killed: str | None = None
    killed_after: int | None = None
    restarted: bool = False
    waiting: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def counts(self) -> collections.Counter:
        """How many times each element was received, by any reader."""
        return collections.Counter(i for indices in self.received.values() for i in indices)

    @property
    def times_seen(self) -> dict[int, int]:
        """``{times: elements}``: how many elements were received that many times (0: lost)."""
        counts = self.counts
        histogram = collections.Counter(counts[i] for i in range(self.elements))
        return dict(sorted(histogram.items()))

    @property
    def expected(self) -> int:
        """How many times each element should come: once per data worker where every worker
        makes the whole epoch (``parallel_epochs``, ``OFF``), else once."""
        return self.data_workers if self.mode in ("parallel_epochs", "OFF") else 1

    @property
    def lost(self) -> int:
        """Elements received fewer times than :attr:`expected` (0: never)."""
        return sum(n for times, n in self.times_seen.items() if times < self.expected)

    @property
    def repeated(self) -> int:
        """Elements received more times than :attr:`expected`."""
        return sum(n for times, n in self.times_seen.items() if times > self.expected)

    def per_reader(self) -> dict[str, tuple[int, int]]:
        """``{reader: (received, distinct)}``."""
        return {name: (len(indices), len(set(indices))) for name, indices in self.received.items()}

    def summary(self) -> str:
        fault = ""
        if self.killed:
            fault = (f"; {self.killed} killed after {self.killed_after} elements"
                     + (" and restarted" if self.restarted else ", not restarted"))
        readers = ", ".join(f"{name} {n} ({distinct} distinct)"
                            for name, (n, distinct) in self.per_reader().items())
        seen = ", ".join(f"{n} x{times}" for times, n in self.times_seen.items())
        waiting = f"; still waiting at the limit: {', '.join(self.waiting)}" if self.waiting else ""
        return (f"{self.mode}, {self.data_workers} data workers, {self.elements} elements"
                f"{fault}: {readers}; elements seen (count x times): {seen}{waiting}")

    def _repr_html_(self) -> str:
        import html

        rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{n}</td><td>{distinct}</td></tr>"
                       for name, (n, distinct) in self.per_reader().items())
        seen = ", ".join(f"{n} elements &times;{times}" for times, n in self.times_seen.items())
        return (f"<div class='dtflab-visits'><b>{html.escape(self.mode)}</b>: "
                f"{html.escape(self.summary().split(': ', 1)[0])}<table><tr><th>reader</th>"
                f"<th>received</th><th>distinct</th></tr>{rows}</table>Seen: {seen}"
                + (f"<br>Still waiting: {html.escape(', '.join(self.waiting))}"
                   if self.waiting else "") + "</div>")


def visits(cluster, *, mode: str = "distributed_epoch", readers: int = 2, elements: int = 600,
           work_ms: float = 1.0, kill: str | None = None, kill_after: float = 0.3,
           restart_after_s: float | None = 0.5, timeout_s: float = 30.0) -> Visits:
    """Read one epoch of ``elements`` from ``cluster``'s data service with ``readers`` readers
    sharing a job, each element made at ``work_ms`` of one core; with ``kill`` (a data worker,
    ``"data_worker:1"``), kill it once ``kill_after`` of the epoch has been received and
    restart it ``restart_after_s`` later (None: leave it dead). Readers still waiting after
    ``timeout_s`` are left (their threads end with the process) and named in ``waiting``."""
    from dtflab import checks
    from dtflab.train.problems.input_pipeline import input_pipeline
    from dtflab.train.problems import exp_regression

    checks.whole(readers, "readers", maximum=16, example=2)
    checks.whole(elements, "elements", example=600)
    if kill is not None:
        from dtflab.spec import parse_task

        job, index = parse_task(kill)
        if job != "data_worker" or index >= len(cluster.task_addresses.get(job, [])):
            raise ValueError(f"kill names {kill!r}; name a data worker, e.g. data_worker:1")
    if mode == "DATA" and not cluster.fixed_data_workers:
        raise ValueError("static sharding (mode 'DATA') needs a dispatcher that knows its data "
                         "workers from the start; start the cluster with "
                         "fixed_data_workers=True")
    pipeline = input_pipeline(exp_regression(), work_ms=work_ms, service=cluster, mode=mode)
    workers = len(cluster.task_addresses.get("data_worker", []))
    received = {f"reader {r}": [] for r in range(readers)}
    done: dict[str, bool] = {}
    errors: list[str] = []

    def read(name):
        try:
            for index, _, _ in pipeline.examples(elements=elements):
                received[name].append(int(index))
            done[name] = True
        except Exception as exc:  # a reader's failure is part of what is counted
            errors.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            done[name] = True

    threads = [threading.Thread(target=read, args=(name,), name=f"dtflab-{name}", daemon=True)
               for name in received]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    result = Visits(mode, elements, workers, received)
    if kill is not None:
        expected = elements * result.expected
        while sum(map(len, received.values())) < kill_after * expected and len(done) < readers:
            time.sleep(POLL_S)
        result.killed, result.killed_after = kill, sum(map(len, received.values()))
        cluster.kill(kill)
        if restart_after_s is not None:
            time.sleep(restart_after_s)
            cluster.restart(kill)
            result.restarted = True
    for thread in threads:
        thread.join(max(timeout_s - (time.perf_counter() - start), 0.01))
    result.seconds = time.perf_counter() - start
    result.waiting = [name for name in received if name not in done]
    if errors:
        result.waiting += errors
    return result
