"""Published training runs the planner is checked against: Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models" (arXiv 2205.05198), Megatron-LM's GPT on
NVIDIA's Selene (DGX A100 80 GB nodes; 8 GPUs a node on NVLink, HDR InfiniBand between).

Their Table 3 gives each model's layout (tensor 8, pipeline 1 / 8 / 35 / 64, no data
parallelism; micro-batch 4 / 1 / 1 / 1; the interleaved schedule with 3 stages a worker for
175B and 530B; sequence 2,048, vocabulary 51,200, mixed precision), their Table 5 each one's
measured iteration time with full recomputation and with "present work" (selective
recomputation and sequence parallelism, the all-gathers done again in the backward, section
4.2.2), and section 6.3 one run with 8-way data parallelism. The Calculon simulator's
``llm-validation`` carries the same eight layouts and times (calculon-ai/calculon,
``calculon/llm/validation.py`` lines 287-304, ``validation/seqsel/tab5/``) and reproduces them
with 3.65% mean and 8.87% worst error; its predicted memory per GPU is given beside ours (the
paper measured none for these runs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtflab.train.planner import step_time
from dtflab.train.planner.hardware import a100_node
from dtflab.train.planner.device_memory import Plan, per_device

#: The four models (blocks, d_model, heads), Table 3.
MODELS = {"22B": (48, 6144, 64), "175B": (96, 12288, 96), "530B": (105, 20480, 128),
          "1T": (128, 25600, 160)}


@dataclass(frozen=True)
class Run:
    """One published run: its Plan, the measured iteration time (s), the paper's MFU, and
    Calculon's predicted time (s) and memory per GPU (GiB) where it has them."""

    name: str
    plan: Plan
    measured_s: float
    mfu: float | None = None
    calculon_s: float | None = None
    calculon_gib: float | None = None


def _plan(model: str, pipeline: int, batch: int, micro_batch: int, chunks: int, mode: str,
          data: int = 1) -> Plan:
    blocks, d, heads = MODELS[model]
    present = mode == "selective + sequence parallel"
    return Plan(blocks=blocks, d_model=d, heads=heads, sequence=2048, vocabulary=51200,
                batch=batch, micro_batches=batch // (data * micro_batch), precision="float16",
                recompute="selective" if present else "full", data=data, tensor=8,
                pipeline=pipeline, chunks=chunks, sequence_parallel=present, regather=present,
                dropout=True, tied=True, schedule="interleaved" if chunks > 1 else "1f1b")


FULL, PRESENT = "full recomputation", "selective + sequence parallel"

#: Table 5 (times, MFU of the present work), section 6.3 (the 2,240-GPU run), and Calculon's
#: predictions from its llm-validation run (calc_tab5_breakdown; time s, memory GiB).
RUNS = (
    Run("22B, " + FULL, _plan("22B", 1, 4, 4, 1, FULL), 1.42, None, 1.3956, 48.15),
    Run("22B, " + PRESENT, _plan("22B", 1, 4, 4, 1, PRESENT), 1.10, 0.415, 1.1367, 52.08),
    Run("175B, " + FULL, _plan("175B", 8, 64, 1, 3, FULL), 18.13, None, 18.0288, 48.10),
    Run("175B, " + PRESENT, _plan("175B", 8, 64, 1, 3, PRESENT), 13.75, 0.514, 13.6381, 54.07),
    Run("530B, " + FULL, _plan("530B", 35, 280, 1, 3, FULL), 49.05, None, 49.8926, 42.27),
    Run("530B, " + PRESENT, _plan("530B", 35, 280, 1, 3, PRESENT), 37.83, 0.560, 34.4728, 53.54),
    Run("1T, " + FULL, _plan("1T", 64, 512, 1, 1, FULL), 94.42, None, 90.0809, 46.27),
    Run("1T, " + PRESENT, _plan("1T", 64, 512, 1, 1, PRESENT), 71.49, 0.563, 66.0407, 59.15),
    Run("530B on 2,240 GPUs (8 data ways), " + PRESENT,
        _plan("530B", 35, 2240, 1, 3, PRESENT, data=8), 39.15, 0.542),
)


def check(hardware=None) -> list[dict]:
    """Each run predicted on ``hardware`` (the A100 preset): ``{"run", "gpus", "layout",
    "measured_s", "predicted_s", "error", "calculon_s", "calculon_error", "mfu",
    "predicted_mfu", "memory_gib", "calculon_gib", "parts"}``; an error is predicted over
    measured, less 1."""
    hardware = hardware or a100_node()
    rows = []
    for run in RUNS:
        parts = step_time.step_seconds(run.plan, hardware)
        seconds = parts["total"]
        rows.append({
            "run": run.name, "gpus": run.plan.devices,
            "layout": f"t{run.plan.tensor} p{run.plan.pipeline} d{run.plan.data}, "
                      f"micro-batch {run.plan.micro_batch}, v {run.plan.chunks}",
            "measured_s": run.measured_s, "predicted_s": seconds,
            "error": seconds / run.measured_s - 1,
            "calculon_s": run.calculon_s,
            "calculon_error": (None if run.calculon_s is None
                               else run.calculon_s / run.measured_s - 1),
            "mfu": run.mfu, "predicted_mfu": step_time.mfu(run.plan, hardware, seconds),
            "memory_gib": per_device(run.plan)["total"] / 2 ** 30,
            "calculon_gib": run.calculon_gib, "parts": parts})
    return rows


def with_levers(run: Run, **changes) -> Plan:
    """``run``'s Plan with other levers (a what-if on a published layout)."""
    return dataclasses.replace(run.plan, **changes)
