"""Widgets and HTML views of dtflab objects."""
