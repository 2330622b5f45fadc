"""Synchronous all-reduce: MultiWorkerMirroredStrategy in N worker programs (ring over gRPC).

Every worker holds a full copy of the variables, trains on its slice of each global batch and
sums the gradients with the others; there is no parameter server. The workers are programs
started with ``dtflab.run`` (forked from the same warm fork server as every local task, or on a
Dask cluster's workers), each running ``dtflab/train/worker_programs/all_reduce.py``; this notebook
only listens.

What every loop in worker programs shares (checked arguments, the reports, Stop, restarts,
traces) is ``dtflab.train.machinery.program_loops``.
"""

from __future__ import annotations

from pathlib import Path

from dtflab.train.machinery.options import takes_options
from dtflab.train.machinery.program_loops import Loop, ProgramOptions, train_in_programs

LOOP = Loop(Path(__file__).parents[1] / "worker_programs" / "all_reduce.py", "all_reduce",
            "all-reduce", "all-reduce",
            "TF profiler on each worker program, one all-reduce step; CollectiveReduceV2 is the "
            "all-reduce")


@takes_options(ProgramOptions)
def all_reduce(problem, *, bucket_bytes: int = 0, **options):
    """Train ``problem`` with MultiWorkerMirroredStrategy in ``workers`` worker programs.

    In [1]: run = train.all_reduce(problem, workers=2, background=True)
    In [2]: Dashboard(run)

    Each worker makes and trains only its own slice of each global batch and reports the
    slice's loss; each record carries the global batch's (so every worker's curve is the
    same). Every ``check_every`` steps (and at the last) the workers agree whether to stop,
    in a collective of their own, and report a fingerprint of their weights
    (``history.details["fingerprints"]``: one list per worker, equal when the copies agree):
    a Stop ends every worker at the next such step. The step itself has one collective, the
    gradients'. ``slow={"worker:1": 0.05}`` makes that worker sleep that long before each
    step: a straggler. ``trace_step=k`` profiles step k on every worker (``history.trace``: a
    per-worker timeline with the collectives).

    A worker that dies stops the whole job (every other worker waits for it in the next
    all-reduce). With ``checkpoint_every=K`` each worker saves every K steps, and the run
    restarts every worker from the newest checkpoint and goes on (``history.recoveries``
    says how many steps were lost); without it the run ends with a ``TaskError``.
    ``history.cluster`` is the program cluster (running until the run ends: kill a worker
    there to see a fault). ``threads=1`` gives each worker one intra-op and one inter-op
    thread (one core each, for speedup measurements); ``collective_timeout_s`` bounds how
    long a collective waits for the others (TensorFlow's default: no limit).
    ``bucket_bytes=B`` packs the gradients into all-reduces of about B bytes
    (``CommunicationOptions(bytes_per_pack=B)``) instead of one: a pack whose gradients are
    ready can go while the others are still computed; ``history.overlap_share`` of a traced
    step says how much collective time compute hid.

    ``lockstep=True`` makes each worker wait, after each step, until this notebook has
    recorded it and run the callbacks: callbacks then see the workers between steps (what
    ``WireBytes`` needs for exact per-step bytes; it turns this on), for one local round trip
    per step. The watchdog reports a step that stalls (every worker waits in the collective);
    if it lasts ``1 + retries`` times the watchdog's bound, the run restarts every worker from
    the newest checkpoint (with ``checkpoint_every``) or ends with a ``StallError``.

    In [3]: train.all_reduce(problem, workers=2, scheduler="tcp://10.0.0.5:8786",
       ...:                  checkpoint_every=10, checkpoint_dir="/shared/run1")

    ``scheduler`` (an address) or ``client`` (a ``dask.distributed.Client``) runs the worker
    programs on that Dask cluster's workers, one per Dask worker, as ``dtflab.run`` does
    (``backend="dask"`` alone: on a Dask LocalCluster of this machine). This notebook then
    listens on every interface, and each worker reports to this machine's address on the
    interface that routes to its host. Checkpoints and traces then need ``checkpoint_dir``: a
    folder this machine and every worker's host share (NFS, say), where a restarted worker
    finds the newest checkpoint and this notebook the workers' profiles.
    """
    options = ProgramOptions(**options).checked(problem, "all_reduce")
    options.layout.without("all_reduce", zero="keeps a whole copy on every worker (train.zero "
                           "shards it)")
    if bucket_bytes != 0:
        from dtflab import checks

        checks.whole(bucket_bytes, "bucket_bytes", example=1 << 20)
    return train_in_programs(LOOP, problem, options, flags={"bucket_bytes": bucket_bytes})
