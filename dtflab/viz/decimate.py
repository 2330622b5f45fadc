"""A streamed line that stays at most ``limit`` points however long the run goes on.

A million-step run streamed point by point grows every source without bound: the page redraws
all of them several times a second, falls behind, and a Stop click waits its turn behind the
backlog (issue 33: 21,000 points a line after four minutes; the click took over a minute to
reach the kernel). Here each point is the mean of the records it covers. When the line is full,
neighbouring points merge in pairs (x of the later one, y their weighted mean) and each new
point covers twice as many records: the whole run stays on the plot at a resolution of
``limit`` points. A merge replaces the source's data, once each time the run doubles.
"""

from __future__ import annotations

LIMIT = 2_000


class DecimatedLine:
    """Feeds one ``ColumnDataSource`` with columns ``x`` and ``y`` (the names given)."""

    def __init__(self, source, x: str, y: str, limit: int = LIMIT):
        if limit < 2:
            raise ValueError(f"limit={limit!r}: a line needs at least 2 points; pass limit >= 2")
        self.source, self.x, self.y, self.limit = source, x, y, limit
        self.stride = 1  # records per point from now on
        self._xs: list = []
        self._ys: list = []
        self._weights: list[int] = []
        self._bucket: list[tuple] = []

    @property
    def points(self) -> int:
        return len(self._xs)

    @property
    def records(self) -> int:
        """Records the points stand for (after ``flush``, every record added)."""
        return sum(self._weights)

    def add(self, xs, ys) -> None:
        """Append records; what makes whole points reaches the page now, the rest waits."""
        new_x, new_y, new_w = [], [], []
        for x, y in zip(xs, ys):
            self._bucket.append((x, y))
            if len(self._bucket) == self.stride:
                new_x.append(x)
                new_y.append(sum(b[1] for b in self._bucket) / len(self._bucket))
                new_w.append(len(self._bucket))
                self._bucket = []
        self._append(new_x, new_y, new_w)

    def flush(self) -> None:
        """Draw the records still waiting for a whole point (at the end of a run)."""
        if self._bucket:
            bucket, self._bucket = self._bucket, []
            self._append([bucket[-1][0]], [sum(b[1] for b in bucket) / len(bucket)], [len(bucket)])

    def _append(self, xs, ys, weights) -> None:
        if not xs:
            return
        self._xs += xs
        self._ys += ys
        self._weights += weights
        if self.points <= self.limit:
            self.source.stream({self.x: xs, self.y: ys})
            return
        while self.points > self.limit:
            self._merge_pairs()
        self.source.data = {self.x: list(self._xs), self.y: list(self._ys)}

    def _merge_pairs(self) -> None:
        xs, ys, ws = [], [], []
        for i in range(0, self.points - 1, 2):
            w = self._weights[i] + self._weights[i + 1]
            xs.append(self._xs[i + 1])
            ys.append((self._ys[i] * self._weights[i] + self._ys[i + 1] * self._weights[i + 1]) / w)
            ws.append(w)
        if self.points % 2:
            xs.append(self._xs[-1])
            ys.append(self._ys[-1])
            ws.append(self._weights[-1])
        self._xs, self._ys, self._weights = xs, ys, ws
        self.stride *= 2
