"""Where context parallelism puts a sequence: which positions each of c workers holds under
the naive or the zig-zag cut, which blocks of causal attention scores each computes, and how far
round the ring each chunk of keys and values travels (:mod:`~dtflab.train.graphs.
ring_attention` computes; :func:`dtflab.train.formulas.split_bytes.context_parallel_bytes` counts).

**naive** gives worker i the i-th of c equal pieces; under the causal mask worker i's queries see
i + 1 pieces of keys, so the last worker computes c times what the first does. **zig-zag** cuts
2c pieces and gives worker i pieces i and 2c - 1 - i, one from each end: every worker computes
the same. A chunk of keys travels only as far round the ring as the last worker that attends
to it (in one graph a tensor that nobody reads is not sent): the naive cut's ring is a chain.
Its gradient comes back from each worker that attends to it to the previous one that does.
"""

from __future__ import annotations

CUTS = ("naive", "zigzag")


def chunks(cut: str, ways: int, sequence: int) -> list[list[tuple[int, int]]]:
    """Each worker's positions as ``(start, stop)`` chunks, in sequence order."""
    if cut == "naive":
        n = sequence // ways
        return [[(i * n, (i + 1) * n)] for i in range(ways)]
    n = sequence // (2 * ways)
    return [[(i * n, (i + 1) * n), ((2 * ways - 1 - i) * n, (2 * ways - i) * n)]
            for i in range(ways)]


def relation(query: tuple[int, int], key: tuple[int, int]) -> str:
    """``"full"``, ``"causal"`` or ``"none"``: what queries ``query`` see of keys ``key``."""
    if key[1] <= query[0]:
        return "full"
    return "causal" if key == query else "none"


def schedule(cut: str, ways: int, sequence: int) -> list[list[tuple[int, tuple, tuple, str]]]:
    """For each worker, each block of scores it computes: ``(round, query chunk, key chunk,
    "full" | "causal")``; in round r worker m holds the keys of worker (m - r) mod c."""
    pieces = chunks(cut, ways, sequence)
    found = []
    for m in range(ways):
        mine = []
        for r in range(ways):
            for key in pieces[(m - r) % ways]:
                mine += [(r, query, key, relation(query, key)) for query in pieces[m]
                         if relation(query, key) != "none"]
        found.append(mine)
    return found


def _users(cut: str, ways: int, sequence: int):
    """For each chunk of keys: its worker j and the rounds r (0: j itself) in which worker
    (j + r) mod c attends to it."""
    pieces = chunks(cut, ways, sequence)
    for j in range(ways):
        for key in pieces[j]:
            yield j, key, [r for r in range(ways) if any(
                relation(query, key) != "none" for query in pieces[(j + r) % ways])]


def hops(cut: str, ways: int, sequence: int) -> list[tuple[int, int, tuple[int, int]]]:
    """``(from worker, to worker, key chunk)`` for every hop a chunk of keys and values makes
    round the ring in the forward: as far as the last worker that attends to it."""
    return [((j + r - 1) % ways, (j + r) % ways, key)
            for j, key, rounds in _users(cut, ways, sequence) for r in range(1, max(rounds) + 1)]


def gradient_hops(cut: str, ways: int, sequence: int) -> list[tuple[int, int, tuple[int, int]]]:
    """``(from worker, to worker, key chunk)`` for every send of a chunk's gradient in the
    backward: each worker that attends to the chunk sends the gradient it has summed to the
    one before it that does. A worker the chunk only passed through adds nothing to it, and
    TensorFlow's gradient of a copy is the incoming gradient itself, so it is skipped."""
    return [((j + r) % ways, (j + before) % ways, key)
            for j, key, rounds in _users(cut, ways, sequence)
            for before, r in zip(rounds, rounds[1:])]


def work(cut: str, ways: int, sequence: int) -> list[int]:
    """Query-key score pairs each worker computes (a causal block computed whole, as one
    process computes the whole square): the attention's arithmetic, by worker."""
    return [sum((q[1] - q[0]) * (k[1] - k[0]) for _, q, k, _ in mine)
            for mine in schedule(cut, ways, sequence)]
