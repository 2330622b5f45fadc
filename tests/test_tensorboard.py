"""Every run's TensorBoard files, read back by TensorBoard itself: a real server on a port chosen
now, its scalars, its HParams table of two layouts, the profile plugin (XProf) listing every
worker of a traced step and its trace viewer showing the step's ops; the magic; bad input."""

import gzip
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from unittest import mock

import psutil
import pytest
from conftest import wait_until

import dtflab
from dtflab import train

pytestmark = pytest.mark.slow

PROBLEM = train.classification(width=32, batch_size=32, features=8)
TEXT = train.transformer(blocks=2, d_model=32, heads=2, sequence=16, batch_size=8)


def get(board, path: str, body: dict | None = None):
    """What TensorBoard answers at ``path`` (JSON, ungzipped)."""
    request = urllib.request.Request(board.url + path, data=json.dumps(body).encode() if body
                                     else None, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        data = answer.read()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two layouts of one transformer (a pipeline of two stages and four micro-batches, and
    all-reduce over two workers), each with its step 3 traced, and a traced one-process run, in
    one run directory, with TensorBoard on it."""
    logdir = tmp_path_factory.mktemp("runs")
    # this module reads the graph loop's profiles, which the suite leaves out elsewhere (conftest)
    with mock.patch.dict(os.environ, {"DTFLAB_PROFILE": "1"}), \
            dtflab.start_cluster(workers=2) as cluster:
        pipeline = train.pipeline(TEXT, cluster, stages=2, micro_batches=4, steps=8,
                                  trace_step=3, logdir=logdir)
    reduced = train.all_reduce(TEXT, workers=2, steps=8, trace_step=3, logdir=logdir)
    single = train.single(PROBLEM, steps=8, trace_step=3, logdir=logdir)
    board = dtflab.tensorboard(logdir)
    yield {"pipeline": pipeline, "all_reduce": reduced, "single": single, "board": board,
           "logdir": logdir}
    board.stop()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def scalars(board, run: str, tag: str) -> list[tuple[int, float]]:
    found = get(board, f"data/plugin/scalars/scalars?run={run}&tag={tag}")
    return [(step, value) for _, step, value in found]


def test_each_run_has_a_folder_named_by_its_loop_and_layout_with_its_curves(runs):
    board, pipeline, reduced = runs["board"], runs["pipeline"], runs["all_reduce"]
    assert Path(pipeline.logdir).parent == runs["logdir"]
    assert Path(pipeline.logdir).name.startswith("pipeline-p2-mb4-1f1b-")
    assert Path(reduced.logdir).name.startswith("all_reduce-d2-")
    listed = get(board, "data/runs")
    name = Path(pipeline.logdir).name
    assert name in listed
    # TensorBoard draws what the run measured: the first and last steps, and each step or, for
    # steps faster than EVERY_S, their mean, at the latest one's loss
    losses = dict(scalars(board, name, "loss"))
    assert {0, 7} <= set(losses) <= set(range(8))
    assert losses == pytest.approx({step: pipeline.losses[step] for step in losses}, rel=1e-6)
    tokens = dict(scalars(board, name, "tokens_per_s"))
    examples = dict(scalars(board, name, "examples_per_s"))
    assert tokens[7] == pytest.approx(examples[7] * TEXT.sequence, rel=1e-6)
    # every worker of a worker program has its own curve, and the step's merged one is the run's
    reduced_name = Path(reduced.logdir).name
    assert {f"{reduced_name}/worker-0", f"{reduced_name}/worker-1"} <= set(listed)
    merged = dict(scalars(board, reduced_name, "loss"))
    assert 7 in merged and merged == pytest.approx(
        {step: reduced.losses[step] for step in merged}, rel=1e-6)
    # each point's step time is the mean over the steps since the last point: they add up to
    # the run's time at its last step
    points = scalars(board, reduced_name, "step_time_s")
    steps = [step for step, _ in points]
    covered = sum(mean * (step - before) for (step, mean), before in zip(points, [-1] + steps))
    assert covered == pytest.approx(reduced.step_records[-1].time_s, rel=1e-3)


def test_the_hparams_table_lines_up_two_layouts_with_their_metrics(runs):
    board = runs["board"]
    experiment = get(board, "data/plugin/hparams/experiment", {"experimentName": ""})
    infos = {info["name"]: info for info in experiment["hparamInfos"]}
    assert {"pipeline", "all_reduce", "single"} <= set(infos["loop"]["domainDiscrete"])
    assert infos["data"]["differs"] and infos["pipeline"]["differs"]
    metrics = {info["name"]["tag"] for info in experiment["metricInfos"]}
    assert {"final/loss", "final/step_time_s"} <= metrics
    groups = get(board, "data/plugin/hparams/session_groups", {
        "experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS",
                                                  "STATUS_FAILURE", "STATUS_RUNNING"],
        "colParams": [{"hparam": "loop"}, {"metric": {"tag": "final/loss", "group": ""}}],
        "startIndex": 0, "sliceSize": 10})
    by_loop = {group["hparams"]["loop"]: group for group in groups["sessionGroups"]}
    assert set(by_loop) == {"pipeline", "all_reduce", "single"}
    pipeline = by_loop["pipeline"]
    assert pipeline["hparams"]["micro_batches"] == 4 and pipeline["hparams"]["schedule"] == "1f1b"
    final = {m["name"]["tag"]: m["value"] for m in pipeline["metricValues"]}
    assert final["final/loss"] == pytest.approx(runs["pipeline"].final_loss(), rel=1e-6)


def test_a_traced_worker_program_step_is_in_xprof_for_every_worker(runs):
    board, reduced = runs["board"], runs["all_reduce"]
    profiled = [run for run in get(board, "data/plugin/profile/runs")
                if run.startswith(Path(reduced.logdir).name + "/")]
    assert len(profiled) == 1
    run = profiled[0]
    assert "trace_viewer@" in get(board, f"data/plugin/profile/run_tools?run={run}")
    hosts = get(board, f"data/plugin/profile/hosts?run={run}&tag=trace_viewer@")
    assert sorted(h["hostname"] for h in hosts) == ["worker-0", "worker-1"]
    trace = get(board, f"data/plugin/profile/data?run={run}&tag=trace_viewer@&host=worker-1")
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("CollectiveReduce" in name for name in names), sorted(names)[:40]
    assert any("MatMul" in name for name in names), sorted(names)[:40]


def test_a_traced_pipeline_step_is_in_xprof_for_every_task(runs):
    board = runs["board"]
    profiled = [run for run in get(board, "data/plugin/profile/runs")
                if run.startswith(Path(runs["pipeline"].logdir).name + "/")]
    assert len(profiled) == 1
    hosts = get(board, f"data/plugin/profile/hosts?run={profiled[0]}&tag=trace_viewer@")
    assert sorted(h["hostname"] for h in hosts) == ["ps-0", "worker-0", "worker-1"]
    trace = get(board, f"data/plugin/profile/data?run={profiled[0]}&tag=trace_viewer@&host=worker-1")
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("MatMul" in name for name in names), " ".join(sorted(names))  # stage 2's forward
    assert "_Send" in names, " ".join(sorted(names))  # its input's gradient, back to stage 1


def test_a_traced_graph_step_is_in_the_graphs_tab_and_its_memory_by_kind_per_device(runs):
    board, single = runs["board"], runs["single"]
    name = Path(single.logdir).name
    info = get(board, "data/plugin/graphs/info")
    assert info[name]["tags"]["traced step"]["profile"]
    from dtflab.train.machinery.traced_memory import step_memory

    [held] = step_memory(single.trace.metadata).values()  # one device
    drawn = dict(scalars(board, f"{name}/localhost-0", "memory/parameters"))
    assert list(drawn.values()) == [pytest.approx(held["parameters"])]


def test_tensorflows_own_reader_checks_every_records_checksums(runs):
    # dtflab writes the records itself (its checksum in C): TensorFlow's reader checks both sums
    # of every record and must read back the losses TensorBoard drew
    import tensorflow as tf

    [events] = Path(runs["single"].logdir).glob("events.out.tfevents.*")
    read = [event for event in tf.compat.v1.train.summary_iterator(str(events))]
    assert read[0].file_version == "brain.Event:2"
    losses = {event.step: value.simple_value for event in read for value in event.summary.value
              if value.tag == "loss"}
    assert losses == pytest.approx({s: runs["single"].losses[s] for s in losses}, rel=1e-6)
    assert 7 in losses
    broken = bytearray(events.read_bytes())
    broken[-3] ^= 0xFF  # a byte of the last record's checksum
    copy = events.with_name(events.name + ".broken")
    copy.write_bytes(bytes(broken))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.compat.v1.train.summary_iterator(str(copy)))
    copy.unlink()


def test_a_folder_that_cannot_be_written_is_said_once_and_the_run_trains_on(tmp_path):
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("not a folder")
    with pytest.warns(UserWarning, match=f"{in_the_way}.*a file is in the way.*logdir="):
        history = train.single(PROBLEM, steps=4, logdir=in_the_way)
    assert len(history.losses) == 4 and history.logdir is None
    with pytest.raises(ValueError, match=r"logdir=3: a folder's path"):
        train.single(PROBLEM, steps=4, logdir=3)
    history = train.single(PROBLEM, steps=4, logdir=False)
    assert history.logdir is None
    with pytest.raises(ValueError, match=f"no run in {tmp_path} yet"):
        dtflab.tensorboard(tmp_path)


def test_the_magic_opens_tensorboard_in_the_notebook_through_the_server_proxy(ip, runs):
    board = ip.run_line_magic("dtf_tensorboard", str(runs["logdir"]))
    assert board is runs["board"]  # one server per folder and kernel
    page = board._repr_html_()
    assert f"proxy/{board.port}/" in page and "jupyter-config-data" in page


def test_stopping_tensorboard_removes_its_log_file(tmp_path):
    train.single(PROBLEM, steps=3, logdir=tmp_path)
    board = dtflab.tensorboard(tmp_path)
    log = Path(board._log.name)
    assert log.exists()
    board.stop()
    assert gone(board.process.pid) and not log.exists()


def test_tensorboard_ends_with_the_program_that_started_it(tmp_path):
    history = train.single(PROBLEM, steps=3, logdir=tmp_path)
    assert history.logdir
    code = (f"import dtflab, time; board = dtflab.tensorboard({str(tmp_path)!r}); "
            f"print(board.process.pid, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        board_pid = int(owner.stdout.readline())
        assert not gone(board_pid)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        owner.stdout.close()
    assert wait_until(lambda: gone(board_pid), timeout=10)


def test_a_step_traced_alone_keeps_its_graph_and_every_tasks_profile(start_cluster, tmp_path):
    import tensorflow as tf

    cluster = start_cluster(2)
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            weights = tf.Variable(tf.ones([64, 64]))
        with tf.device("/job:worker/task:0"):
            product = tf.reduce_sum(tf.matmul(weights, weights))
        with tf.compat.v1.Session(cluster.target("worker", 0)) as session:
            session.run(weights.initializer)
            traced = dtflab.trace(session, product, cluster=cluster, logdir=tmp_path)
            alone = dtflab.trace(session, product, logdir=False)  # kept nowhere
    assert traced.result == alone.result == 64 ** 3 and traced.bytes_between()  # crossed tasks
    [folder] = list(tmp_path.iterdir())
    assert folder.name.startswith("trace-")
    kept = sorted(path.name for path in folder.glob("plugins/profile/*/*.xplane.pb"))
    assert kept == ["ps-0.xplane.pb", "worker-0.xplane.pb"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    assert events.Tags()["run_metadata"] == ["traced step"]


def test_a_run_too_short_to_time_a_step_still_writes_its_files(start_cluster, tmp_path):
    # CI-1129: a background Downpour run stopped after two steps a worker wrote no files and
    # warned (its end asked for a median step, which is timed from a worker's fourth step on).
    cluster = start_cluster(jobs="ps=1,worker=2")
    history = train.async_parameter_server(PROBLEM, cluster, steps=2, logdir=tmp_path)
    assert len(history.records) == 4 and len({record.worker for record in history.records}) == 2
    with pytest.raises(ValueError, match="a step is measured from the fourth on"):
        history.median_step_s()
    assert history.logdir is not None and any(Path(history.logdir).rglob("events.out.tfevents.*"))


def test_a_notebooks_runs_go_to_a_folder_named_for_it_beside_it(monkeypatch):
    from dtflab.train.machinery.logdir import NOTEBOOK, run_directory

    monkeypatch.delenv("DTFLAB_LOGDIR", raising=False)
    monkeypatch.setenv(NOTEBOOK, "/home/learner/notebooks/ja/14_plan_a_run.ipynb")
    assert run_directory(None) == Path("runs/14_plan_a_run")
    assert run_directory("elsewhere") == Path("elsewhere") and run_directory(False) is None
    monkeypatch.setenv(NOTEBOOK, "/home/learner/console-1")  # a console's session: no notebook
    assert run_directory(None) == Path("runs")
    monkeypatch.delenv(NOTEBOOK)
    assert run_directory(None) == Path("runs")
    monkeypatch.setenv("DTFLAB_LOGDIR", "/tmp/all-runs")
    monkeypatch.setenv(NOTEBOOK, "/home/learner/notebooks/14_plan_a_run.ipynb")
    assert run_directory(None) == Path("/tmp/all-runs")
