"""Bokeh views: partitioned graph, per-device timeline, transfer matrix."""
