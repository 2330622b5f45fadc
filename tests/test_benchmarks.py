"""Every script under ``benchmarks/`` runs here in its smoke mode (``--smoke``: a few steps of
each figure, on the same code as a full run) and prints one JSON line with the keys its full run
prints: a benchmark that breaks fails the suite, not the next person who runs it. The figures
themselves are the benchmarks' to judge, never a test's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import not_here

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

#: Each script's top-level JSON keys, as its full run prints them.
KEYS = {
    "async_soak.py": {"busy_loops", "complete_runs", "failure_lines", "hung", "max_run_s",
                      "median_run_s", "runs", "runs_with_a_stall", "runs_with_failures",
                      "stall_lines", "stalls", "steps_per_worker", "tf2_before"},
    "cluster_start.py": {"benchmark", "cpus", "inprocess_3_tasks_kernel_pss_mb", "inprocess_s",
                         "kernel_pss_mb", "local_3_tasks_plus_kernel_mb", "local_over_raw",
                         "local_s", "local_s_all", "pss_mb", "raw_floor_s", "raw_s_all",
                         "restart_s", "runs", "tensorflow", "warm_local_s", "warm_local_s_all",
                         "warm_over_raw"},
    "collective.py": {"benchmark", "cores", "repeat", "sizes_mb", "workers"},
    "dask_start.py": {"benchmark", "cpus", "dask_existing_cluster_s", "dask_existing_over_local",
                      "dask_new_local_cluster_s", "dask_new_over_local", "local_s", "runs"},
    "data_service.py": {"cpus", "data_workers", "input_wait_share", "input_wait_share_rounds",
                        "scaling_max_abs_error", "scaling_medians", "scaling_rounds", "seconds",
                        "visits", "work_ms"},
    "private_network.py": {"benchmark", "median", "private_over_host", "rounds"},
    "trace.py": {"benchmark", "cpus", "generated_graph", "tensorflow",
                 "three_layer_model_parallel"},
    "scaling.py": {"allreduce_over_sync_ps_2_workers", "allreduce_speedup_2_workers", "batch",
                   "benchmark", "cores", "examples_per_s", "figure", "pipeline_problem",
                   "pipeline_speedup_2_workers", "ps_model", "ps_model_16_cores_max_rel_error",
                   "ps_model_16_cores_steps_per_s", "ps_model_batch", "ps_model_limit",
                   "ps_model_max_rel_error", "ps_model_measured_steps_per_s",
                   "ps_model_steps_per_s", "rounds", "runs_steps_per_s", "steps_per_s"},
    "plan.py": {"calibration_s", "calibrations", "plan_memory_max_rel_error",
                "plan_memory_mean_rel_error", "plan_memory_routed_experts_max_rel_error",
                "plan_published_max_rel_error", "plan_published_mean_rel_error",
                "plan_step_time_calibration_spread", "plan_step_time_max_rel_error",
                "plan_step_time_mean_rel_error", "plan_step_time_noise", "runs"},
    "run_logs.py": {"loops", "rounds", "steps"},
    "notebook_memory.py": {"benchmark", "largest_peak_pss_mb", "notebooks"},
}
#: Scripts another test module runs (with smaller counts) and reads the figures of.
RUN_ELSEWHERE = {"start_stop_cycles.py": "test_load.py"}
#: Scripts without a smoke mode yet: each one here is a benchmark that can rot unseen.
NO_SMOKE_YET = {"experts_and_schedules.py", "long_sequences_and_3d.py", "memory.py",
                "model_parallel.py", "todays_blocks.py", "training.py"}
#: Scripts that build network namespaces: root only.
NEEDS_ROOT = {"private_network.py"}


def test_every_benchmark_is_run_by_the_suite():
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    assert scripts == set(KEYS) | set(RUN_ELSEWHERE) | NO_SMOKE_YET, (
        f"a script under benchmarks/ with no smoke run here: {sorted(scripts - set(KEYS) - set(RUN_ELSEWHERE) - NO_SMOKE_YET)}; "
        f"give it --smoke and add its keys to KEYS")
    for script, module in RUN_ELSEWHERE.items():
        assert script in (ROOT / "tests" / module).read_text()


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(KEYS))
def test_a_benchmark_runs_in_its_smoke_mode_and_prints_its_figures(script):
    if script in NEEDS_ROOT and os.geteuid() != 0:
        not_here(f"{script.upper()} NOT RUN: it builds network namespaces, which needs root")
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"{script} --smoke printed nothing:\n{done.stderr[-3000:]}"
    figures = json.loads(lines[-1])
    assert KEYS[script] <= set(figures), f"{script} --smoke lacks {sorted(KEYS[script] - set(figures))}"
