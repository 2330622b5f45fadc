"""The machines a run is planned on: each device's arithmetic rate and memory, and the links
between devices, as the planner's step-time model reads them (pure Python).

A :class:`Hardware` is measured here (``dtflab.train.experiments.calibrate``: ``measured=True``)
or taken from a datasheet and a paper (:data:`PRESETS`, each figure's source in its entry). The
model (``planner.step_time``) charges each op of a step:

- arithmetic: FLOPs over the peak rate of its kind (a matrix multiply, or anything else) times
  that kind's efficiency at the op's size (:meth:`Hardware.efficiency`, thresholds in GFLOP as
  the Calculon simulator states them), and the bytes the op reads and writes over the memory
  bandwidth times its efficiency at that size; the op takes the larger of the two (a roofline),
  or their sum where the hardware says its ops do not overlap the two (``overlap=False``, the
  processing mode Calculon validated its A100 and H100 files with);
- element-wise ops' bytes times ``vector_traffic``: the bytes the framework's unfused kernels
  move for each byte the model counts (1 where kernels are fused, as Megatron's and XLA's are;
  measured here from a traced step of dtflab's transformer, whose LayerNorm, GELU and softmax
  are several TensorFlow ops each);
- a fixed cost per op (``per_op_s``: a GPU kernel's launch, TensorFlow's executor here), and
  one per step (``per_step_s``: running the step and feeding its batch, measured here; none in
  the presets, whose runs hide it behind the device's queue);
- a collective over n devices on a :class:`Link`: ``latency + bytes x factor / (bandwidth x
  efficiency)``, the factor ring-shaped (an all-reduce 2 (n - 1) / n, a reduce-scatter or an
  all-gather (n - 1) / n, a send 1).

A group of devices talks over the node's link when it fits inside one node (``per_node``
consecutive devices), else over the cluster's: a device's own adapter for a send, the adapters
of the group's devices a node shares for a ring collective (:meth:`Hardware.link`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

#: What ``hardware=`` takes besides a Hardware: ``"here"`` (measured) and the presets' names.
HERE = "here"


@dataclass(frozen=True)
class Link:
    """One kind of link: ``bandwidth`` bytes/s one way per device, ``efficiency`` the share a
    collective reaches on large messages, ``latency`` seconds per collective or send."""

    name: str
    bandwidth: float
    latency: float
    efficiency: float = 1.0

    def seconds(self, nbytes: float, factor: float = 1.0) -> float:
        """One collective or send moving ``nbytes`` x ``factor`` through each device."""
        if nbytes <= 0:
            return 0.0
        return self.latency + nbytes * factor / (self.bandwidth * self.efficiency)


@dataclass(frozen=True)
class Hardware:
    """A device and its links (see the module's docstring). ``flops`` maps a compute type
    (``"float32"``, ``"bfloat16"``, ``"float16"``) to the peak FLOP/s of matrix multiplies,
    ``vector_flops`` of everything else; efficiencies are ``((threshold, share), ...)`` from the
    largest threshold down: an op of at least ``threshold`` GFLOP (memory: MB) reaches
    ``share`` of the peak (a share above 1: a CPU's caches serve a small op faster than its
    memory serves a large one)."""

    name: str
    flops: dict
    memory_bytes: float
    memory_bandwidth: float
    per_node: int
    node: Link
    cluster: Link
    vector_flops: dict = field(default_factory=dict)
    matrix_efficiency: tuple = ((0.0, 1.0),)
    vector_efficiency: tuple = ((0.0, 1.0),)
    memory_efficiency: tuple = ((0.0, 1.0),)
    per_op_s: float = 0.0
    per_step_s: float = 0.0
    vector_traffic: float = 1.0
    overlap: bool = True
    measured: bool = False
    source: str = ""
    cpus: float = 0.0  # measured: the CPUs' worth of time the tasks shared
    #: measured: the executor's fixed seconds an op and seconds a byte it reads and writes, by
    #: price class (``planner.graph_ops.kind``): what ``planner.executor`` charges each op
    op_costs: dict = field(default_factory=dict)
    #: measured: ``((GFLOP, FLOP/s), ...)`` of square float32 multiplies on one task alone, by
    #: size, smallest first: what ``planner.executor`` prices a multiply at (its fixed cost in)
    matrix_rates: tuple = ()
    #: measured: the share of its speed alone an op keeps while every core runs one, for
    #: ``"matrix"`` (multiplies) and ``"memory"`` (the rest: they share the memory's bandwidth)
    together: dict = field(default_factory=dict)
    #: measured: the share of a trip between two tasks that is work on a core (gRPC's handlers
    #: and copies), the rest waiting
    transfer_cores: float = 0.0
    #: measured: ``{class: (bytes, seconds a byte)}``, an element-wise class's cost a byte on
    #: tensors that fit in a core's cache (``op_costs`` holds it on ones that do not)
    cached: dict = field(default_factory=dict)
    #: The attention a run on this hardware is planned with unless told (``"fused"`` on the
    #: GPU presets, as every published run of today's models is), and the share of the matrix
    #: peak a fused attention kernel reaches, scores, softmax and weighted values together, as
    #: its authors measured it (0: the kernel's multiplies priced as any other multiply)
    attention: str = "plain"
    attention_efficiency: float = 0.0
    #: The embedding a run on this hardware is planned with unless told: ``"lookup"`` on the
    #: GPU presets (a gather, as their frameworks run it), ``"one-hot"`` (dtflab's) elsewhere
    embedding: str = "one-hot"

    def matrix_rate(self, flops: float) -> float:
        """FLOP/s of one multiply of ``flops`` on a core alone: ``matrix_rates`` read between
        its sizes on log scales (the end sizes' rates beyond them), else the peak times the
        efficiency curve."""
        import math

        if not self.matrix_rates:
            return self.peak("float32") * self.efficiency(self.matrix_efficiency, flops / 1e9) \
                * self.core_share
        sizes = self.matrix_rates
        x = math.log(max(flops / 1e9, 1e-12))
        if x <= math.log(sizes[0][0]):
            return sizes[0][1]
        for (a, rate_a), (b, rate_b) in zip(sizes, sizes[1:]):
            if x <= math.log(b):
                share = (x - math.log(a)) / (math.log(b) - math.log(a))
                return math.exp(math.log(rate_a) + share * (math.log(rate_b) - math.log(rate_a)))
        return sizes[-1][1]

    @property
    def core_share(self) -> float:
        """One core's arithmetic over what a task reached with every task multiplying at once
        (more than 1 where the tasks outnumbered the CPUs when measured)."""
        return max(1.0, self.per_node / self.cpus) if self.measured and self.cpus else 1.0

    def peak(self, precision: str, kind: str = "matrix") -> float:
        """Peak FLOP/s for ``precision``; a 16-bit type a device lacks runs at float32's."""
        table = self.flops if kind == "matrix" else (self.vector_flops or self.flops)
        return table.get(precision) or table.get("bfloat16") or table["float32"]

    @staticmethod
    def efficiency(curve, size: float) -> float:
        for threshold, share in curve:
            if size >= threshold:
                return share
        return curve[-1][1]

    def op_seconds(self, flops: float, nbytes: float, precision: str,
                   kind: str = "matrix") -> float:
        """One op: its arithmetic and its memory traffic (the larger, or their sum where
        ``overlap`` is False), plus ``per_op_s``. Kind ``"attention"``: a fused attention
        kernel's multiplies, at ``attention_efficiency`` of the matrix peak (what the kernel's
        measured rate holds: its memory traffic and its softmax too), or as a ``"matrix"`` op
        where that is not known."""
        if kind == "attention":
            if self.attention_efficiency:
                return flops / (self.peak(precision) * self.attention_efficiency) + self.per_op_s
            kind = "matrix"
        curve = self.matrix_efficiency if kind == "matrix" else self.vector_efficiency
        compute = flops / (self.peak(precision, kind) * self.efficiency(curve, flops / 1e9)) \
            if flops else 0.0
        memory = nbytes / (self.memory_bandwidth
                           * self.efficiency(self.memory_efficiency, nbytes / 1e6)) \
            if nbytes else 0.0
        if kind != "matrix":
            memory *= self.vector_traffic  # more ops of the same size, not bigger ones
        return (max(compute, memory) if self.overlap else compute + memory) + self.per_op_s

    @property
    def plan_defaults(self) -> dict:
        """The Plan fields a preset's or a dict's model takes from this hardware unless told:
        the attention and the embedding its runs use."""
        return {"attention": self.attention, "embedding": self.embedding}

    def link(self, group: int, stride: int = 1, ring: bool = False) -> Link:
        """The link a group of ``group`` devices, ``stride`` apart, talks over. A ring
        collective (``ring=True``: an all-reduce, all-gather or reduce-scatter) across nodes
        runs one ring a device of the group each node holds, each over that device's own
        adapter (NCCL's channels), so its rate a device is the node's share of those adapters
        (k x the cluster's bandwidth for k of the group a node, at most the node's link): two
        nodes of 8 A100s with 4 HDR adapters each reach about 85-96 GB/s of the 100 GB/s four
        adapters give (NVIDIA/nccl-tests#119). A send, and a group of one device a node, get
        one adapter."""
        if group * stride <= self.per_node:
            return self.node
        shared = min(group, max(1, self.per_node // stride)) if ring else 1
        if shared == 1:
            return self.cluster
        return replace(self.cluster, name=f"{self.cluster.name} ({shared} adapters a node)",
                       bandwidth=min(shared * self.cluster.bandwidth, self.node.bandwidth))

    def with_tasks(self, tasks: int) -> Hardware:
        """This measured machine with ``tasks`` tasks sharing its CPUs instead of the
        ``per_node`` it was measured with: each task's share of the arithmetic and of the
        memory's bandwidth follows ``cpus / tasks`` where the tasks outnumber the CPUs."""
        if not self.measured or not self.cpus:
            raise ValueError(f"with_tasks: {self.name} was not measured here; only "
                             f"train.calibrate(cluster)'s hardware shares its CPUs")
        share = min(1.0, self.cpus / tasks) / min(1.0, self.cpus / self.per_node)
        return replace(self, name=f"here ({tasks} tasks sharing {self.cpus:g} CPUs)",
                       flops={k: v * share for k, v in self.flops.items()},
                       memory_bandwidth=self.memory_bandwidth * share,
                       memory_bytes=self.memory_bytes * self.per_node / tasks,
                       per_op_s=self.per_op_s / share, per_node=tasks)

    def describe(self) -> str:
        how = "measured here" if self.measured else "from datasheets and papers"
        best = max(self.flops.values())
        links = f"{self.node.name} {self.node.bandwidth / 1e9:.4g} GB/s"
        if self.cluster != self.node:  # one link between every pair of tasks (calibrate's) is said once
            links += f", {self.cluster.name} {self.cluster.bandwidth / 1e9:.4g} GB/s"
        return (f"{self.name} ({how}): {best / 1e12:.4g} TFLOP/s, "
                f"{self.memory_bytes / 1e9:.4g} GB at {self.memory_bandwidth / 1e9:.4g} GB/s, "
                f"{self.per_node} a node; {links}")


# Calculon's efficiency curves (calculon-ai/calculon, systems/a100_80g.json and
# h100_80g_nvl8.json, SC'23): matrix ops of >= 128 / 16 / 1 GFLOP reach 95 / 90 / 60% of peak,
# smaller 10%; vector ops >= 16 / 1 GFLOP 95 / 50%, smaller 10%; memory traffic of >= 100 /
# 10 / 1 MB 90 / 75 / 60%, smaller 30%.
_CALCULON_MATRIX = ((128.0, 0.95), (16.0, 0.9), (1.0, 0.6), (0.0, 0.1))
_CALCULON_VECTOR = ((16.0, 0.95), (1.0, 0.5), (0.0, 0.1))
_CALCULON_MEMORY = ((100.0, 0.90), (10.0, 0.75), (1.0, 0.6), (0.0, 0.3))


def a100_node() -> Hardware:
    """NVIDIA DGX A100, 80 GB SXM4 (Selene's nodes, where Korthikanti et al. 2022 measured).

    - 312 TFLOP/s dense bfloat16/float16 tensor, 19.5 float32 (NVIDIA A100 datasheet,
      nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf); 78 TFLOP/s 16-bit non-tensor and the
      efficiency curves as Calculon's ``systems/a100_80g.json`` states them;
    - 80 GB HBM2e at 2,039 GB/s (datasheet; Calculon uses 2,048);
    - 8 GPUs a node on NVLink 3: 300 GB/s a direction (12 links x 25 GB/s, NCCL's maintainers in
      NVIDIA/nccl-tests#149), 0.65 of it and 10 µs a collective as Calculon models it;
    - one 200 Gb/s HDR InfiniBand adapter a GPU: 25 GB/s, 0.9 of it and 20 µs (Calculon);
    - each op's arithmetic and memory time added, not overlapped (Calculon's ``no_overlap``);
    - no multiply past 0.859 of the 16-bit peak: the best of every shape a maximum-achievable
      matmul scan timed on an A100 SXM, 267.9 of 312 TFLOP/s (CUDA 12.1; stas00/ml-engineering,
      ``compute/accelerator/README.md``, "Maximum Achievable Matmul FLOPS comparison table"),
      where Calculon's curve reaches 0.95;
    - fused attention at 0.65 of the 16-bit peak: FlashAttention-2 on the A100 reaches up to
      73% of it forward and 63% backward (Dao 2023, arXiv 2307.08691, section 4.1), the
      backward two thirds of the work."""
    return _calculon_gpu_node(
        "A100 node (8 x A100 80 GB, NVLink, HDR InfiniBand)", tensor=312e12, vector=78e12,
        float32=19.5e12, memory_bandwidth=2039e9, node=Link("NVLink 3", 300e9, 10e-6, 0.65),
        cluster=Link("HDR InfiniBand", 25e9, 20e-6, 0.9), matrix_ceiling=0.859,
        attention_efficiency=0.65,
        source="NVIDIA A100 datasheet; Calculon systems/a100_80g.json; nccl-tests#149; "
               "ml-engineering's MAMF table; FlashAttention-2 (arXiv 2307.08691)")


def h100_node() -> Hardware:
    """NVIDIA DGX/HGX H100, 80 GB SXM5.

    - 989.4 TFLOP/s dense bfloat16/float16 tensor (the datasheet's 1,979 is with sparsity),
      66.9 float32 (NVIDIA H100 datasheet; Hopper whitepaper's table); 16-bit non-tensor 133.8;
    - 80 GB HBM3 at 3,350 GB/s (datasheet);
    - 8 GPUs a node on NVLink 4 with 4 NVSwitches: 450 GB/s a direction (18 links x 25 GB/s);
      NCCL reaches ~370 GB/s on ring collectives, 0.82 (NVIDIA/nccl-tests#212), 10 µs;
    - one 400 Gb/s NDR ConnectX-7 a GPU: 50 GB/s, NCCL 46-48 GB/s (nccl-tests#290): 0.93, 20 µs;
    - efficiency curves and the added arithmetic and memory times as Calculon's
      ``systems/h100_80g_nvl8.json``, no multiply past 0.801 of the peak: the maximum-achievable
      matmul scan's 792.1 of 989 TFLOP/s on an H100 SXM (CUDA 12.1; ml-engineering's table, as
      the A100's);
    - fused attention at 0.35 of the 16-bit peak: FlashAttention-2 on the H100, the kernel
      PyTorch's and the flash-attn package's runs of 2023-24 used (Shah et al. 2024,
      FlashAttention-3, arXiv 2407.08608, abstract; FlashAttention-3 itself reaches up to 0.75
      forward: a ``replace(h100_node(), attention_efficiency=...)`` plans with it)."""
    return _calculon_gpu_node(
        "H100 node (8 x H100 80 GB, NVLink 4, NDR InfiniBand)", tensor=989.4e12,
        vector=133.8e12, float32=66.9e12, memory_bandwidth=3350e9,
        node=Link("NVLink 4", 450e9, 10e-6, 0.82),
        cluster=Link("NDR InfiniBand", 50e9, 20e-6, 0.93), matrix_ceiling=0.801,
        attention_efficiency=0.35,
        source="NVIDIA H100 datasheet; Calculon systems/h100_80g_nvl8.json; nccl-tests#212, "
               "#290; ml-engineering's MAMF table; FlashAttention-3 (arXiv 2407.08608)")


def _calculon_gpu_node(name: str, *, tensor: float, vector: float, float32: float,
                       memory_bandwidth: float, node: Link, cluster: Link, matrix_ceiling: float,
                       attention_efficiency: float, source: str) -> Hardware:
    """An 8-GPU node of 80 GB devices as Calculon models one: ``tensor`` and ``vector``
    16-bit FLOP/s, ``float32`` for both, its efficiency curves (the matrix curve's shares at
    most ``matrix_ceiling``, the device's best measured multiply), each op's arithmetic and
    memory times added (``no_overlap``); planned with fused attention and a looked-up
    embedding unless told."""
    return Hardware(
        name, flops={"bfloat16": tensor, "float16": tensor, "float32": float32},
        vector_flops={"bfloat16": vector, "float16": vector, "float32": float32},
        memory_bytes=80e9, memory_bandwidth=memory_bandwidth, per_node=8, node=node,
        cluster=cluster,
        matrix_efficiency=tuple((size, min(share, matrix_ceiling))
                                for size, share in _CALCULON_MATRIX),
        vector_efficiency=_CALCULON_VECTOR, memory_efficiency=_CALCULON_MEMORY, per_op_s=0.0,
        overlap=False, attention="fused", attention_efficiency=attention_efficiency,
        embedding="lookup",
        source=source)


def tpu_v5e_slice() -> Hardware:
    """A Google TPU v5e slice (16 x 16 chips, a 2-D torus; 8 chips a host).

    - 197 TFLOP/s bfloat16 a chip; 16 GB HBM at 819 GB/s (Google Cloud's TPU v5e page; the
      Scaling Book's table, ``jax-ml/scaling-book`` tpus.md, gives 1.97e14 and 8.1e11);
    - ICI 45 GB/s one way a link (the Scaling Book), 4 links a chip; a ring along one axis uses
      two of them, 90 GB/s, ~1 µs a hop (the book's assumption);
    - the 16 x 16 slice is one ICI domain; beyond it, DCN: 2 x 100 Gb/s a host of 8, 3.125
      GB/s a chip (Google Cloud; the book);
    - the efficiency curves are not published for the TPU: the matrix units' share is taken as
      Calculon's GPU curve, an assumption, not a measurement."""
    return Hardware(
        "TPU v5e slice (256 chips, ICI; DCN beyond)",
        flops={"bfloat16": 197e12, "float32": 197e12 / 4},
        memory_bytes=16e9, memory_bandwidth=819e9, per_node=256,
        node=Link("ICI", 90e9, 1e-6, 1.0), cluster=Link("DCN", 3.125e9, 20e-6, 0.9),
        matrix_efficiency=_CALCULON_MATRIX, vector_efficiency=_CALCULON_VECTOR,
        memory_efficiency=_CALCULON_MEMORY, overlap=True,
        source="Google Cloud TPU v5e page; jax-ml/scaling-book tpus.md")


def cpu_cluster() -> Hardware:
    """Servers of 2 x Intel Xeon Platinum 8480+ (Sapphire Rapids, 112 cores at 2.0 GHz), a
    device being one server, over 25 Gb Ethernet.

    - float32 112 x 2.0 GHz x 64 FLOP/cycle (two AVX-512 FMA units) = 14.3 TFLOP/s; bfloat16
      by AMX, 1,024 operations a cycle a core, 229 TFLOP/s: arithmetic from Intel's
      specifications, peaks a server reaches only at its base clock or below;
    - 8 DDR5-4800 channels a socket: 614 GB/s; 512 GB a server (a common configuration);
    - 25 GbE: 3.125 GB/s; TCP collectives reach ~0.8 of a link's rate (gloo's maintainers, 1
      GbE, pytorch/gloo#21) and ~25 µs a message (from memory, not a stored measurement);
    - one server a node: every group crosses the Ethernet."""
    return Hardware(
        "CPU cluster (2 x Xeon 8480+ servers, 25 GbE)",
        flops={"float32": 14.3e12, "bfloat16": 229e12}, memory_bytes=512e9,
        memory_bandwidth=614e9, per_node=1,
        node=Link("inside a server", 614e9, 1e-6, 0.5), cluster=Link("25 GbE", 3.125e9, 25e-6, 0.8),
        matrix_efficiency=((1.0, 0.6), (0.0, 0.3)), overlap=True,
        source="Intel Xeon 8480+ specifications (arithmetic); pytorch/gloo#21")


#: The presets by name: what ``dtflab.plan(..., hardware=NAME)`` takes.
PRESETS = {"a100": a100_node, "h100": h100_node, "tpu-v5e": tpu_v5e_slice, "cpu": cpu_cluster}


def preset(name: str) -> Hardware:
    """The preset ``name``: one line naming the choices where it is not one."""
    if name not in PRESETS:
        raise ValueError(f"hardware={name!r}: not a known hardware; choose one of "
                         f"{', '.join(repr(n) for n in (HERE, *PRESETS))} "
                         f"({HERE!r} measures this cluster), or pass a Hardware")
    return PRESETS[name]()


def with_memory(hardware: Hardware, memory_bytes: float) -> Hardware:
    """``hardware`` with another memory size a device (a smaller budget to plan against)."""
    return replace(hardware, memory_bytes=memory_bytes)
