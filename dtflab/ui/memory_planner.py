"""The memory planner: fields and sliders for a transformer and how it is trained and split,
each device's predicted bytes drawn as stacked bars by kind against a budget, redrawn as a
field changes; **Measure** runs the plan's step here when one device is one replica small
enough to run, and draws the measured bars beside the predicted ones.

In [1]: planner = dtflab.memory_planner("GPT-2 small (124 M)", budget_gb=80)
In [2]: planner                       # the widget
In [3]: planner.set(tensor=4, pipeline=2, precision="bfloat16")
In [4]: planner.measure()             # or the button; planner.measured, planner.errors

The arithmetic is ``dtflab.train.planner.device_memory``'s (its docstring says which terms
dtflab has measured and which are the references' and not yet measured here). Measure cannot
run a plan split by tensor, pipeline or ZeRO: ``train.memory`` measures one replica's traced
step, and the loops that split a transformer (``train.pipeline``, ``train.tensor_parallel``,
``train.zero``) report losses and bytes on the wire, not bytes per device by kind; it says so
instead of drawing.
"""

from __future__ import annotations

import dataclasses

from dtflab.train.layouts.layout import PRECISIONS, RECOMPUTE, ZERO_STAGES
from dtflab.train.planner import device_memory

#: The colours of the kinds, bottom to top.
COLOURS = {"parameters": "#4c72b0", "weight_copies": "#8172b3", "gradients": "#dd8452",
           "optimizer": "#55a868", "activations": "#c44e52"}
#: The largest plan Measure runs here, in predicted bytes on its device.
MEASURABLE_BYTES = 1 << 30
WAYS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


#: The preset menu's entry for a shape that is none of the presets.
YOUR_OWN = "(your own)"


def _unit(largest: float) -> tuple[str, float]:
    for name, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if largest >= size:
            return name, size
    return "bytes", 1.0


def amount(n: float) -> str:
    """``n`` bytes in the unit that suits it, three figures: "606 MB", "79.4 GB"."""
    unit, size = _unit(abs(n))
    return f"{n / size:.3g} {unit}"


def percent(share: float) -> str:
    """``share`` as a signed percentage, two decimals; "0.00%" where it rounds to nothing
    (never "-0.00%")."""
    text = f"{share:+.2%}"
    return "0.00%" if text in ("+0.00%", "-0.00%") else text


#: What the preset menu sets besides a preset's own fields: GPT-2's block (0 key/value heads:
#: one per query head; a hidden width of 0: 4 d_model), tied, no experts.
BLOCK_DEFAULTS = dict(tied=True, kv_heads=0, hidden=0, activation="gelu", norm="layer",
                      positions="learned", experts=0, top_k=1, shared_experts=0)
#: What a 0 in a count field means, said under those fields.
DEFAULTS_SAID = ("0 means the model's default: <b>kv_heads</b> 0, one key/value head per query "
                 "head; <b>hidden</b> 0, 4 x d_model; <b>experts</b> 0, a dense block "
                 "(no experts)")
#: The fields that make a model's shape (what a preset sets).
SHAPE = ("blocks", "d_model", "heads", "sequence", "vocabulary", "batch", *BLOCK_DEFAULTS)


def _shown(plan: device_memory.Plan, name: str) -> int:
    """A count field's value as its control shows it: 0 where it is the default (key/value
    heads as many as the query heads, a hidden width of 4 d_model), so it follows them."""
    default = {"kv_heads": plan.heads, "hidden": 4 * plan.d_model}.get(name)
    value = getattr(plan, name)
    return 0 if value == default else value


def preset_of(plan: device_memory.Plan) -> str:
    """The preset whose shape ``plan`` has (as the menu sets it: :data:`BLOCK_DEFAULTS` unless
    it says), or ``YOUR_OWN``."""
    for name, shape in device_memory.PRESETS.items():
        preset = device_memory.Plan(**{**BLOCK_DEFAULTS, **shape})
        if all(getattr(plan, field) == getattr(preset, field) for field in SHAPE):
            return name
    return YOUR_OWN


class MemoryPlanner:
    """See the module's docstring. ``plan`` holds the current
    :class:`~dtflab.train.planner.device_memory.Plan`; ``predicted`` and ``measured`` the bytes
    by kind (``measured`` empty until Measure); ``status`` the line under the bars."""

    def __init__(self, plan: device_memory.Plan | None = None, *, budget_gb: float = 80.0):
        import ipywidgets as w

        self.plan = plan or device_memory.Plan()
        self.budget_gb = float(budget_gb)
        self.measured: dict = {}
        self.errors: dict = {}
        self.status = ""
        self._updating = False
        fields = {}
        for name in ("blocks", "d_model", "heads", "sequence", "vocabulary", "batch"):
            fields[name] = w.BoundedIntText(value=getattr(self.plan, name), min=1, max=10**7,
                                            description=name, layout=w.Layout(width="190px"))
        fields["micro_batches"] = w.IntSlider(value=self.plan.micro_batches, min=1, max=64,
                                              description="micro_batches")
        for name in ("data", "tensor", "pipeline"):
            fields[name] = w.Dropdown(options=WAYS, value=getattr(self.plan, name),
                                      description=f"{name} ways", layout=w.Layout(width="190px"))
        fields["precision"] = w.ToggleButtons(options=list(PRECISIONS),
                                              value=self.plan.precision, description="precision")
        fields["recompute"] = w.ToggleButtons(options=list(RECOMPUTE),
                                              value=self.plan.recompute, description="recompute")
        fields["zero"] = w.ToggleButtons(options=list(ZERO_STAGES), value=self.plan.zero,
                                         description="ZeRO stage")
        fields["tied"] = w.Checkbox(value=self.plan.tied, description="tied output layer")
        # the block's choices, 0 meaning the model's default (DEFAULTS_SAID says which)
        for name, low in (("kv_heads", 0), ("hidden", 0), ("experts", 0), ("top_k", 1),
                          ("shared_experts", 0)):
            fields[name] = w.BoundedIntText(value=_shown(self.plan, name), min=low, max=10**7,
                                            description=name, layout=w.Layout(width="190px"))
        for name, options in (("activation", ("gelu", "swiglu")), ("norm", ("layer", "rms")),
                              ("positions", ("learned", "rotary"))):
            fields[name] = w.ToggleButtons(options=list(options), value=getattr(self.plan, name),
                                           description=name)
        for control in fields.values():
            control.style.description_width = "initial"
        self.fields = fields
        self.preset = w.Dropdown(options=[YOUR_OWN, *device_memory.PRESETS],
                                 value=preset_of(self.plan), description="preset")
        self.budget = w.BoundedFloatText(value=self.budget_gb, min=0.001, max=1e6, step=1,
                                         description="budget GB", layout=w.Layout(width="190px"))
        self.measure_button = w.Button(description="Measure", icon="play",
                                       tooltip="run this plan's step here and draw what it held")
        self.line = w.HTML()
        for control in (*fields.values(), self.budget):
            control.observe(self._changed, names="value")
        self.preset.observe(self._preset, names="value")
        self.measure_button.on_click(lambda _: self.measure())
        self.source, self.figure = self._figure()
        self.widget = None
        self._draw()

    # -- what a learner calls ------------------------------------------------------------------

    @property
    def predicted(self) -> dict[str, int]:
        return device_memory.per_device(self.plan)

    def set(self, **changes) -> MemoryPlanner:
        """Change the plan's fields (``tensor=4``, ``precision="bfloat16"``...) as the controls
        would; a bad value raises its one-line error and changes nothing."""
        # a default width or key/value heads follows d_model and heads, as its control does
        following = {name: _shown(self.plan, name) for name in ("kv_heads", "hidden")}
        plan = dataclasses.replace(self.plan, **{**following, **changes})
        self._updating = True
        try:
            for name, value in changes.items():
                self.fields[name].value = value
        finally:
            self._updating = False
        self._apply(plan)
        return self

    def measure(self) -> dict:
        """Run one traced step of the plan here (``train.memory``) and draw it beside the
        prediction; returns the measured bytes by kind ({} with the reason in ``status`` when
        the plan cannot run here)."""
        plan = self.plan
        if not plan.measurable:
            self.status = ("Measure runs one replica: set tensor and pipeline ways to 1 and ZeRO "
                           "stage to 0 (bytes per device by kind are measured on one replica "
                           "only)")
        elif self.predicted["total"] > MEASURABLE_BYTES:
            self.status = (f"Measure runs here only plans under {MEASURABLE_BYTES >> 20} MB per "
                           f"device; this one is predicted at {self.predicted['total'] / 1e9:.1f}"
                           f" GB: make it smaller to measure its shape")
        else:
            from dtflab import train

            self.status = "measuring one step…"
            self._draw()
            try:
                problem = train.transformer(plan.blocks, plan.d_model, plan.heads,
                                            plan.sequence, plan.vocabulary,
                                            plan.batch // plan.data, tied=plan.tied,
                                            recompute=plan.recompute, precision=plan.precision,
                                            **plan.choices())
            except ValueError as error:  # a vocabulary under the text's, a sequence too long
                self.status = f"cannot measure this shape here: {error}"
                self._draw()
                return {}
            report = train.memory(problem, micro_batches=plan.micro_batches)
            self.measured = {kind: report.measured[kind] for kind in device_memory.KINDS}
            self.measured["total"] = sum(self.measured.values())
            self.errors = {kind: (self.predicted[kind] - value) / value
                           for kind, value in self.measured.items() if value}
            worst = max(self.errors.items(), key=lambda item: abs(item[1]))
            self.status = (f"measured one step here: worst error {percent(worst[1])} "
                           f"({worst[0]}); peak {report.measured['peak'] / 1e6:.2f} MB")
        self._draw()
        return dict(self.measured)

    # -- the widget ----------------------------------------------------------------------------

    def _ipython_display_(self):
        from dtflab.viz.output import display_with_a_still

        display_with_a_still(self.view(), [self.figure], self.line.value)

    def view(self):
        """The widget: controls, the bars, the status line."""
        if self.widget is None:
            import ipywidgets as w
            from jupyter_bokeh import BokehModel

            from dtflab.viz.output import load_bokehjs

            load_bokehjs()
            f = self.fields
            self.widget = w.VBox([
                w.HBox([self.preset, self.budget, self.measure_button]),
                w.HBox([f["blocks"], f["d_model"], f["heads"]]),
                w.HBox([f["sequence"], f["vocabulary"], f["batch"]]),
                w.HBox([f["kv_heads"], f["hidden"], f["experts"]]),
                w.HTML(f"<small>{DEFAULTS_SAID}</small>"),
                w.HBox([f["top_k"], f["shared_experts"]]),
                f["activation"], f["norm"], f["positions"],
                w.HBox([f["data"], f["tensor"], f["pipeline"]]),
                f["micro_batches"], f["precision"], f["recompute"], f["zero"], f["tied"],
                BokehModel(self.figure), self.line], layout=w.Layout(width="760px"))
            self.widget.add_class("dtflab-memory-planner")
        return self.widget

    def _figure(self):
        from bokeh.models import ColumnDataSource, HoverTool, Range1d, Span
        from bokeh.plotting import figure

        source = ColumnDataSource({"bar": [], **{kind: [] for kind in COLOURS}})
        # a range of its own, set by _draw: BokehJS's automatic range keeps the end it first
        # had in the page, which would cut a taller plan's bars at the first plan's height
        fig = figure(x_range=["predicted", "measured"], y_range=Range1d(0, 1), height=320, width=720,
                     title="bytes on the fullest device (dashed: the budget)", toolbar_location=None, name="memory_planner")
        bars = fig.vbar_stack(list(COLOURS), x="bar", width=0.6, source=source,
                              color=list(COLOURS.values()),
                              legend_label=[kind.replace("_", " ") for kind in COLOURS])
        for renderer, kind in zip(bars, COLOURS):
            renderer.name = f"planner_{kind}"
        self.budget_line = Span(location=0, dimension="width", line_color="black",
                                line_dash="dashed", line_width=2)
        fig.add_layout(self.budget_line)
        fig.add_tools(HoverTool(tooltips=[(kind.replace("_", " "), f"@{kind}{{0.000}}")
                                          for kind in COLOURS]))
        fig.add_layout(fig.legend[0], "right")
        return source, fig

    def _changed(self, change):
        if self._updating:
            return
        values = {name: control.value for name, control in self.fields.items()}
        try:
            plan = dataclasses.replace(self.plan, **values)  # a field without a control stays
        except ValueError as error:
            self.status = str(error)
            self._draw()
            return
        self.budget_gb = float(self.budget.value)
        self._apply(plan)

    def _preset(self, change):
        if self._updating:  # the menu following the fields (_apply), not a learner's choice
            return
        if change["new"] in device_memory.PRESETS:
            shape = {**BLOCK_DEFAULTS, **device_memory.PRESETS[change["new"]]}
            try:
                self.set(**shape)
            except ValueError as error:  # the ways set do not split this shape
                self.status = str(error)
                self._draw()

    def _apply(self, plan: device_memory.Plan):
        if plan != self.plan:
            self.measured, self.errors = {}, {}
        self.plan = plan
        self.status = ""
        self._updating = True
        try:
            self.preset.value = preset_of(plan)
        finally:
            self._updating = False
        self._draw()

    def _draw(self):
        predicted = self.predicted
        budget = self.budget_gb * 1e9
        unit, size = _unit(max(predicted["total"], self.measured.get("total", 0)))
        bars = ["predicted"] + (["measured"] if self.measured else [])
        data = {"bar": bars}
        for kind in COLOURS:
            data[kind] = [predicted[kind] / size] + (
                [self.measured[kind] / size] if self.measured else [])
        self.source.data = data
        self.figure.yaxis.axis_label = unit
        shown = budget / size
        tallest = max(predicted["total"], self.measured.get("total", 0)) / size
        self.budget_line.location = shown
        self.budget_line.visible = shown <= 3 * tallest  # a far budget would flatten the bars
        self.figure.y_range.end = 1.08 * max(tallest, shown if self.budget_line.visible else 0)
        fits = predicted["total"] <= budget
        verdict = (f"fits in {amount(budget)} with {amount(budget - predicted['total'])} to spare"
                   if fits else f"does not fit in {amount(budget)}: {predicted['total'] / budget:.2f}x")
        kinds = ", ".join(f"{kind.replace('_', ' ')} {predicted[kind] / size:.4g}"
                          for kind in COLOURS)
        text = (f"<b>{self.plan.devices} device(s); the fullest holds "
                f"{predicted['total'] / size:.4g} {unit}</b>: {kinds} {unit}; {verdict}")
        if self.errors:
            text += "<br>measured vs predicted: " + ", ".join(
                f"{kind} {percent(error)}" for kind, error in self.errors.items())
        if not self.plan.measurable:
            text += ("<br><i>predicted only: the tensor and pipeline terms, and ZeRO's sharded "
                     "gradients and parameters on a transformer, are the references' arithmetic, "
                     "not yet measured by dtflab (ZeRO's sharded optimizer state is: "
                     "train.zero)</i>")
        copies = predicted["weight_copies"]
        if copies and self.plan.zero >= 3:
            text += (f"<br><i>in {self.plan.precision} with ZeRO 3, the weight copies are the "
                     f"16-bit copies of the units gathered at once ({amount(copies)}): each "
                     f"block's weights are gathered for its forward, freed, and gathered again "
                     f"for its backward</i>")
        elif copies:
            text += (f"<br><i>in {self.plan.precision}, the weight copies are the 16-bit copies "
                     f"of the weights the backward multiplies by ({amount(copies)}"
                     f"{', every block parameter with full recomputation' if self.plan.recompute == 'full' else ''}"
                     f"): TensorFlow keeps them from the forward, so 16 bits can hold more than "
                     f"float32 where they outweigh what halving the activations saves</i>")
        if self.status:
            text += f"<br>{self.status}"
        self.line.value = text


def memory_planner(preset: str | None = None, *, budget_gb: float = 80.0, **fields):
    """A :class:`MemoryPlanner` starting from ``preset`` (a name in
    ``planner.device_memory.PRESETS``) and/or ``fields`` of ``planner.device_memory.Plan``."""
    from dtflab import checks

    start = {}
    if preset is not None:
        checks.one_of(preset, "preset", tuple(device_memory.PRESETS))
        start.update({**BLOCK_DEFAULTS, **device_memory.PRESETS[preset]})
    start.update(fields)
    return MemoryPlanner(device_memory.Plan(**start), budget_gb=budget_gb)
