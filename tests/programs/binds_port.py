"""Binds 127.0.0.1:PORT (argv[1]) and exits 0; exits 1 with the error if the port is taken."""
import socket
import sys

with socket.create_server(("127.0.0.1", int(sys.argv[1]))):
    print(f"bound {sys.argv[1]}", flush=True)
