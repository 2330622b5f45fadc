"""Connects to the notebook's report listener at 127.0.0.1:PORT (argv[1]) as a worker program
does. worker:0 says hello and then crashes (exit 3); every other worker never says hello, as a
worker does while its start-up waits in a collective for a peer that is gone."""
import json
import os
import socket
import sys
import time

name = "worker:{}".format(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
deadline = time.monotonic() + 30
while True:
    try:
        report = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
if name != "worker:0":
    time.sleep(600)
report.sendall((json.dumps({"kind": "hello", "worker": name, "pid": os.getpid(), "workers": 2,
                            "resumed_at": 0, "reached": "127.0.0.1"}) + "\n").encode())
time.sleep(1.0)  # the notebook has read the hello
sys.exit(3)
