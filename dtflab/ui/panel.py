"""The cluster status panel: an HTML table, and a widget that keeps it current."""

from __future__ import annotations

import collections
import functools

NOTES = {
    "inprocess": "In-process servers cannot be killed or restarted, and keep their ports "
                 "until the kernel exits.",
    "dask": "Each task runs as a child process of the Dask worker named in the host column.",
}


@functools.lru_cache(maxsize=None)
def _template(name: str):
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("dtflab.ui", "templates"),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True)
    return env.get_template(name)


STARTED = {"fork": "tasks forked from a warm TensorFlow",
           "spawn": "tasks spawned (each imports TensorFlow)"}


#: Under a stopped cluster's table, where the panel read its tasks while they ran.
AS_THEY_RAN = ("Stopped. The pid and memory columns show each task as this panel last read it "
               "while it ran.")


def render_html(cluster, ran: dict | None = None) -> str:
    """The status table of ``cluster`` as HTML (states and memory read now). ``ran``: each
    task's ``(pid, memory MiB)`` as last read while it ran, kept up to date here; once every
    task has stopped, the table shows those, and says so."""
    tasks = cluster.tasks
    counts = collections.Counter(str(task.state) for task in tasks)
    summary = ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
    read = {task.name: (task.pid, task.memory_mb) for task in tasks}
    stopped = bool(tasks) and all(str(task.state) == "stopped" for task in tasks)
    if ran is not None:
        if stopped and ran:
            read = {name: ran.get(name, (None, None)) for name in read}
        else:
            ran.update({name: seen for name, seen in read.items() if seen[0] is not None})
    return _template("cluster.html.j2").render(
        backend=cluster.backend, tasks=tasks, summary=summary, read=read,
        as_they_ran=AS_THEY_RAN if stopped and ran else "",
        show_pid=any(pid is not None for pid, _ in read.values()) or cluster.backend == "local",
        show_host=any(task.host for task in tasks), note=NOTES.get(cluster.backend, ""),
        dashboard=getattr(cluster, "dashboard_link", None), exposed=cluster.exposed,
        max_exposed=6, reason=cluster.exposure_reason,
        show_program=any(task.program for task in tasks),
        started=STARTED.get(cluster.start_method, ""),
        why_not_fork=getattr(cluster, "why_not_fork", ""))


def ClusterPanel(cluster):
    """A widget showing ``cluster``'s tasks, refreshed on every kill, restart and stop.

    Falls back to a plain HTML display object where ipywidgets is not installed.
    """
    try:
        import ipywidgets
    except ImportError:
        from IPython.display import HTML

        return HTML(render_html(cluster))

    ran = {}  # each task's pid and memory as last read while it ran
    table = ipywidgets.HTML(render_html(cluster, ran))
    refresh = ipywidgets.Button(description="Refresh", icon="refresh",
                                tooltip="read task states and memory again",
                                layout=ipywidgets.Layout(width="auto"))

    def update(*_):
        table.value = render_html(cluster, ran)

    refresh.on_click(update)
    cluster._watchers.append(update)
    box = _panel_box()([table, refresh])
    box.add_class("dtflab-cluster-panel")
    return box


@functools.lru_cache(maxsize=None)
def _panel_box():
    """The panel's widget class (made on first use: ipywidgets is imported only then)."""
    import ipywidgets

    class PanelBox(ipywidgets.VBox):
        """The panel: shown with a still of its table where no kernel drives widgets."""

        def _repr_mimebundle_(self, **kwargs):
            from dtflab.viz.output import with_a_still

            live = super()  # with_a_still asks it for the widget's own display data
            return with_a_still(live, [], self.children[0].value,
                                when="as this run showed it then")

    return PanelBox
