"""Ports chosen at run time: free, distinct, and below the ephemeral range where it leaves room."""

import socket

from dtflab.cluster import ports


def listen_on(port: int) -> None:
    """Raise unless ``port`` can be listened on now (what a task server does with it)."""
    with socket.socket() as s:
        s.bind(("", port))
        s.listen()


def test_ports_are_free_distinct_and_below_the_ephemeral_range():
    first, last = ports.ephemeral_range()
    assert 0 < first <= last  # this machine's file, read
    chosen = ports.free_ports(8)
    assert len(set(chosen)) == 8
    # below the range from which every outgoing connection takes its local port, so none of
    # them can take a chosen port before its task binds it (bind(0) drew from inside it)
    assert all(ports.LOWEST <= port < first for port in chosen), (chosen, first)
    for port in chosen:
        listen_on(port)


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        used = taken.getsockname()[1]
        (other,) = ports.free_ports(1)
        monkeypatch.setattr(ports, "HANDED_OUT", type(ports.HANDED_OUT)())  # other: free again
        monkeypatch.setattr(ports._DRAW, "sample", lambda population, k: [used, other])
        assert ports.free_ports(1) == [other]


def test_where_the_range_leaves_no_room_the_kernel_chooses(monkeypatch, tmp_path):
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text(f"{ports.LOWEST}\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_FILE", narrow)
    assert ports.ephemeral_range() == (ports.LOWEST, 60999)
    chosen = ports.free_ports(3)
    assert len(set(chosen)) == 3
    for port in chosen:
        listen_on(port)


def test_an_unreadable_range_is_linuxs_default(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "EPHEMERAL_FILE", tmp_path / "missing")
    assert ports.ephemeral_range() == ports.EPHEMERAL_DEFAULT


def test_a_port_handed_out_is_not_handed_out_again_before_its_user_binds_it(monkeypatch):
    """The workers' controller is handed a pool, then a cluster its tasks' ports, each bound
    later: the same draw (the candidates in the same order) must not give the second any of
    the first's ports, though none is bound yet."""
    monkeypatch.setattr(ports, "HANDED_OUT", type(ports.HANDED_OUT)())
    candidates = list(range(20000, 20000 + 200))
    monkeypatch.setattr(ports._DRAW, "sample", lambda population, k: candidates[:k])
    first, second = ports.free_ports(5), ports.free_ports(5)
    assert len(first) == len(second) == 5
    assert set(first).isdisjoint(second), (first, second)
