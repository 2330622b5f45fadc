"""The placement editor: move variables between devices, apply, see what changed."""

from __future__ import annotations

from dtflab._quiet import import_tf
from dtflab.placement.plan import STRATEGIES, PlacementPlan, variable_info
from dtflab.tracing.step import short_device

STRATEGY_LABELS = {"round_robin": "Round robin", "greedy": "Greedy by bytes",
                   "by_layer": "By layer", "single": "All on compute device"}


def build_graph(builder, plan: PlacementPlan):
    """Run ``builder()`` in a fresh graph under ``plan``: (graph, fetch, feed, init, variables)."""
    tf = import_tf()
    graph = tf.Graph()
    with graph.as_default(), plan.scope():
        fetch, feed = builder()
        init = tf.compat.v1.global_variables_initializer()
        variables = [variable_info(v) for v in tf.compat.v1.trainable_variables()]
    return graph, fetch, feed, init, variables


class PlacementEditor:
    """A table of the model's variables with a device selector per row, strategy buttons and
    Apply, which rebuilds the graph, traces one step and redraws the views beside the table.

    In [1]: editor = PlacementEditor(cluster, builder, job="ps")
    In [2]: editor            # shows the widget; editor.plan is the live plan

    ``builder()`` builds the model in the current graph and returns ``(fetch, feed_dict)``;
    variables are those it creates (``trainable_variables``). Changing a selector assigns that
    variable (a manual rule); changing ``editor.plan`` from Python updates the selectors.
    A strategy button starts the plan over (manual rules are dropped).
    """

    def __init__(self, cluster, builder, plan: PlacementPlan | None = None, *, job: str = "ps",
                 apply: bool = True):
        import ipywidgets as w

        self.cluster, self.builder, self.job = cluster, builder, job
        self.plan = plan or PlacementPlan.round_robin(cluster, job=job)
        self.step = None
        _, _, _, _, self.variables = build_graph(builder, self.plan)
        self._syncing = False
        devices = [(short_device(d), d) for d in self.plan.devices]
        self.selectors = {}
        rows = [w.HTML("<b>variable</b>"), w.HTML("<b>shape</b>"), w.HTML("<b>dtype</b>"),
                w.HTML("<b>bytes</b>"), w.HTML("<b>device</b>")]
        for info in self.variables:
            selector = w.Dropdown(options=devices, value=self.plan.device_for(info.name, info.nbytes),
                                  layout=w.Layout(width="120px"))
            selector.observe(self._on_select(info.name), names="value")
            self.selectors[info.name] = selector
            rows += [w.Label(info.name), w.Label("x".join(map(str, info.shape)) or "scalar"),
                     w.Label(info.dtype), w.Label(f"{info.nbytes:,}"), selector]
        table = w.GridBox(rows, layout=w.Layout(grid_template_columns="repeat(5, auto)",
                                                grid_gap="2px 12px"))
        self.strategy_buttons = {}
        for strategy in STRATEGIES:
            button = w.Button(description=STRATEGY_LABELS[strategy], layout=w.Layout(width="auto"))
            button.on_click(lambda _, s=strategy: self.use_strategy(s))
            self.strategy_buttons[strategy] = button
        self.apply_button = w.Button(description="Apply", button_style="primary", icon="play")
        self.apply_button.on_click(lambda _: self.apply())
        self.status = w.HTML()
        self.views = w.VBox()
        controls = w.VBox([table, w.HBox(list(self.strategy_buttons.values())),
                           w.HBox([self.apply_button, self.status])])
        self.widget = w.HBox([controls, self.views])
        self.plan._watchers.append(self._sync_from_plan)
        if apply:
            self.apply()

    def use_strategy(self, strategy: str) -> None:
        self.plan.use_strategy(strategy, job=self.job, variables=self.variables)

    def apply(self) -> None:
        """Rebuild with the current plan, trace one step, redraw the views."""
        from jupyter_bokeh import BokehModel

        import dtflab
        from bokeh.layouts import column, row
        from dtflab.viz.partition import partition_figure
        from dtflab.viz.placement import placement_figure
        from dtflab.viz.timeline import timeline_figure
        from dtflab.viz.transfers import transfer_matrix_figure

        tf = import_tf()
        graph, fetch, feed, init, self.variables = build_graph(self.builder, self.plan)
        job, index = self.plan.compute.split("/")[1][4:], int(self.plan.compute.split(":")[-1])
        with tf.compat.v1.Session(self.cluster.target(job, index), graph=graph) as session:
            session.run(init)
            session.run(fetch, feed)  # the first run sets the graph up on every task
            self.step = dtflab.trace(session, fetch, feed)
        wire = sum(t.nbytes for t in self.step.transfers)
        self.status.value = (f"{len(self.step.transfers)} transfers, <b>{wire:,} bytes</b> on the "
                             f"wire, step {self.step.step_us / 1000:.1f} ms, imbalance "
                             f"{self.plan.imbalance(self.variables):.2f}")
        layout = column(row(placement_figure(self.plan, self.variables, width=420),
                            transfer_matrix_figure(self.step, width=340)),
                        partition_figure(self.step, width=760), timeline_figure(self.step, width=760))
        self.views.children = [BokehModel(layout)]

    def _on_select(self, name: str):
        def changed(change):
            if not self._syncing:
                self.plan.assign(name, change["new"])
        return changed

    def _sync_from_plan(self) -> None:
        self._syncing = True
        try:
            for name, selector in self.selectors.items():
                selector.value = self.plan.device_for(name)
        finally:
            self._syncing = False

    def _ipython_display_(self):
        from IPython.display import display

        from dtflab.viz.output import load_bokehjs

        # The embedded BokehModel renders with the page's BokehJS. %load_ext dtflab loads it
        # in an earlier cell; loading it here, in the same output, can lose the race.
        load_bokehjs()

        display(self.widget)
