"""The fork server: a process that has imported TensorFlow and forks task processes.

``import tensorflow`` costs seconds and hundreds of MB per process. The fork server pays it
once (``python -m dtflab.processes.forkserver``), then forks a child per task: the child shares
TensorFlow's pages with it and starts listening in tens of milliseconds.

What it holds, and why forking it is safe: TensorFlow's Python modules and C++ library are
loaded and their lazy attributes that tasks use are resolved (``tf.distribute.Server``,
``tf.compat.v1``, ``MultiWorkerMirroredStrategy``), but it never creates an eager context, a
session, a server or a gRPC channel, and it runs one Python thread: before each fork it checks
both (``unsafe()``) and refuses to fork otherwise, and the owner then spawns instead. It lives
in the network namespace it was started in (the private network's, where that is on).

Both ends of its protocol are here. ``ForkServer`` is the owner's side: a SOCK_SEQPACKET
socket pair, one JSON message each, file descriptors with SCM_RIGHTS. Owner -> server:
``{"fork": {module, args, log, env, cwd}}`` with the task's stdin and ready pipe ends.
Server -> owner: ``{"ready": pid}`` once, ``{"forked": pid}`` or ``{"refused": why}`` per
request, ``{"exited": pid, "code": c}`` whenever a child ends (negative: killed by that signal).
The server ends when the owner's socket closes; its children end when their stdin (a pipe
from the owner) closes, so nothing outlives the owner, even after a SIGKILL.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from dtflab.processes import inside
from dtflab.processes.spawn import child_env

MESSAGE_BYTES = 1 << 20


# -- the owner's side -----------------------------------------------------------------------------

class ForkServer:
    """The owner's handle on one fork server process."""

    method = "fork"
    why_not_fork = ""

    def __init__(self, netns_pid: int | None, log_dir: str):
        self.netns_pid = netns_pid
        self.log_path = os.path.join(log_dir, f"forkserver-{netns_pid or 'host'}.log")
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.RLock()
        # Each running child's handle by pid. Linux reuses pids (32,768 of them by default,
        # shared with every thread on the machine): an exit is handed to the handle of the
        # child that had the pid then, never looked up by pid later (a long test run handed a
        # new task an older task's exit and read it as ended: '/proc/None/task').
        self._children: dict[int, ForkedProcess] = {}
        self._ready = False
        self.pid = None
        try:
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "dtflab.processes.forkserver",
                     "--control_fd", str(theirs.fileno())]
                    + (["--netns", str(netns_pid)] if netns_pid else []),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),), start_new_session=True, env=child_env())
        except BaseException:
            self._control.close()
            raise
        finally:
            theirs.close()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float) -> None:
        """Return once the server has imported TensorFlow; ``RuntimeError`` if it died or
        did not within ``timeout`` seconds."""
        with self._lock:
            deadline = time.monotonic() + timeout
            while not self._ready:
                message = self._receive(max(deadline - time.monotonic(), 0))
                if message is None:
                    self.close()
                    raise RuntimeError(self._why_dead() or f"not ready within {timeout:g} s")

    def launch(self, module, args, log_path, *, env=None, cwd=None):
        """Fork a task (see ``dtflab.processes.launch``); ``RuntimeError`` if the server refuses."""
        request = {"fork": {"module": module, "args": list(args), "log": str(log_path),
                            "env": child_env(extra=env), "cwd": cwd or os.getcwd()}}
        stdin_read, stdin_write = os.pipe()
        ready_read, ready_write = os.pipe()
        try:
            with self._lock:
                self.wait_ready(60.0)
                socket.send_fds(self._control, [json.dumps(request).encode()],
                                [stdin_read, ready_write])
                reply = self._receive(30.0, until=("forked", "refused"))
        except BaseException:
            for fd in (stdin_write, ready_read):
                os.close(fd)
            raise
        finally:
            os.close(stdin_read)
            os.close(ready_write)
        if reply is None or "forked" not in reply:
            os.close(stdin_write)
            os.close(ready_read)
            why = reply["refused"] if reply else (self._why_dead() or "no answer")
            raise RuntimeError(why)
        child = ForkedProcess(self, reply["forked"], os.fdopen(stdin_write, "wb"))
        with self._lock:  # no exit of this pid can have been read yet: it comes after "forked"
            self._children[child.pid] = child
        return child, ready_read

    def exit_code(self, child: "ForkedProcess") -> int | None:
        """The exit code of a child, or None while it runs (reads what the server reported)."""
        with self._lock:
            while child.code is None and self._receive(0) is not None:
                pass
            if child.code is None and not self.alive and not _running(child.pid):
                self._children.pop(child.pid, None)
                child.code = -signal.SIGKILL  # ended with its server: unknown code
            return child.code

    def wait_for_exit(self, child: "ForkedProcess", timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.exit_code(child)) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            with self._lock:
                if child.code is None:
                    self._receive(min(0.25, left) if left is not None else 0.25)
        return code

    def _receive(self, timeout: float, until=("ready",)) -> dict | None:
        """Read messages (recording exits) until one with a key in ``until``; None on timeout
        or when the server has gone."""
        deadline = time.monotonic() + timeout
        while True:
            with selectors.DefaultSelector() as readable:
                readable.register(self._control, selectors.EVENT_READ)
                if not readable.select(max(deadline - time.monotonic(), 0)):
                    return None
            try:
                data = self._control.recv(MESSAGE_BYTES)
            except OSError:
                return None
            if not data:
                return None
            message = json.loads(data)
            if "exited" in message and (child := self._children.pop(message["exited"], None)):
                child.code = message["code"]
            if "ready" in message:
                self._ready, self.pid = True, message["ready"]
            if any(key in message for key in until):
                return message

    def _why_dead(self) -> str:
        code = self.process.poll()
        if code is None:
            return ""
        try:
            with open(self.log_path, errors="replace") as file:
                log = file.read().strip().splitlines()
        except OSError:
            log = []
        return f"exited with code {code}" + (f": {log[-1][:300]}" if log else "")

    def close(self) -> None:
        """End the server (its children run on until their owner closes their stdin)."""
        with contextlib.suppress(OSError):
            self._control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedProcess:
    """A task forked by a fork server: the launcher handle (see ``dtflab.processes.launch``)."""

    def __init__(self, server: ForkServer, pid: int, stdin):
        self.server, self.pid, self.stdin = server, pid, stdin
        self.code: int | None = None  # set once the server reports this child's exit

    def poll(self):
        return self.server.exit_code(self)

    def wait(self, timeout=None):
        code = self.server.wait_for_exit(self, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return code

    def kill(self) -> None:
        if self.poll() is not None:  # its pid may be another process's by now
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stdin.close()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


# -- the server process --------------------------------------------------------------------------

def unsafe() -> str | None:
    """Why forking this process now would not be safe, or None."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads are running"
    from dtflab.tf_private import eager_context_created

    if eager_context_created():
        return "TensorFlow's eager context was created"
    return None


def warm() -> None:
    """Import TensorFlow and resolve the lazy attributes tasks use, creating nothing."""
    from dtflab._quiet import import_tf

    tf = import_tf()
    for name in ("distribute.Server", "distribute.MultiWorkerMirroredStrategy",
                 "distribute.experimental.ParameterServerStrategy", "train.ClusterSpec",
                 "compat.v1.Session", "compat.v1.train.MonitoredTrainingSession",
                 "profiler.experimental.server.start"):
        target = tf
        for part in name.split("."):
            target = getattr(target, part)
    import dtflab.processes.script  # noqa: F401
    import dtflab.processes.server  # noqa: F401


def serve(control: socket.socket) -> int:
    """Fork on request until the owner's end of ``control`` closes."""
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select below
    children: set[int] = set()
    # Everything imported so far goes to the GC's permanent generation: a child's collections
    # then never write to those objects' headers, so their pages stay shared (measured: four
    # all-reduce workers 778 -> 547 MB of private memory).
    gc.collect()
    gc.freeze()
    control.send(json.dumps({"ready": os.getpid()}).encode())
    with selectors.DefaultSelector() as events:
        events.register(control, selectors.EVENT_READ, "control")
        events.register(wake_read, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in events.select(timeout=1.0):
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        wake_read.recv(4096)
                    continue
                message, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES, 2)
                if not message:
                    return 0  # the owner has gone; the children see their stdin close
                request = json.loads(message)["fork"]
                why_not = unsafe()
                if why_not is None:
                    server_pid = os.getpid()
                    pid = os.fork()
                    if pid == 0:
                        _end_with(server_pid)
                        _child(request, fds, (control, wake_read, wake_write))
                    children.add(pid)
                    reply = {"forked": pid}
                else:
                    reply = {"refused": f"forking is not safe: {why_not}"}
                for fd in fds:
                    os.close(fd)
                control.send(json.dumps(reply).encode())
            _report_exits(control, children)


def _report_exits(control: socket.socket, children: set[int]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            control.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())


class ChildExit(BaseException):
    """Raised in a forked child once its task has run, to unwind out of the server loop and
    end with a normal interpreter exit (atexit, TensorFlow's shutdown), as ``python SCRIPT``
    would."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _end_with(server_pid: int) -> None:
    """In a forked child: SIGKILL from the kernel when the fork server ends (it ends with its
    owner). The child's own watch on its standard input needs the GIL, which a thread stuck in
    TensorFlow's C++ may hold for ever (a MultiWorkerMirroredStrategy worker waiting in its
    start-up for a peer that died); this needs nothing from the child."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != server_pid:  # the server ended before the prctl
        os._exit(1)


def _child(request: dict, fds: list[int], server_fds) -> None:
    """In the forked child: become the task, run its module's ``main``; raises ``ChildExit``."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sock in server_fds:
            sock.close()
        os.setsid()
        stdin_fd, ready_fd = fds
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(stdin_fd, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(stdin_fd)
        os.close(log)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # read TMPDIR again: this server may have read its own
        os.chdir(request["cwd"])
        inside.forked = True  # its parent is this server, not the owner
        module = importlib.import_module(request["module"])
        code = module.main(request["args"] + ["--ready_fd", str(ready_fd)]) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    raise ChildExit(code)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtflab.processes.forkserver")
    parser.add_argument("--control_fd", type=int, required=True)
    parser.add_argument("--netns", type=int, default=None)
    args = parser.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    if args.netns is not None:  # first: joining a user namespace needs a single thread
        from dtflab.network.netns import join

        join(args.netns)
    warm()
    why_not = unsafe()
    if why_not is not None:
        print(f"dtflab fork server: not safe to fork after warming up: {why_not}", flush=True)
        return 1
    try:
        code = serve(control)
    except ChildExit as child:  # a forked task, done: a normal exit, as `python SCRIPT` would
        return child.code
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
