"""Turn what a user types into a cluster's jobs (``Jobs``): job -> list of (host, port).

Accepted forms (exactly one per cluster):

- a task count, ``3``: one ``ps`` task and the rest ``worker`` tasks (``1`` is one worker);
- ``ps=``/``workers=`` counts;
- ``jobs``: ``"master=1,ps=2"`` or ``{"master": 1, "ps": 2}``, any job names;
- ``spec``: the 2016 server's string ``"master|localhost:2222,ps|localhost:2223"``, where a
  repeated job name adds a task to that job (``ps|...,ps|...`` is ps:0 and ps:1), or a dict /
  ``tf.train.ClusterSpec`` of addresses.

A port of ``None`` means "choose a free one at start"; nothing here opens a socket.

The language is shared by the cluster that writes a spec and the task server that reads one
(``dtflab server --cluster_spec``, run by hand or as a cluster's child), so it sits below both
and imports nothing from dtflab.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: More task servers than this on one machine is a typo, not an experiment (~330 MB each).
MAX_TASKS = 64
DEFAULT_HOST = "127.0.0.1"
DEFAULT_TASKS = 3

_JOB_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:]+\]|[A-Za-z0-9_.\-]+):(?P<port>[^:]+)$")

Address = tuple[str, "int | None"]
Jobs = dict[str, list[Address]]


def parse_count(value, what: str, *, minimum: int = 1) -> int:
    """An integer count from an int or a string, or a ValueError that names the bad value."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a whole number, got {value!r}; for example 3")
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise ValueError(f"{what} must be a whole number, got {value!r}; for example 3")
        value = int(text)
    if not isinstance(value, int):
        raise ValueError(f"{what} must be a whole number, got {value!r}; for example 3")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}; use {minimum} or more")
    if value > MAX_TASKS:
        raise ValueError(
            f"{what} of {value} is more than the {MAX_TASKS} task servers dtflab starts on "
            f"one machine; use a smaller count, or --backend dask to spread tasks over machines"
        )
    return value


def parse_job_name(name: str) -> str:
    if not isinstance(name, str) or not _JOB_NAME.match(name):
        raise ValueError(
            f"bad job name {name!r}: a job name starts with a letter and has only letters, "
            f"digits and '_', for example 'ps' or 'worker'"
        )
    return name


def parse_address(text: str) -> Address:
    """``"host:port"`` -> ``(host, port)``; the port must be a number from 1 to 65535."""
    match = _ADDRESS.match(text.strip()) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"bad address {text!r}: write it as host:port, for example localhost:2222")
    port_text = match["port"]
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"bad port in {text!r}: use a port from 1 to 65535, for example "
                         f"{match['host']}:2222")
    return match["host"], int(port_text)


def parse_jobs(jobs) -> dict[str, int]:
    """``"master=1,ps=2"`` or a mapping -> ``{"master": 1, "ps": 2}``."""
    if isinstance(jobs, Mapping):
        items = [(name, count, None) for name, count in jobs.items()]
    elif isinstance(jobs, str):
        items = []
        for part in jobs.split(","):
            name, sep, count = part.partition("=")
            if not sep:
                raise ValueError(
                    f"bad job entry {part.strip()!r} in jobs {jobs!r}: write job=count, "
                    f"for example 'master=1,ps=2'"
                )
            items.append((name.strip(), count, part.strip()))
    else:
        raise ValueError(f"jobs must be a string like 'master=1,ps=2' or a dict, got {jobs!r}")
    counts: dict[str, int] = {}
    for name, count, typed in items:
        try:
            parse_job_name(name)
        except ValueError as exc:  # quote the entry as it was typed: '=2', not ''
            raise ValueError(f"in jobs entry {typed!r}, {exc}" if typed is not None else str(exc)) from None
        if name in counts:
            raise ValueError(f"job {name!r} is named twice in jobs {jobs!r}; give each job once")
        try:
            counts[name] = parse_count(count, f"the task count of job {name!r}")
        except ValueError as exc:
            raise ValueError(f"in jobs {jobs!r}, {exc}") from None
    if not counts:
        raise ValueError("jobs is empty; give at least one job, for example 'worker=2'")
    return counts


def parse_legacy_spec(text: str) -> Jobs:
    """The 2016 ``--cluster_spec`` string: ``job|host:port`` entries separated by commas.

    A job named more than once gets one task per entry, in order (the source material's
    ``ps_`` renaming workaround is not needed).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            "the cluster spec is empty; write job|host:port entries separated by commas, "
            "for example 'master|localhost:2222,ps|localhost:2223'"
        )
    jobs: Jobs = {}
    for entry in text.split(","):
        entry = entry.strip()
        job, sep, address = entry.partition("|")
        if not sep or "|" in address:
            raise ValueError(
                f"bad cluster spec entry {entry!r}: write job|host:port, for example ps|localhost:2223"
            )
        try:
            jobs.setdefault(parse_job_name(job.strip()), []).append(parse_address(address))
        except ValueError as exc:  # quote the entry as it was typed, not the part parsed
            raise ValueError(f"in cluster spec entry {entry!r}, {exc}") from None
    return _checked(jobs)


def jobs_to_legacy_spec(addresses: Mapping[str, list[str]]) -> str:
    """Inverse of :func:`parse_legacy_spec` for resolved ``host:port`` strings."""
    return ",".join(f"{job}|{address}" for job, tasks in addresses.items() for address in tasks)


def _jobs_from_mapping(spec) -> Jobs:
    if hasattr(spec, "as_dict"):  # tf.train.ClusterSpec
        spec = spec.as_dict()
    jobs: Jobs = {}
    for job, tasks in spec.items():
        if isinstance(tasks, Mapping):  # sparse {index: address}, as ClusterSpec allows
            if sorted(tasks) != list(range(len(tasks))):
                raise ValueError(f"job {job!r} has task indices {sorted(tasks)}; use 0..N-1")
            tasks = [tasks[i] for i in range(len(tasks))]
        if isinstance(tasks, str) or not tasks:
            raise ValueError(f"job {job!r} needs a list of host:port addresses, got {tasks!r}")
        jobs[parse_job_name(job)] = [parse_address(a) for a in tasks]
    return _checked(jobs)


def _checked(jobs: Jobs) -> Jobs:
    seen: dict[Address, str] = {}
    for job, tasks in jobs.items():
        for index, address in enumerate(tasks):
            if address[1] is not None and address in seen:
                raise ValueError(
                    f"{seen[address]} and {job}:{index} both use {address[0]}:{address[1]}; "
                    f"give each task its own port"
                )
            seen[address] = f"{job}:{index}"
    total = sum(len(tasks) for tasks in jobs.values())
    if total > MAX_TASKS:
        raise ValueError(f"{total} tasks is more than the {MAX_TASKS} dtflab starts on one machine")
    return jobs


def _counts_jobs(counts: Mapping[str, int], host: str) -> Jobs:
    return {job: [(host, None)] * count for job, count in counts.items() if count}


def resolve_jobs(n=None, *, ps=None, workers=None, jobs=None, spec=None,
                 host: str = DEFAULT_HOST) -> Jobs:
    """A cluster's jobs for one of the accepted forms (see the module docstring)."""
    given = [name for name, value in (("a task count", n), ("ps/workers", ps if ps is not None else workers),
                                      ("jobs", jobs), ("spec", spec)) if value is not None]
    if len(given) > 1:
        raise ValueError(
            f"give only one of a task count, ps/workers, jobs or spec (got {' and '.join(given)})"
        )
    if spec is not None:
        return parse_legacy_spec(spec) if isinstance(spec, str) else _jobs_from_mapping(spec)
    if jobs is not None:
        return _checked(_counts_jobs(parse_jobs(jobs), host))
    if ps is not None or workers is not None:
        ps_count = 1 if ps is None else parse_count(ps, "ps", minimum=0)
        worker_count = 2 if workers is None else parse_count(workers, "workers", minimum=0)
        if ps_count + worker_count == 0:
            raise ValueError("ps=0 and workers=0 is an empty cluster; ask for at least one task")
        return _checked(_counts_jobs({"ps": ps_count, "worker": worker_count}, host))
    count = parse_count(DEFAULT_TASKS if n is None else n, "the task count")
    return _checked(_counts_jobs({"ps": 1 if count > 1 else 0, "worker": max(count - 1, 1)}, host))


def parse_task(text: str) -> tuple[str, int]:
    """``"worker:1"`` -> ``("worker", 1)``; also ``/job:worker/task:1``. A bare job is task 0."""
    if not isinstance(text, str):
        raise ValueError(f"a task is written JOB:INDEX, for example worker:1, got {text!r}")
    match = re.fullmatch(r"/job:([^/]+)/(?:replica:\d+/)?task:(\d+)", text.strip()) or re.fullmatch(
        r"([^:/\s]+)(?::(\S+))?", text.strip())
    if not match:
        raise ValueError(f"bad task {text!r}: write JOB:INDEX, for example worker:1")
    job, index = match.group(1), match.group(2)
    if index is None:
        return job, 0
    if not index.isdigit():
        raise ValueError(f"bad task index in {text!r}: write JOB:INDEX, for example worker:1")
    return job, int(index)
