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
    "attention.py": {"attention_flops", "benchmark", "causal_skip_share", "kept_bytes",
                     "kept_formula_rel_error", "peak_bytes", "shape", "step_s", "steps",
                     "tiles_a_side"},
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
                "plan_step_time_mean_rel_error", "plan_step_time_noise", "runs",
                "plan_noise_expected_mean", "plan_noise_expected_max", "plan_rounds_flagged",
                "plan_queued_share_limit", "plan_replay_max_rel_error"},
    "run_logs.py": {"loops", "rounds", "steps"},
    "notebook_memory.py": {"benchmark", "largest_peak_pss_mb", "notebooks"},
    "experts_and_schedules.py": {"experts_all_to_all_bytes_over_formula",
                                 "experts_busy_max_over_mean",
                                 "experts_tokens_max_over_mean_by_step",
                                 "experts_vs_single_max_abs_loss_diff", "pipeline_bubble_formula",
                                 "pipeline_bubble_measured", "pipeline_idle_share_measured",
                                 "pipeline_setting", "pipeline_vs_single_max_abs_loss_diff",
                                 "shape"},
    "long_sequences_and_3d.py": {"combined_vs_single_max_abs_loss_diff",
                                 "context_parallel_activations_over_single",
                                 "context_parallel_busy_max_over_min",
                                 "context_parallel_bytes_over_formula",
                                 "long_sequences_vs_single_max_abs_loss_diff", "median_loss_diff",
                                 "sequence_parallel_activation_ratio",
                                 "sequence_parallel_bytes_over_formula",
                                 "sequence_parallel_bytes_over_tensor_parallel", "shapes",
                                 "three_d_bytes_over_formula", "three_d_bytes_per_step"},
    "memory.py": {"accumulation_vs_big_batch_max_abs_diff", "flops_matmul_over_6n",
                  "lever_step_time_over_none", "loss_first_last", "memory_model_max_rel_error",
                  "mixed_precision_activation_ratio", "peak_over_activations",
                  "recompute_activation_ratio", "seconds_per_step_single", "steps",
                  "transformer_vs_single_by_loop", "transformer_vs_single_max_abs_loss_diff",
                  "zero_state_bytes_over_formula", "zero_step_peak",
                  "zero_wire_bytes_over_formula"},
    "model_parallel.py": {"all_reduce_pss_bytes", "batch", "cores", "naive_best_speedup_over_m1",
                          "naive_step_ms", "pipeline_1f1b_over_gpipe_peak_activation_bytes",
                          "pipeline_best_m", "pipeline_best_over_naive_best_steps_per_s",
                          "pipeline_best_speedup_over_m1", "pipeline_equal_shares_best_m",
                          "pipeline_idle_share", "pipeline_idle_share_formula",
                          "pipeline_model_best_m", "pipeline_peak_activation_bytes",
                          "pipeline_stage_arithmetic_ms",
                          "pipeline_step_model_equal_shares_max_rel_error",
                          "pipeline_step_model_equal_shares_ms",
                          "pipeline_step_model_m4_traces_max_rel_error",
                          "pipeline_step_model_max_rel_error", "pipeline_step_model_ms",
                          "pipeline_step_model_no_overlap_max_rel_error",
                          "pipeline_step_model_one_trace_max_rel_error",
                          "pipeline_step_model_parts_ms", "pipeline_step_model_traced_steps",
                          "pipeline_step_ms", "pipeline_vs_single_max_abs_loss_diff", "rounds",
                          "sharded_bytes_over_formula", "sharded_bytes_per_step_over_all_reduce",
                          "sharded_pss_bytes", "sharded_state_bytes_formula_over_all_reduce",
                          "sharded_state_bytes_per_worker_over_all_reduce",
                          "sharded_vs_single_max_abs_loss_diff", "stages",
                          "tensor_parallel_bytes_over_formula",
                          "tensor_parallel_vs_single_max_abs_loss_diff", "width"},
    "waits_for_a_core.py": {"accounted_share", "benchmark", "cpus", "queued_share", "rounds",
                            "steps"},
    "todays_blocks.py": {"forms", "memory_max_rel_error", "tensor_parallel_activations_rel_error"},
    "training.py": {"allreduce_bytes_per_worker_step", "allreduce_heavy_steps_per_s_1_worker",
                    "allreduce_heavy_steps_per_s_2_workers", "allreduce_over_sync_ps",
                    "allreduce_speedup_2_workers", "allreduce_vs_single_max_abs_loss_diff",
                    "benchmark", "cpus", "dashboard_on_over_off", "dashboard_on_over_off_runs",
                    "dashboard_on_over_off_whole_run", "heavy_steps_per_s_1_worker",
                    "heavy_steps_per_s_2_workers", "loop_over_handwritten",
                    "loop_over_handwritten_runs", "model_bytes", "quick",
                    "single_vs_sync_max_abs_loss_diff", "sync_dp_speedup_2_workers",
                    "sync_ps_bytes_per_ps_step", "tensorflow", "toy_sync_over_single_time"},
}
#: Scripts another test module runs (with smaller counts) and reads the figures of.
RUN_ELSEWHERE = {"start_stop_cycles.py": "test_load.py"}
#: Scripts that build network namespaces: root only.
NEEDS_ROOT = {"private_network.py"}


def test_every_benchmark_is_run_by_the_suite():
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    covered = set(KEYS) | set(RUN_ELSEWHERE)
    assert scripts == covered, (f"a script under benchmarks/ with no smoke run here: "
                                f"{sorted(scripts - covered)}, or an entry with no script: "
                                f"{sorted(covered - scripts)}; give a script --smoke and its keys "
                                f"in KEYS")
    for script, module in RUN_ELSEWHERE.items():
        assert script in (ROOT / "tests" / module).read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)  # memory.py's smoke run starts about ten worker-program runs
@pytest.mark.parametrize("script", sorted(KEYS))
def test_a_benchmark_runs_in_its_smoke_mode_and_prints_its_figures(script):
    if script in NEEDS_ROOT and os.geteuid() != 0:
        not_here(f"{script.upper()} NOT RUN: it builds network namespaces, which needs root")
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"{script} --smoke printed nothing:\n{done.stderr[-3000:]}"
    figures = json.loads(lines[-1])
    missing = KEYS[script] - set(figures)
    assert not missing, f"{script} --smoke lacks {sorted(missing)}"


@pytest.mark.parametrize("arguments, said", [
    (["--rounds", "0"], r"^--rounds 0: a run needs at least one round; use --rounds 5"),
    (["--quick", "--forms", "ZeRO stage 4"], r"^--forms: 'ZeRO stage 4' is not a form this run "
                                              r"makes; choose from .*'ZeRO stage 3'"),
    (["--against", "EARLIER"], r"^--against: no run in common with this one"),
])
def test_the_plan_benchmark_refuses_bad_input_in_one_line_before_it_starts(arguments, said,
                                                                         tmp_path):
    import re

    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": [{"run": "a form no run makes, d_model 1"}]}))
    arguments = [str(earlier) if a == "EARLIER" else a for a in arguments]
    done = subprocess.run([sys.executable, str(BENCHMARKS / "plan.py"), *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and not done.stdout
    message = done.stderr.strip()
    assert len(message.splitlines()) == 1 and re.search(said, message), message
