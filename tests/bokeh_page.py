"""JavaScript for browser tests: find a Bokeh plot on the page by a renderer's name, read its
data, and turn data coordinates into page coordinates (to click a glyph with the mouse)."""

#: ``(renderer_name) => plot index`` helpers are inlined in each snippet: Bokeh's views live in
#: ``Bokeh.index`` (one entry per embedded root), each plot view maps its renderers to views.
_PLOTS = """
const plots = [];
const seen = new Set();
const visit = (view) => {
  if (!view || seen.has(view)) return; seen.add(view);
  if (view.frame && view.renderer_views) plots.push(view);
  for (const child of (view.child_views || [])) visit(child);
};
for (const Bokeh of [window.Bokeh].filter(Boolean)) {
  const index = Bokeh.index;  // its roots: enumerating the index itself fails when one model
  // has two root views (a widget shown twice: "ownKeys ... duplicate entries")
  (index.roots ?? (typeof index.values === "function" ? [...index.values()] : Object.values(index))).forEach(visit);
}
const withRenderer = (name) => {  // the last one on the page (earlier views may be detached)
  const shown = plots.filter((p) => p.el.isConnected && p.el.getBoundingClientRect().width > 0);
  for (const plot of shown.reverse()) {
    for (const [model, view] of plot.renderer_views) if (model.name === name) return [plot, model, view];
  }
  return null;
};
"""

#: ``name`` -> the renderer's data source columns (or null when no plot has it), with its plot's
#: title (``_title``), every title line above the plot (``_titles``: the title and subtitles) and
#: the y range the page draws (``_y``: its start and end, in data units).
DATA = "(name) => {" + _PLOTS + """
  const found = withRenderer(name);
  if (!found) return null;
  const plot = found[0].model;
  const titles = [plot.title, ...plot.above].filter((t) => t && typeof t.text === "string");
  return {...found[1].data_source.data, _title: plot.title.text, _titles: titles.map((t) => t.text),
          _y: [found[0].frame.y_range.start, found[0].frame.y_range.end]};
}"""

#: ``[name, column, value]`` -> page coordinates {x, y} of the first glyph whose column equals
#: value (or null), after scrolling its plot to the middle of the window.
WHERE = "([name, column, value]) => {" + _PLOTS + """
  const found = withRenderer(name);
  if (!found) return null;
  const [plot, model] = found;
  const data = model.data_source.data;
  const i = Array.from(data[column]).indexOf(value);
  if (i < 0) return null;
  plot.el.scrollIntoView({block: "center"});  // not under the notebook's toolbar
  const box = plot.el.getBoundingClientRect();
  const sx = plot.frame.x_scale.compute(data.x[i]);
  const sy = plot.frame.y_scale.compute(data.y[i]);
  return {x: box.left + sx, y: box.top + sy};
}"""

#: ``name`` -> for each bar of that quad renderer (data columns ``left``, ``right``) that its
#: LabelSet labels: ``[label, the bar's width on screen, the label's width in its font]``, in
#: pixels, measured on the page (a canvas's ``measureText``, with the LabelSet's own font).
LABELS_FIT = "(name) => {" + _PLOTS + """
  const found = withRenderer(name);
  if (!found) return null;
  const [plot, model] = found;
  const data = model.data_source.data;
  const labels = [...plot.renderer_views.keys()].find((m) => m.type === "LabelSet"
      && m.source === model.data_source) || null;
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = labels ? `${labels.text_font_style.value ?? labels.text_font_style} ${labels.text_font_size.value ?? labels.text_font_size} ${labels.text_font.value ?? labels.text_font}` : "9px helvetica";
  const x = plot.frame.x_scale;
  const shown = data[labels ? labels.text.field : "label"];
  return Array.from(shown).map((label, i) => [label, x.compute(data.right[i]) - x.compute(data.left[i]),
      ctx.measureText(label).width]).filter(([label]) => label);
}"""

#: ``() =>`` for every plot on the page that is laid out: ``[title line, where it ends, the
#: canvas's width]`` in pixels, each title line measured in its own font from the frame's left.
TITLES_FIT = "() => {" + _PLOTS + """
  const ctx = document.createElement("canvas").getContext("2d");
  const found = [];
  for (const plot of plots.filter((p) => p.el.isConnected && p.el.getBoundingClientRect().width > 0)) {
    const model = plot.model;
    for (const title of [model.title, ...model.above].filter((t) => t && typeof t.text === "string" && t.text)) {
      const value = (v) => (v && v.value !== undefined ? v.value : v);
      ctx.font = `${value(title.text_font_style)} ${value(title.text_font_size)} ${value(title.text_font)}`;
      found.push([title.text, plot.frame.bbox.left + ctx.measureText(title.text).width,
                  plot.el.getBoundingClientRect().width]);
    }
  }
  return found;
}"""

#: ``name`` -> the renderer's plot ranged again by BokehJS, as a later change of its data or a
#: view rendered again ranges it (true, or null when no plot has it).
RANGE_AGAIN = "(name) => {" + _PLOTS + """
  const found = withRenderer(name);
  if (!found) return null;
  found[0].invalidate_dataranges = true;
  found[0].request_paint();
  return true;
}"""
