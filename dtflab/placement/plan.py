"""A placement plan: which device holds each variable, and where the other ops run."""

from __future__ import annotations

import contextlib
import fnmatch
import math
import re
from dataclasses import dataclass

from dtflab import names, tf_private
from dtflab.errors import did_you_mean

VARIABLE_OPS = {"Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable", "_VarHandlesOp"}
STRATEGIES = ("round_robin", "greedy", "by_layer", "single")


@dataclass(frozen=True)
class VariableInfo:
    """A model variable as the plan sees it: name (no ``:0``), shape, dtype, bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


def variable_info(variable) -> VariableInfo:
    """From a ``tf.Variable`` (graph or eager) or a ``VariableInfo``."""
    if isinstance(variable, VariableInfo):
        return variable
    shape = tuple(int(d) if d is not None else 0 for d in variable.shape)
    dtype = variable.dtype.base_dtype
    return VariableInfo(variable.name.split(":")[0], shape, dtype.name,
                        math.prod(shape) * dtype.size)


def _op_info(op) -> VariableInfo | None:
    """A variable-creating graph op as a VariableInfo (bytes from its shape attr)."""
    if op.type not in VARIABLE_OPS:
        return None
    from dtflab._quiet import import_tf

    tf = import_tf()
    attr = op.node_def.attr
    shape = tuple(max(d.size, 0) for d in attr["shape"].shape.dim) if "shape" in attr else ()
    dtype = tf.dtypes.as_dtype(attr["dtype"].type) if "dtype" in attr else tf.float32
    return VariableInfo(op.name, shape, dtype.name, math.prod(shape) * dtype.size)


def _colocated_with(op) -> str | None:
    """The op that ``op`` must sit with (``colocate_with``), if not itself.

    TensorFlow applies colocation after the device functions, so while one runs the leader is
    only on the graph's colocation stack (private, read defensively), not yet on the op.
    """
    leaders = [getattr(obj, "op", obj) for obj in tf_private.colocation_leaders(op.graph)]
    candidates = [leader.name for leader in leaders if getattr(leader, "name", None)]
    candidates += [g.decode().removeprefix("loc:@") for g in op.colocation_groups()]
    return next((name for name in candidates if name != op.name), None)


def _layer_key(name: str) -> str:
    """``layer2/kernel`` -> ``layer2``; ``w2``/``b2`` -> ``2``; anything else is its own layer."""
    if "/" in name:
        return name.split("/", 1)[0]
    match = re.search(r"(\d+)$", name)
    return match.group(1) if match else name


class PlacementPlan:
    """Variable name or pattern -> device; every other op -> the compute device.

    In [1]: plan = PlacementPlan.greedy(cluster, job="ps")
    In [2]: plan.assign("w2", "/job:ps/task:1")          # a manual override wins
    In [3]: with graph.as_default(), plan.scope(): build()

    A strategy decides for variables no rule names: given ``variables`` it decides at once
    (greedy takes the largest first); otherwise it decides as the graph is built, in creation
    order, like ``replica_device_setter``. What it decided is kept in ``assignments``. Optimizer
    slots (``w/Adam``) follow their variable (TensorFlow colocates them).
    """

    def __init__(self, cluster=None, *, compute: str | None = None, devices=None):
        self.devices = _devices_of(cluster) if devices is None else [_full(d) for d in devices]
        if not self.devices:
            raise ValueError("a placement plan needs devices: pass a cluster or devices=[...]")
        self.compute = self._checked(compute) if compute else _default_compute(self.devices)
        self.rules: list[tuple[str, str]] = []
        self.strategy: str | None = None
        self.strategy_devices: list[str] = []
        self.assignments: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self._watchers: list = []

    # -- strategies ------------------------------------------------------------------------

    @classmethod
    def round_robin(cls, cluster, job: str = "ps", variables=None, **kwargs) -> "PlacementPlan":
        """Variables to the tasks of ``job`` in turn (what ``replica_device_setter`` does)."""
        return cls(cluster, **kwargs)._use("round_robin", job, variables)

    @classmethod
    def greedy(cls, cluster, job: str = "ps", variables=None, **kwargs) -> "PlacementPlan":
        """Each variable to the ``job`` task with the fewest bytes so far, largest first when
        the variables are known (TF's ``GreedyLoadBalancingStrategy``, by bytes)."""
        return cls(cluster, **kwargs)._use("greedy", job, variables)

    @classmethod
    def by_layer(cls, cluster, job: str = "ps", variables=None, **kwargs) -> "PlacementPlan":
        """Model parallelism: layer i's variables on task i of ``job`` (wrapping around).

        A variable's layer is its first name scope (``layer2/kernel``) or the number its name
        ends with (``w2``, ``b2``); layers count in the order they are first seen.
        """
        return cls(cluster, **kwargs)._use("by_layer", job, variables)

    @classmethod
    def single(cls, device: str, cluster=None, **kwargs) -> "PlacementPlan":
        """Everything, variables and compute, on one device."""
        devices = kwargs.pop("devices", None) or ([device] if cluster is None else None)
        plan = cls(cluster, devices=devices, compute=device, **kwargs)
        plan.strategy, plan.strategy_devices = "single", [plan.compute]
        return plan

    def use_strategy(self, strategy: str, job: str = "ps", variables=None) -> "PlacementPlan":
        """Start over with ``strategy`` (one of STRATEGIES): drops decisions and manual rules."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}{did_you_mean(strategy, STRATEGIES)}; "
                             f"choose one of: {', '.join(STRATEGIES)}")
        self.rules, self.assignments = [], {}
        if strategy == "single":
            self.strategy, self.strategy_devices = "single", [self.compute]
            for info in map(variable_info, variables or ()):
                self._decide(info)
        else:
            self._use(strategy, job, variables)
        self._changed()
        return self

    def bytes_per_device(self, variables) -> dict[str, int]:
        """Bytes of ``variables`` each device holds under this plan (every device listed)."""
        totals = {device: 0 for device in self.devices}
        infos = {info.name: info for info in map(variable_info, variables)}
        for name, device in self.placement(list(infos.values())).items():
            totals[device] += infos[name].nbytes
        return totals

    def imbalance(self, variables) -> float:
        """Largest over mean bytes across the devices variables may go to (1.0 is even)."""
        totals = self.bytes_per_device(variables)
        pool = self.strategy_devices or [d for d, n in totals.items() if n]
        loads = [totals[d] for d in pool] or [0]
        mean = sum(loads) / len(loads)
        return max(loads) / mean if mean else 1.0

    def _use(self, strategy: str, job: str, variables) -> "PlacementPlan":
        targets = [d for d in self.devices if d.startswith(f"/job:{job}/")]
        if not targets:
            jobs = sorted({names.split(d)[0] for d in self.devices})
            raise ValueError(f"no job {job!r} in this cluster{did_you_mean(job, jobs)}; "
                             f"its jobs are: {', '.join(jobs)}")
        self.strategy, self.strategy_devices = strategy, targets
        if variables is not None:
            infos = [variable_info(v) for v in variables]
            order = sorted(infos, key=lambda v: -v.nbytes) if strategy == "greedy" else infos
            for info in order:
                self._decide(info)
        return self

    def _decide(self, info: VariableInfo) -> str:
        """The strategy's device for a variable it has not placed yet (and remember it)."""
        self.sizes[info.name] = info.nbytes
        if info.name in self.assignments:
            return self.assignments[info.name]
        targets = self.strategy_devices
        if self.strategy == "round_robin":
            device = targets[len(self.assignments) % len(targets)]
        elif self.strategy == "greedy":
            load = {d: 0 for d in targets}
            for name, placed in self.assignments.items():
                load[placed] = load.get(placed, 0) + self.sizes.get(name, 0)
            device = min(targets, key=lambda d: (load[d], targets.index(d)))
        elif self.strategy == "by_layer":
            layers = list(dict.fromkeys(_layer_key(n) for n in self.assignments))
            key = _layer_key(info.name)
            index = layers.index(key) if key in layers else len(layers)
            device = targets[index % len(targets)]
        else:  # single, or no strategy
            device = self.strategy_devices[0] if self.strategy_devices else self.compute
        self.assignments[info.name] = device
        return device

    # -- manual placement ------------------------------------------------------------------

    def assign(self, pattern: str, device: str) -> "PlacementPlan":
        """Put variables whose name matches ``pattern`` (exact, or ``*``/``?`` wildcards) on
        ``device``; later assignments win over earlier ones and over the strategy."""
        device = self._checked(device)
        self.rules = [(p, d) for p, d in self.rules if p != pattern] + [(pattern, device)]
        self._changed()
        return self

    def set_compute(self, device: str) -> "PlacementPlan":
        self.compute = self._checked(device)
        self._changed()
        return self

    def device_for(self, name: str, nbytes: int | None = None) -> str:
        """The device of variable ``name`` under this plan."""
        name = name.split(":")[0]
        for pattern, device in reversed(self.rules):
            if name == pattern or fnmatch.fnmatchcase(name, pattern):
                if nbytes is not None:
                    self.sizes[name] = nbytes
                return device
        if self.strategy is None:
            return self.compute
        return self._decide(VariableInfo(name, (), "", nbytes or self.sizes.get(name, 0)))

    def placement(self, variables) -> dict[str, str]:
        """``{variable name: device}`` for ``variables`` (tf Variables or VariableInfo)."""
        infos = [variable_info(v) for v in variables]
        if self.strategy == "greedy":  # largest first, as the strategy promises
            for info in sorted(infos, key=lambda v: -v.nbytes):
                self.device_for(info.name, info.nbytes)
        return {info.name: self.device_for(info.name, info.nbytes) for info in infos}

    # -- applying it -----------------------------------------------------------------------

    def device_function(self, op) -> str:
        """For ``tf.device``: variables by the plan, every other op on the compute device."""
        info = _op_info(op)
        if info is None:
            return self.compute
        leader = _colocated_with(op)
        if leader is not None:  # an optimizer slot or beta power: it lives with its variable
            return self.device_for(leader)
        return self.device_for(info.name, info.nbytes)

    @contextlib.contextmanager
    def scope(self):
        """Apply the plan to ops and variables created in the block.

        tf.compat.v1 graphs: every op, through a device function (an explicit ``tf.device``
        inside the block still wins). TF2 eager code: variables only, through a variable
        creator; eager ops run where ``tf.device`` puts them (TensorFlow has no device
        functions in eager mode).
        """
        from dtflab._quiet import import_tf

        tf = import_tf()

        def creator(next_creator, **kwargs):
            name = kwargs.get("name") or "Variable"
            shape = getattr(kwargs.get("initial_value"), "shape", None)
            nbytes = None
            if shape is not None and not callable(kwargs.get("initial_value")):
                nbytes = math.prod(int(d or 0) for d in shape) * 4
            with tf.device(self.device_for(name, nbytes)):
                return next_creator(**kwargs)

        if tf.executing_eagerly():
            with tf.variable_creator_scope(creator):
                yield self
        else:
            with tf.compat.v1.get_default_graph().device(self.device_function):
                yield self

    # -- round trips -----------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {"devices": list(self.devices), "compute": self.compute, "strategy": self.strategy,
                "strategy_devices": list(self.strategy_devices),
                "assignments": dict(self.assignments), "sizes": dict(self.sizes),
                "rules": [list(rule) for rule in self.rules]}

    @classmethod
    def from_dict(cls, data: dict, cluster=None) -> "PlacementPlan":
        plan = cls(cluster, devices=None if cluster is not None else data["devices"],
                   compute=data["compute"])
        plan.strategy = data.get("strategy")
        plan.strategy_devices = [plan._checked(d) for d in data.get("strategy_devices", [])]
        plan.assignments = {n: plan._checked(d) for n, d in data.get("assignments", {}).items()}
        plan.sizes = dict(data.get("sizes", {}))
        plan.rules = [(p, plan._checked(d)) for p, d in data.get("rules", [])]
        return plan

    def restore(self, data: dict) -> "PlacementPlan":
        """Take back the state of an earlier ``to_dict()`` in place (undo); watchers are told."""
        earlier = PlacementPlan.from_dict(data, None)
        self.devices, self.compute = earlier.devices, earlier.compute
        self.strategy, self.strategy_devices = earlier.strategy, earlier.strategy_devices
        self.assignments, self.sizes, self.rules = earlier.assignments, earlier.sizes, earlier.rules
        self._changed()
        return self

    def to_code(self, name: str = "plan") -> str:
        """Python that rebuilds this plan's placement (decisions made explicit)."""
        lines = [f"{name} = PlacementPlan(cluster, compute={self.compute!r})"]
        lines += [f"{name}.assign({var!r}, {device!r})" for var, device in self.assignments.items()]
        lines += [f"{name}.assign({pattern!r}, {device!r})" for pattern, device in self.rules]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_code()

    def __repr__(self) -> str:
        strategy = f" {self.strategy} over {len(self.strategy_devices)}" if self.strategy else ""
        return (f"<PlacementPlan{strategy}: {len(self.assignments)} decided, {len(self.rules)} "
                f"rules, compute on {self.compute}>")

    def __eq__(self, other) -> bool:
        return isinstance(other, PlacementPlan) and self.to_dict() == other.to_dict()

    # -- helpers -------------------------------------------------------------------------

    def _checked(self, device: str) -> str:
        full = _full(device)
        if full not in self.devices:
            raise ValueError(f"unknown device {device!r}; this cluster has: {', '.join(self.devices)}")
        return full

    def _changed(self) -> None:
        for watcher in list(self._watchers):
            watcher()


def _full(device: str) -> str:
    """``ps:1``, ``/job:ps/task:1`` or ``/job:ps/replica:0/task:1/device:CPU:0`` -> ``/job:ps/task:1``."""
    if not isinstance(device, str):
        raise ValueError(f"a device is a string like '/job:ps/task:0', got {device!r}")
    return names.device(device)


def _devices_of(cluster) -> list[str]:
    if cluster is None:
        return []
    return [f"/job:{job}/task:{i}" for job, tasks in cluster.addresses.items()
            for i in range(len(tasks))]


def _default_compute(devices: list[str]) -> str:
    for job in ("worker", "master", "chief"):
        for device in devices:
            if device.startswith(f"/job:{job}/"):
                return device
    return devices[0]
