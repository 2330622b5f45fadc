"""Measurements built on one traced step: the pipeline's bubble per stage, a stage's arithmetic
per micro-batch size, a task's CPU time per step."""
