"""dtflab's temporary files: held while the process that made them lives, removed by the next
one that makes a folder once it has ended, even by SIGKILL (``dtflab.scratch``)."""

import os
import tempfile

from dtflab import scratch

from conftest import owner_of

MAKER = ("import json, os, time\n"
         "from dtflab import scratch\n"
         "exit_log = os.path.join(os.environ['TMPDIR'], f'dtflab-exit-{os.getpid()}.log')\n"
         "scratch.hold(os.open(exit_log, os.O_WRONLY | os.O_CREAT, 0o644))\n"
         "print(json.dumps([scratch.folder('logs'), exit_log]), flush=True)\n"
         "time.sleep(600)\n")


def test_a_killed_makers_folder_and_exit_log_go_at_the_next_sweep_a_live_ones_stay(
        tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    theirs = tmp_path / "dtflab-not-ours"  # the prefix, but not marked by dtflab: never touched
    theirs.mkdir()
    made_in = {"TMPDIR": str(tmp_path)}
    with owner_of(MAKER, made_in) as (kept, _):
        with owner_of(MAKER, made_in) as (gone, _):
            (tmp_path / gone[0] / "worker-0.log").write_text("a task's log")
        # its maker is killed
        assert scratch.sweep(settle_s=3600) == []  # too young: its maker may not hold it yet
        assert sorted(scratch.sweep(settle_s=0)) == sorted(gone)
        assert all(os.path.exists(path) for path in kept) and theirs.exists()
        assert not any(os.path.exists(path) for path in gone)
    assert sorted(scratch.sweep(settle_s=0)) == sorted(kept)
    assert [p.name for p in tmp_path.iterdir()] == ["dtflab-not-ours"]


def test_a_folder_this_process_holds_stays_until_it_is_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = scratch.folder("cell")
    assert path.startswith(str(tmp_path / "dtflab-cell-"))
    assert scratch.sweep(settle_s=0) == [] and os.path.isdir(path)
    scratch.remove(path)
    assert not os.path.exists(path) and path not in scratch._held
