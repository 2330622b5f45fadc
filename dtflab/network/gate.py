"""The gate of a private network: both ends of its protocol.

The gate is a small process (``python -m dtflab.network.gate``) that

1. moves itself into a new user and network namespace (``unshare``, no root needed) whose
   only interface is a loopback of its own: task servers and the fork server join it;
2. opens *doors* on request: ``127.0.0.1:<port>`` on this machine, bound by a helper it forked
   before moving (the helper stays on this machine's network and hands the listening socket
   over with SCM_RIGHTS); each connection at a door goes on to the same port on the private
   loopback;
3. for ports the owner opens on request (a TF2 client's or a chief's, which the tasks call
   back), the other way: it listens on the private loopback and asks the helper to connect
   to this machine's ``127.0.0.1:<port>``.

One gate serves every local cluster of the process that started it (``Gate`` is that
process's side) and ends with it, even on SIGKILL. Only IPv4 loopback is forwarded.

The protocol, one line each way: the owner writes commands on the gate's stdin, the gate
answers on a pipe. ``ready PID`` or ``unavailable WHY`` once at start; then
``open P1,P2`` -> ``ok`` | ``port-in-use P``; ``close P1,P2`` -> ``ok``;
``reverse P`` -> ``ok P`` | ``failed P WHY``; ``unreverse P`` -> ``ok P``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

BUFFER = 256 * 1024
STOP_GRACE_S = 2.0


# -- the owner's side -----------------------------------------------------------------------------

class GateRefused(Exception):
    """The OS refused a private namespace here (it will refuse again)."""


class Gate:
    """The owner's handle on a running gate process."""

    def __init__(self, log_path: str, timeout: float):
        self.log_path = log_path
        self._lock = threading.Lock()
        self.process, ready_fd = _start(log_path)
        self._answers = os.fdopen(ready_fd, "rb", buffering=0)
        line = self._answer(timeout)
        word, _, rest = (line or "").partition(" ")
        if word == "ready":
            self.pid = int(rest)
            return
        self.close()
        if line is None:
            raise TimeoutError(f"the gate of the private network did not answer within {timeout:g} s")
        if word == "unavailable":
            raise GateRefused(rest)
        log = Path(log_path).read_text(errors="replace").strip()
        raise RuntimeError(f"the gate of the private network failed (exit code "
                           f"{self.process.returncode}): {log[-300:] or 'no answer'}")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def open(self, ports) -> int | None:
        """Open a door for each port; None, or the first port something else holds (then
        none of them is open)."""
        answer = self._ask(f"open {','.join(map(str, ports))}")
        if answer == "ok":
            return None
        if answer and answer.startswith("port-in-use "):
            return int(answer.split()[1])
        raise RuntimeError(f"the gate of the private network did not open ports {list(ports)}: "
                           f"{answer or 'no answer'}")

    def close_doors(self, ports) -> None:
        if ports and self.alive:
            self._ask(f"close {','.join(map(str, ports))}")

    def reverse(self, port: int) -> str | None:
        """Let the tasks reach ``127.0.0.1:port`` of this machine; None, or why not."""
        answer = self._ask(f"reverse {port}")
        return None if answer == f"ok {port}" else (answer or "the gate did not answer")

    def unreverse(self, port: int) -> None:
        """Close what ``reverse(port)`` opened (the tasks may bind that number again)."""
        self._ask(f"unreverse {port}")

    def _ask(self, command: str, timeout: float = 10.0) -> str | None:
        with self._lock:
            try:
                self.process.stdin.write(f"{command}\n".encode())
                self.process.stdin.flush()
            except (OSError, ValueError):
                return None
            return self._answer(timeout)

    def _answer(self, timeout: float) -> str | None:
        with selectors.DefaultSelector() as answered:
            answered.register(self._answers, selectors.EVENT_READ)
            if not answered.select(timeout=timeout):
                return None
        return self._answers.readline().decode(errors="replace").strip() or None

    def close(self) -> None:
        """End the gate (EOF on its stdin; SIGKILL after a grace)."""
        with contextlib.suppress(OSError, ValueError):
            self._answers.close()
        with contextlib.suppress(OSError, ValueError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()




def _start(log_path: str) -> tuple[subprocess.Popen, int]:
    """Start ``python -m dtflab.network.gate --ready_fd N`` in a session of its own, commands
    on its stdin, output appended to ``log_path``; returns the process and the read end of its
    answers. The network starts its own gate: it sits below ``dtflab.processes``."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    package_root = str(Path(__file__).resolve().parents[2])  # dtflab importable, as for tasks
    if package_root not in env.get("PYTHONPATH", "").split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    answers, theirs = os.pipe()
    try:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "dtflab.network.gate", "--ready_fd", str(theirs)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, pass_fds=(theirs,),
                start_new_session=True, env=env)
    except BaseException:
        os.close(answers)
        raise
    finally:
        os.close(theirs)
    return process, answers


# -- the gate process ----------------------------------------------------------------------------

def _pump(source: socket.socket, sink: socket.socket) -> None:
    buffer = bytearray(BUFFER)
    view = memoryview(buffer)
    try:
        while n := source.recv_into(buffer):
            sink.sendall(view[:n])
    except OSError:
        pass
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides are done, then close both."""
    for sock in (a, b):
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()
    a.close()
    b.close()


def _accept_until_closed(listener: socket.socket, handle, port: int) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # the door was closed
            return
        threading.Thread(target=handle, args=(conn, port), daemon=True,
                         name=f"dtflab-gate-{port}").start()


def _into_namespace(client: socket.socket, port: int) -> None:
    """A connection at a door on this machine: on to the task inside the namespace."""
    try:  # created after unshare, so this socket lives in the private namespace
        inside = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        client.close()  # the task is not listening (yet, or any more): the client retries
        return
    _splice(client, inside)


class _Outside:
    """A helper process left on this machine's network. It binds doors (``l``) and connects
    (``c``) to ``127.0.0.1:<port>`` here, and hands each socket over (SCM_RIGHTS)."""

    def __init__(self):
        self.channel, theirs = socket.socketpair()
        self.pid = os.fork()  # before unshare and before any thread
        if self.pid == 0:
            keep = theirs.fileno()
            os.closerange(3, keep)  # nothing of the gate's: its pipes must close with it
            os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
            self._serve(theirs)
        theirs.close()
        self._lock = threading.Lock()

    @staticmethod
    def _serve(channel: socket.socket) -> None:
        while len(request := channel.recv(3)) == 3:
            op, port = request[:1], struct.unpack("!H", request[1:])[0]
            try:
                if op == b"l":
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("127.0.0.1", port))
                    sock.listen(64)
                else:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                with sock:
                    socket.send_fds(channel, [b"1"], [sock.fileno()])
            except OSError as exc:
                channel.sendall(b"u" if exc.errno == errno.EADDRINUSE else b"0")
        os._exit(0)

    def socket_for(self, op: bytes, port: int) -> socket.socket | str:
        """A socket made on this machine's network, or "in-use" / "failed"."""
        with self._lock:
            self.channel.sendall(op + struct.pack("!H", port))
            answer, fds, _, _ = socket.recv_fds(self.channel, 1, 1)
        if answer == b"1" and fds:
            return socket.socket(fileno=fds[0])
        return "in-use" if answer == b"u" else "failed"

    def close(self) -> None:
        self.channel.close()
        os.waitpid(self.pid, 0)


def _back_out(outside: _Outside):
    def handle(inside: socket.socket, port: int) -> None:
        """A task connecting to 127.0.0.1:<port> in the namespace: on to this machine's."""
        here = outside.socket_for(b"c", port)
        if isinstance(here, str):
            inside.close()
            return
        _splice(inside, here)
    return handle


def _ports(text: str) -> list[int]:
    return [int(p) for p in text.split(",") if p.strip().isdigit()]


class _Doors:
    def __init__(self, outside: _Outside):
        self.outside, self.open = outside, {}

    def add(self, ports: list[int]) -> str:
        opened = []
        for port in ports:
            door = self.outside.socket_for(b"l", port)
            if isinstance(door, str):
                self.remove(opened)
                return f"port-in-use {port}" if door == "in-use" else f"failed {port}"
            opened.append(port)
            self.open[port] = door
            threading.Thread(target=_accept_until_closed, args=(door, _into_namespace, port),
                             daemon=True).start()
        return "ok"

    def remove(self, ports: list[int]) -> str:
        for port in ports:
            door = self.open.pop(port, None)
            if door is not None:
                with contextlib.suppress(OSError):
                    door.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
                door.close()
        return "ok"


#: Ports let back out, by number: the listener inside the namespace. A second request for a
#: number still open is answered by the same door; ``unreverse`` closes it, so the number is
#: free again for a task inside.
_reversed: dict[int, socket.socket] = {}


def _reverse(port: int, outside: _Outside) -> str:
    if port in _reversed:
        return f"ok {port}"
    try:
        listener = socket.create_server(("127.0.0.1", port))  # inside the namespace
    except OSError as exc:
        return f"failed {port} {exc.strerror}"
    _reversed[port] = listener
    threading.Thread(target=_accept_until_closed, args=(listener, _back_out(outside), port),
                     daemon=True).start()
    return f"ok {port}"


def _unreverse(port: int) -> str:
    listener = _reversed.pop(port, None)
    if listener is not None:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        listener.close()
    return f"ok {port}"


def serve(answers, commands) -> int:
    """Run the gate: answer on ``answers`` the commands read from ``commands`` until it closes
    or the owner dies, then exit."""
    from dtflab.network.netns import unshare_private

    outside = _Outside()
    try:
        unshare_private()
    except OSError as exc:
        answers.write(f"unavailable {exc.strerror or exc}\n")
        outside.close()
        return 76
    owner = os.getppid()

    def watch_owner():
        while os.getppid() == owner:
            time.sleep(0.25)
        os._exit(0)  # the helper sees its channel close and exits too

    threading.Thread(target=watch_owner, daemon=True).start()
    doors = _Doors(outside)
    answers.write(f"ready {os.getpid()}\n")
    for line in commands:
        word, _, rest = line.strip().partition(" ")
        if word == "open":
            answers.write(doors.add(_ports(rest)) + "\n")
        elif word == "close":
            answers.write(doors.remove(_ports(rest)) + "\n")
        elif word == "reverse" and rest.isdigit():
            answers.write(_reverse(int(rest), outside) + "\n")
        elif word == "unreverse" and rest.isdigit():
            answers.write(_unreverse(int(rest)) + "\n")
        else:
            answers.write(f"unknown {line.strip()}\n")
    outside.close()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtflab.network.gate")
    parser.add_argument("--ready_fd", type=int, required=True)
    args = parser.parse_args(argv)
    answers = os.fdopen(args.ready_fd, "w", buffering=1)
    code = serve(answers, sys.stdin)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without waiting for the daemon threads that serve connections


if __name__ == "__main__":
    sys.exit(main())
