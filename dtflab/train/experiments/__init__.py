"""Experiments that run strategies several times and fit what they show: speedup against
workers (strong and weak scaling), the scaling model's measured parts."""
