"""RunHistory counts one way for every loop: one step per update, however many workers report
it; the per-worker records stay beside it."""

from dtflab.train.machinery.history import RunHistory, StepRecord


def record(step, worker, loss, examples=50, time_s=0.0):
    return StepRecord(step, worker, loss, time_s, examples)


def test_every_workers_report_of_a_step_counts_as_one_step():
    history = RunHistory("all-reduce (2 workers)", "all_reduce", workers=["worker:0", "worker:1"],
                         step_reports=2)
    for step in range(10):
        for worker in ("worker:1", "worker:0"):
            history.add(record(step, worker, 1.0 / (step + 1), time_s=step + (worker == "worker:0")))
    assert history.steps == len(history.losses) == 10
    assert history.steps_per_worker == {"worker:0": 10, "worker:1": 10}  # the detail stays
    assert history.examples == 10 * 100 and len(history.records) == 20
    first = history.step_records[0]
    assert (first.step, first.worker, first.loss, first.examples, first.time_s) == (0, "all", 1.0,
                                                                                    100, 1.0)
    assert history.summary().startswith("all-reduce (2 workers) (all_reduce): 10 steps")


def test_a_step_trained_again_after_a_restart_counts_once_as_its_last_run():
    history = RunHistory("run", "all_reduce", step_reports=2)
    for step in (0, 1, 2, 1, 2, 3):  # failed after step 2, resumed from the checkpoint at 1
        for worker in ("worker:0", "worker:1"):
            history.add(record(step, worker, float(step) + (0.5 if len(history.records) > 5 else 0)))
    assert [r.step for r in history.step_records] == [0, 1, 2, 3]
    assert history.losses == [0.0, 1.5, 2.5, 3.5]  # steps 1 and 2 as they ran the second time


def test_a_loop_whose_records_are_its_steps_is_unchanged():
    history = RunHistory("downpour", "async", workers=["worker:0", "worker:1"])
    for step in range(6):
        history.add(record(step, f"worker:{step % 2}", 1.0))
    assert history.steps == 6 and history.step_records == history.records
