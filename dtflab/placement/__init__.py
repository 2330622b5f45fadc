"""Placement plans: which device holds each variable; strategies; the placement map."""

from dtflab.placement.plan import PlacementPlan, VariableInfo, variable_info

__all__ = ["PlacementPlan", "VariableInfo", "variable_info"]
