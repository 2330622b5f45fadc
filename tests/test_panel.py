"""The status panel: one row per task with its state, kept current by the widget."""

import re

import pytest

from dtflab.ui.panel import AS_THEY_RAN, render_html


def rows(html):
    return re.findall(r'<tr class="dtflab-task" data-task="([^"]+)" data-state="([^"]+)">', html)


def test_one_row_per_task_with_its_state(start_cluster):
    cluster = start_cluster(jobs="chief=1,ps=1,worker=2", backend="inprocess")
    html = render_html(cluster)
    assert rows(html) == [("chief:0", "running"), ("ps:0", "running"),
                          ("worker:0", "running"), ("worker:1", "running")]
    assert "inprocess backend" in html and "4 tasks" in html and "4 running" in html
    for address in (a for tasks in cluster.addresses.values() for a in tasks):
        assert f"grpc://{address}" in html


@pytest.mark.slow
def test_widget_follows_kill_restart_and_stop(start_cluster):
    cluster = start_cluster(2)
    panel = cluster.panel()
    table = panel.children[0]
    assert rows(table.value) == [("ps:0", "running"), ("worker:0", "running")]
    assert re.search(r"<td>\d+</td>\s*<td>\d+</td>", table.value), "pid and memory columns missing"
    cluster.kill("worker:0")
    assert rows(table.value)[1] == ("worker:0", "killed")
    cluster.restart("worker:0")
    assert rows(table.value)[1] == ("worker:0", "running")
    running = [str(task.pid) for task in cluster.tasks]
    cluster.stop()
    assert {state for _, state in rows(table.value)} == {"stopped"}
    # scrolled back to after the stop, the panel still shows the tasks as they ran, and says so
    assert re.findall(r"<td>(\d+)</td>\s*<td>\d+</td>", table.value) == running
    assert AS_THEY_RAN in table.value
    assert AS_THEY_RAN not in render_html(cluster)  # a table read now, with nothing kept
