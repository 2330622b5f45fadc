"""An input pipeline with a cost: an MLP problem's examples made one by one by tf.data, each
with CPU work the learner sets (a stand-in for decoding, augmenting, tokenising), read in this
process or from the cluster's tf.data service.

In [1]: slow = train.input_pipeline(problem, work_ms=1.0)      # made here
In [2]: served = slow.served_by(cluster)                         # from the data service
In [3]: train.sync_data_parallel(problem, cluster, inputs=served).input_wait_share()

The work is a chain of small matrix products on one core, its length calibrated here so that
making an element costs ``work_ms`` of processor time in all; ``work_s`` is what it measured. Making
an element costs something even with no work (tf.data's per-element cost, its random draws:
about a third of a millisecond on the machine this was written on), and no less can be asked. The examples are the
problem's own kind (its class centres, its regression), drawn per element from a seed and the
element's index, so they are not ``Problem.batch``'s rows: a run reading a pipeline trains on
other (equally distributed) data than one reading ``Problem.batch``.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field, replace

import numpy as np

from dtflab import checks
from dtflab._quiet import import_tf
from dtflab.errors import did_you_mean

#: How TensorFlow names who reads what (``distribute``'s ``processing_mode``): its two modes,
#: then its sharding policies. ``DATA`` needs ``fixed_data_workers=True`` at the cluster's start.
MODES = ("parallel_epochs", "distributed_epoch", "OFF", "DYNAMIC", "DATA", "FILE_OR_DATA")
#: The side of the square matrix the work multiplies by itself, once per round.
WORK_SIDE = 32
#: Rounds timed to learn one round's cost, and elements timed to measure an element's.
PROBE_ROUNDS, PROBE_ELEMENTS = 200, 48
#: Elements in an endless pipeline (tf.data's range: its length must be finite to split).
ENDLESS = 2 ** 40

_job_names = itertools.count()


@dataclass(frozen=True)
class InputPipeline:
    """``problem``'s examples, each made with ``rounds`` rounds of work (``work_s`` seconds of
    one core, measured), ``parallel`` at once, batched ``problem.batch_size`` at a time; read
    here, or from the data service at ``service`` in ``mode`` (each data worker then makes
    ``parallel`` at once)."""

    problem: object
    rounds: int
    work_s: float
    service: str | None = None
    mode: str = "distributed_epoch"
    parallel: int = 1
    #: Consumers that share a job name share its elements (``distributed_epoch``: each
    #: element to one of them); None: a job of its own for each reader.
    job: str | None = field(default=None, compare=False)

    @property
    def where(self) -> str:
        at_once = f"{self.parallel} at once"
        return f"the data service ({self.mode}, {at_once} a worker)" if self.service else \
            f"this process ({at_once})"

    def examples(self, seed: int = 0, elements: int | None = None):
        """The dataset of ``(index, x, t)`` for elements ``0 .. elements - 1`` (endless by
        default), each with its work done, read where this pipeline reads."""
        return self._read(self._made(seed, elements))

    def dataset(self, seed: int = 0, elements: int | None = None,
                part: tuple[int, int] | None = None, whole: bool = False):
        """Batches ``(x, t)`` of ``problem.batch_size`` examples, made (and, with a service,
        sent) whole. ``part=(i, n)``: worker ``i`` of ``n``'s share of each batch
        (``batch_size // n`` examples; ``whole``: whole batches, each worker its own), of
        elements of its own: made here, every ``n``-th element from the ``i``-th; from the
        service, what the job hands it."""
        size, shard = self.problem.batch_size, None
        if part is not None:
            size //= 1 if whole else part[1]
            shard = None if self.service else part
        made = self._made(seed, elements, shard).map(lambda i, x, t: (x, t))
        return self._read(made.batch(size, drop_remainder=True))

    def _made(self, seed: int, elements: int | None, shard: tuple[int, int] | None = None):
        tf = import_tf()
        options = tf.data.Options()
        # exactly ``parallel`` at once: tf.data would otherwise run a stateless map in parallel
        options.experimental_optimization.map_parallelization = False
        indices = tf.data.Dataset.range(elements or ENDLESS)
        if shard is not None:
            indices = indices.shard(shard[1], shard[0])
        return indices.map(
            self._element_fn(seed), num_parallel_calls=self.parallel if self.parallel > 1
            else None).with_options(options)

    def _read(self, dataset):
        """``dataset`` read here, or through the data service."""
        if not self.service:
            return dataset
        tf = import_tf()
        return dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=_mode(tf, self.mode), service=self.service, job_name=self.job))

    def served_by(self, service, mode: str | None = None) -> "InputPipeline":
        """The same pipeline (the same measured work) read from ``service`` (a cluster with
        a data service, or its address), in ``mode`` (default: this pipeline's), as a job of its
        own; ``service=None``: made here."""
        mode = self.mode if mode is None else check_mode(mode)
        address = service_address(service)
        return replace(self, service=address, mode=mode,
                       job=f"dtflab-{next(_job_names)}" if address else None)

    def check_problem(self, problem) -> None:
        """Refuse a run of another problem than this pipeline makes examples of."""
        if self.problem != problem:
            raise ValueError(f"the input pipeline makes {self.problem.name}'s examples and this "
                             f"run trains {problem.name}; make it with "
                             f"train.input_pipeline(problem)")

    def batches(self, seed: int = 0, part: tuple[int, int] | None = None, whole: bool = False):
        """A callable ``batches(step) -> (xs, ts)`` as numpy arrays, the next batch each call
        (the loops call it step after step, as they call ``Problem.batch``); ``part`` and
        ``whole`` as in :meth:`dataset`."""
        iterator = iter(self.dataset(seed, part=part, whole=whole))

        def next_batch(step: int):
            x, t = next(iterator)
            return x.numpy(), t.numpy()

        return next_batch

    def _element_fn(self, seed: int):
        tf = import_tf()
        problem, rounds = self.problem, self.rounds
        centers = tf.constant(problem._centers(seed)) if problem.loss_kind == "softmax" else None

        def element(index):
            key = tf.stack([tf.constant(seed, tf.int64), index])
            if centers is None:
                x = tf.random.stateless_uniform([1], key)
                t = tf.exp(x)
            else:
                t = tf.random.stateless_uniform([], key, 0, problem.layers[-1], tf.int64)
                x = tf.gather(centers, t) + 1.5 * tf.random.stateless_normal(
                    [problem.layers[0]], key + 1)
            x = x + 1e-30 * work(tf, key, rounds)  # kept: the work cannot be pruned away
            return index, x, t

        return element

    def to_json(self) -> str:
        """This pipeline as the JSON a worker program reads back with :func:`from_json`."""
        from dtflab.train import problems

        return json.dumps({"problem": problems.to_json(self.problem), "rounds": self.rounds,
                           "work_s": self.work_s, "service": self.service, "mode": self.mode,
                           "parallel": self.parallel, "job": self.job})

    def __repr__(self) -> str:
        return (f"<InputPipeline {self.problem.name}: {self.work_s * 1e3:.3g} ms of work an "
                f"example, read from {self.where}>")


def from_json(text: str) -> InputPipeline:
    """The pipeline :meth:`InputPipeline.to_json` wrote."""
    from dtflab.train import problems

    data = json.loads(text)
    return InputPipeline(problems.from_json(data.pop("problem")), **data)


def work(tf, key, rounds):
    """``rounds`` products of a small matrix with itself, on one core: the element's cost."""
    m = tf.random.stateless_normal([WORK_SIDE, WORK_SIDE], key)

    def body(i, m):
        return i + 1, tf.tanh(tf.matmul(m, m) * 0.1)

    _, m = tf.while_loop(lambda i, m: i < rounds, body, (tf.constant(0), m))
    return tf.reduce_sum(m)


def input_pipeline(problem, *, work_ms: float = 0.2, service=None,
                   mode: str = "distributed_epoch", parallel: int = 1) -> InputPipeline:
    """The examples of an MLP ``problem`` made by tf.data at ``work_ms`` milliseconds of one
    core each (calibrated and measured now, in well under a second), read in this process
    or from ``service``: a cluster started with ``data_workers=N``, or its dispatcher's
    address, read in ``mode`` (one of ``MODES``). Whoever makes them makes ``parallel`` at
    once."""
    from dtflab.train.problems import needs_mlp

    needs_mlp(problem, "train.input_pipeline")
    if isinstance(work_ms, bool) or not isinstance(work_ms, (int, float)) or \
            not 0 <= work_ms <= 1000:
        raise ValueError(f"work_ms must be milliseconds of work an example, 0 to 1000, got "
                         f"{work_ms!r}; for example work_ms=0.2")
    checks.whole(parallel, "parallel", maximum=64, example=2)
    check_mode(mode)
    address = service_address(service)  # refused before the calibration, not after
    rounds, work_s = calibrated_rounds(problem, work_ms / 1e3)
    return InputPipeline(problem, rounds, work_s, None, mode, parallel).served_by(address)


def service_address(service) -> str | None:
    """The dispatcher's ``grpc://`` address of a cluster (or the address itself)."""
    if service is None:
        return None
    if isinstance(service, str):
        if "://" not in service:
            raise ValueError(f"bad data service address {service!r}; write it as "
                             f"grpc://host:port, or pass the cluster")
        return service
    address = getattr(service, "data_service", None)
    if address is None:
        raise ValueError(f"{service!r} has no data service; start one with data_workers=N "
                         f"(%dtf_cluster start 3 --data-workers 2 --replace)")
    return address


def calibrated_rounds(problem, seconds: float) -> tuple[int, float]:
    """The rounds of work that bring making one of ``problem``'s examples to ``seconds`` of one
    core here (none where making it alone costs that much), and what such an example measured:
    the rounds set from a probe of :data:`PROBE_ROUNDS`, then, while an example measures more
    than a tenth off, set again from that measurement (four times at most: on a busy machine
    the probe read a round 1.6 times its cost, and an example asked for 2 ms measured 1.28;
    after two settings, one asked for 4 ms in CI still measured 2.33)."""
    base = element_seconds(problem, 0)
    per_round = (element_seconds(problem, PROBE_ROUNDS) - base) / PROBE_ROUNDS
    rounds = max(0, round((seconds - base) / max(per_round, 1e-9)))
    if not rounds:
        return 0, base
    measured = element_seconds(problem, rounds)
    for _ in range(4):
        if abs(measured / seconds - 1) <= 0.1:
            break
        per_round = max(measured - base, 1e-9) / rounds
        rounds = max(1, round((seconds - base) / per_round))
        measured = element_seconds(problem, rounds)
    return rounds, measured


def element_seconds(problem, rounds: int, elements: int = PROBE_ELEMENTS) -> float:
    """CPU seconds (this process's, every thread's) one of ``problem``'s examples with ``rounds``
    rounds of work takes to make, made one at a time and read in batches, as the pipeline makes
    them (the median of three batches after a first, whose iterator's start is left out)."""
    batches = iter(InputPipeline(problem, rounds, 0.0)._made(0, None).batch(elements))
    next(batches)  # an iterator's start costs more than an element: left out
    timings = []
    for _ in range(3):
        start = time.process_time()  # every thread's: tf.data may spread one element's ops
        next(batches)
        timings.append((time.process_time() - start) / elements)
    return float(np.median(timings))


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}{did_you_mean(mode, MODES)}; choose one of: "
                         f"{', '.join(MODES)}")
    return mode


def _mode(tf, mode: str):
    if mode in ("parallel_epochs", "distributed_epoch"):
        return mode
    return getattr(tf.data.experimental.service.ShardingPolicy, mode)
