import pytest

from dtflab.spec import (
    MAX_TASKS,
    jobs_to_legacy_spec,
    parse_legacy_spec,
    parse_task,
    resolve_jobs,
)

H = "127.0.0.1"


def counts(layout):
    return {job: len(tasks) for job, tasks in layout.items()}


@pytest.mark.parametrize("n, expected", [
    (None, {"ps": 1, "worker": 2}),
    (1, {"worker": 1}),
    (2, {"ps": 1, "worker": 1}),
    (3, {"ps": 1, "worker": 2}),
    ("5", {"ps": 1, "worker": 4}),
])
def test_a_count_makes_one_ps_and_the_rest_workers(n, expected):
    assert counts(resolve_jobs(n)) == expected


@pytest.mark.parametrize("ps, workers, expected", [
    (2, 3, {"ps": 2, "worker": 3}),
    (0, 2, {"worker": 2}),
    (None, 4, {"ps": 1, "worker": 4}),
    (2, None, {"ps": 2, "worker": 2}),
])
def test_ps_and_worker_counts(ps, workers, expected):
    assert counts(resolve_jobs(ps=ps, workers=workers)) == expected


def test_any_job_names_and_counts():
    assert counts(resolve_jobs(jobs="master=1,ps=2")) == {"master": 1, "ps": 2}
    assert counts(resolve_jobs(jobs={"chief": 1, "worker": 2, "ps": 1})) == {
        "chief": 1, "worker": 2, "ps": 1}


def test_ports_are_left_to_choose_at_start_unless_given():
    layout = resolve_jobs(3)
    assert all(port is None and host == H for tasks in layout.values() for host, port in tasks)


def test_legacy_spec_repeated_job_names_are_tasks_of_one_job():
    layout = parse_legacy_spec("master|localhost:2222,ps|localhost:2223,ps|localhost:2224")
    assert layout == {"master": [("localhost", 2222)],
                      "ps": [("localhost", 2223), ("localhost", 2224)]}


def test_legacy_spec_round_trips():
    text = "master|localhost:2222,ps|localhost:2223,ps_|localhost:2224"
    layout = parse_legacy_spec(text)
    addresses = {job: [f"{h}:{p}" for h, p in tasks] for job, tasks in layout.items()}
    assert jobs_to_legacy_spec(addresses) == text


def test_dict_and_cluster_spec_forms():
    assert resolve_jobs(spec={"ps": ["localhost:2223"], "worker": ["h:1", "h:2"]}) == {
        "ps": [("localhost", 2223)], "worker": [("h", 1), ("h", 2)]}


@pytest.mark.parametrize("text, expected", [
    ("worker:1", ("worker", 1)), ("ps", ("ps", 0)), ("/job:ps/task:2", ("ps", 2)),
    ("/job:worker/replica:0/task:1", ("worker", 1)),
])
def test_task_names(text, expected):
    assert parse_task(text) == expected


@pytest.mark.parametrize("kwargs, message", [
    (dict(n=0), r"task count must be at least 1, got 0"),
    (dict(n=-2), r"task count must be at least 1, got -2"),
    (dict(n="three"), r"task count must be a whole number, got 'three'"),
    (dict(n=2.5), r"task count must be a whole number, got 2.5"),
    (dict(n=True), r"task count must be a whole number, got True"),
    (dict(n=10_000), rf"10000 is more than the {MAX_TASKS} task servers"),
    (dict(ps=-1), r"ps must be at least 0, got -1"),
    (dict(ps=0, workers=0), r"ps=0 and workers=0 is an empty cluster"),
    (dict(n=3, ps=1), r"give only one of a task count, ps/workers, jobs or spec"),
    (dict(jobs="master"), r"bad job entry 'master' in jobs 'master': write job=count"),
    (dict(jobs="master=1,master=2"), r"job 'master' is named twice"),
    (dict(jobs="9lives=1"), r"bad job name '9lives'"),
    (dict(jobs="=2"), r"in jobs entry '=2', bad job name ''"),
    (dict(jobs="ps=0"), r"task count of job 'ps' must be at least 1, got 0"),
    (dict(spec=""), r"the cluster spec is empty"),
    (dict(spec="master:2222"), r"bad cluster spec entry 'master:2222': write job\|host:port"),
    (dict(spec="master|localhost"), r"bad address 'localhost': write it as host:port"),
    (dict(spec="ps|localhost:99999"), r"bad port in 'localhost:99999': use a port from 1 to 65535, for example localhost:2222"),
    (dict(spec="ps|localhost:abc"), r"bad port in 'localhost:abc'"),
    (dict(spec="ps|localhost:2222,worker|localhost:2222"),
     r"ps:0 and worker:0 both use localhost:2222; give each task its own port"),
    (dict(spec={"ps": "localhost:2222"}), r"job 'ps' needs a list of host:port addresses"),
])
def test_bad_layouts_name_the_value_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_jobs(**kwargs)


@pytest.mark.parametrize("text", ["worker:x", "worker:-1", "", "a b"])
def test_bad_task_names(text):
    with pytest.raises(ValueError, match="JOB:INDEX"):
        parse_task(text)


def test_a_cluster_reads_host_and_port_of_every_task():
    from dtflab.cluster.base import Cluster

    cluster = Cluster(resolve_jobs(spec="ps|localhost:2222,worker|[::1]:2223,worker|10.0.0.5:2224"))
    cluster.task_addresses = {"ps": ["localhost:2222"], "worker": ["[::1]:2223", "10.0.0.5:2224"]}
    assert cluster.endpoints == {("ps", 0): ("localhost", 2222), ("worker", 0): ("[::1]", 2223),
                                 ("worker", 1): ("10.0.0.5", 2224)}
    assert cluster.ports == [2222, 2223, 2224]
