"""Published training runs the planner is checked against: three papers' and one framework's.

**Korthikanti et al. 2022**, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198): Megatron-LM's GPT on NVIDIA's Selene (DGX A100 80 GB nodes; 8 GPUs a node
on NVLink, HDR InfiniBand between). Their Table 3 gives each model's layout (tensor 8,
pipeline 1 / 8 / 35 / 64, no data parallelism; micro-batch 4 / 1 / 1 / 1; the interleaved
schedule with 3 stages a worker for 175B and 530B; sequence 2,048, vocabulary 51,200, mixed
precision), their Table 5 each one's measured iteration time with full recomputation and with
"present work" (selective recomputation and sequence parallelism, the all-gathers done again
in the backward, section 4.2.2), and section 6.3 one run with 8-way data parallelism. The
Calculon simulator's ``llm-validation`` carries the same eight layouts and times
(calculon-ai/calculon, ``calculon/llm/validation.py`` lines 287-304,
``validation/seqsel/tab5/``) and reproduces them with 3.65% mean and 8.87% worst error; its
predicted memory per GPU is given beside ours (the paper measured none for these runs).
Megatron-LM then kept every score (its fused softmax kernel): plain attention; its embedding
a lookup, as every framework's here.

**Dubey et al. 2024**, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4: Llama 3 405B
on H100s (tensor 8, pipeline 16, data 64 or 128; and context 16 at 131,072 tokens; the
interleaved schedule; 16 M tokens a batch; bfloat16) and each run's TFLOPs a GPU and MFU. The
step measured is the model's FLOPs over that rate (PaLM's count, Chowdhery et al. 2023
Appendix B, which :func:`step_time.model_flops` keeps: the attention's full square). What the
paper does not say is taken as its section 3.3 describes the runs: fused attention, sequence
parallelism with the inputs gathered again in the backward (Megatron's), the embedding a
lookup, the data axis's exchange prefetched under the compute (``overlap``), a micro-batch of
one sequence, 128 blocks (the paper takes one block from the first stage and one from the
last, so the busiest stages hold 8 each, as 128 cut 16 ways do), two virtual stages a worker
(not stated: with four, each prediction is 8-15 points faster). It measured no memory.

**Narayanan et al. 2021**, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM" (SC21, arXiv 2104.04473), Table 1: GPT models of 1.7B to 1T parameters on 32
to 3,072 A100s of Selene (tensor 1 to 8, pipeline 1 to 64, 6 to 32 data ways; sequence 2,048,
vocabulary 51,200, mixed precision float16, full recomputation) and each run's TFLOP/s a GPU,
which counts the recomputed forward (the paper's equation 3, 96·B·s·l·h²·(1 + s/(6h) +
V/(16·l·h))): the step measured is those FLOPs over that rate. Megatron-LM then all-reduced
the gradients after the backward (``megatron/training.py``'s ``train_step`` of 2021: the
``backward-params-all-reduce`` after ``forward_backward_func``): no overlap. What the table
does not say is taken as: a micro-batch of one sequence, the 1F1B schedule.

**MosaicML's llm-foundry** (``scripts/train/benchmarking/README.md``, "H100 80GB BF16"): MPT
models of 760M to 70B parameters under PyTorch FSDP (ZeRO 3 over every GPU), 512 to 65,536
tokens, 8 to 64 GPUs, each row's tokens a second (:data:`MPT_RUNS`). The planner does not yet
meet these: it predicts every one short (the planning guide says what that shows).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dtflab.train.planner import hardware as machines
from dtflab.train.planner import step_time
from dtflab.train.planner.device_memory import PRESETS, Plan, per_device

#: The four models (blocks, d_model, heads), Table 3.
MODELS = {"22B": (48, 6144, 64), "175B": (96, 12288, 96), "530B": (105, 20480, 128),
          "1T": (128, 25600, 160)}


@dataclass(frozen=True)
class Run:
    """One published run: its Plan, the measured iteration time (s), the paper's MFU,
    Calculon's predicted time (s) and memory per GPU (GiB) where it has them, and the
    hardware preset it ran on."""

    name: str
    plan: Plan
    measured_s: float
    mfu: float | None = None
    calculon_s: float | None = None
    calculon_gib: float | None = None
    hardware: str = "a100"
    #: the published model's FLOPs a step, where its Plan's differ (MFU's numerator)
    model_flops: float | None = None


def _plan(model: str, pipeline: int, batch: int, micro_batch: int, chunks: int, mode: str,
          data: int = 1) -> Plan:
    blocks, d, heads = MODELS[model]
    present = mode == "selective + sequence parallel"
    return Plan(blocks=blocks, d_model=d, heads=heads, sequence=2048, vocabulary=51200,
                batch=batch, micro_batches=batch // (data * micro_batch), precision="float16",
                recompute="selective" if present else "full", data=data, tensor=8,
                pipeline=pipeline, chunks=chunks, sequence_parallel=present, regather=present,
                dropout=True, tied=True, schedule="interleaved" if chunks > 1 else "1f1b",
                attention="plain", embedding="lookup")


FULL, PRESENT = "full recomputation", "selective + sequence parallel"

#: Table 5 (times, MFU of the present work), section 6.3 (the 2,240-GPU run), and Calculon's
#: predictions from its llm-validation run (calc_tab5_breakdown; time s, memory GiB).
RUNS = (
    Run("22B, " + FULL, _plan("22B", 1, 4, 4, 1, FULL), 1.42, None, 1.3956, 48.15),
    Run("22B, " + PRESENT, _plan("22B", 1, 4, 4, 1, PRESENT), 1.10, 0.415, 1.1367, 52.08),
    Run("175B, " + FULL, _plan("175B", 8, 64, 1, 3, FULL), 18.13, None, 18.0288, 48.10),
    Run("175B, " + PRESENT, _plan("175B", 8, 64, 1, 3, PRESENT), 13.75, 0.514, 13.6381, 54.07),
    Run("530B, " + FULL, _plan("530B", 35, 280, 1, 3, FULL), 49.05, None, 49.8926, 42.27),
    Run("530B, " + PRESENT, _plan("530B", 35, 280, 1, 3, PRESENT), 37.83, 0.560, 34.4728, 53.54),
    Run("1T, " + FULL, _plan("1T", 64, 512, 1, 1, FULL), 94.42, None, 90.0809, 46.27),
    Run("1T, " + PRESENT, _plan("1T", 64, 512, 1, 1, PRESENT), 71.49, 0.563, 66.0407, 59.15),
    Run("530B on 2,240 GPUs (8 data ways), " + PRESENT,
        _plan("530B", 35, 2240, 1, 3, PRESENT, data=8), 39.15, 0.542),
)


def _llama3(gpus: int, data: int, context: int, sequence: int, tflops: float,
            mfu: float) -> Run:
    """A row of Dubey et al. 2024's Table 4: 16 M tokens a batch, one sequence a micro-batch;
    the step measured from the paper's TFLOPs a GPU on the model as published (126 blocks)."""
    batch = 2 ** 24 // sequence
    plan = Plan(**PRESETS["Llama 3 405B"] | dict(
        blocks=128, sequence=sequence, batch=batch, micro_batches=batch // data,
        precision="bfloat16", data=data, tensor=8, pipeline=16, context=context,
        chunks=2, schedule="interleaved", sequence_parallel=True, regather=True,
        overlap=True, zero=2, attention="fused", embedding="lookup"))
    flops = step_time.model_flops(dataclasses.replace(plan, blocks=126, pipeline=1, chunks=1,
                                                      schedule="1f1b"))
    return Run(f"Llama 3 405B, {gpus:,} GPUs, {sequence:,} tokens"
               + (f", {context} context ways" if context > 1 else ""),
               plan, flops / (tflops * 1e12 * gpus), mfu, hardware="h100", model_flops=flops)


#: Table 4 (TFLOPs a GPU, MFU).
LLAMA3_RUNS = (
    _llama3(8192, 64, 1, 8192, 430, 0.43),
    _llama3(16384, 128, 1, 8192, 400, 0.41),
    _llama3(16384, 8, 16, 131072, 380, 0.38),
)


def _narayanan(params: str, heads: int, d: int, blocks: int, tensor: int, pipeline: int,
               gpus: int, batch: int, tflops: float) -> Run:
    """A row of Narayanan et al. 2021's Table 1, the step measured from its TFLOP/s a GPU."""
    data = gpus // (tensor * pipeline)
    plan = Plan(blocks=blocks, d_model=d, heads=heads, sequence=2048, vocabulary=51200,
                batch=batch, micro_batches=batch // data, precision="float16",
                recompute="full", data=data, tensor=tensor, pipeline=pipeline, dropout=True,
                tied=True, schedule="1f1b", attention="plain", embedding="lookup")
    s, V = plan.sequence, plan.vocabulary
    flops = 96 * batch * s * blocks * d * d * (1 + s / (6 * d) + V / (16 * blocks * d))
    return Run(f"GPT {params}, {gpus:,} GPUs", plan, flops / (gpus * tflops * 1e12))


#: Table 1: (parameters, heads, d_model, blocks, tensor, pipeline, GPUs, batch, TFLOP/s a GPU)
NARAYANAN_RUNS = tuple(_narayanan(*row) for row in (
    ("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137), ("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    ("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142), ("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    ("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    ("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    ("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    ("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    ("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    ("1T", 160, 25600, 128, 8, 64, 3072, 3072, 163),
))


def check(runs=RUNS) -> list[dict]:
    """Each run predicted on its hardware preset: ``{"run", "gpus", "layout",
    "measured_s", "predicted_s", "error", "calculon_s", "calculon_error", "mfu",
    "predicted_mfu", "memory_gib", "calculon_gib", "parts"}``; an error is predicted over
    measured, less 1."""
    rows = []
    for run in runs:
        hardware = machines.preset(run.hardware)
        parts = step_time.step_seconds(run.plan, hardware)
        seconds = parts["total"]
        rows.append({
            "run": run.name, "gpus": run.plan.devices,
            "layout": f"t{run.plan.tensor} p{run.plan.pipeline} d{run.plan.data}"
                      + (f" c{run.plan.context}" if run.plan.context > 1 else "") + ", "
                      f"micro-batch {run.plan.micro_batch}, v {run.plan.chunks}",
            "measured_s": run.measured_s, "predicted_s": seconds,
            "error": seconds / run.measured_s - 1,
            "calculon_s": run.calculon_s,
            "calculon_error": (None if run.calculon_s is None
                               else run.calculon_s / run.measured_s - 1),
            "mfu": run.mfu,
            "predicted_mfu": step_time.mfu(run.plan, hardware, seconds, run.model_flops),
            "memory_gib": per_device(run.plan)["total"] / 2 ** 30,
            "calculon_gib": run.calculon_gib, "parts": parts})
    return rows


def with_levers(run: Run, **changes) -> Plan:
    """``run``'s Plan with other levers (a what-if on a published layout)."""
    return dataclasses.replace(run.plan, **changes)


#: MosaicML's MPT models (llm-foundry's ``scripts/train/benchmarking/README.md``, "H100 80GB
#: BF16"): (blocks, d_model, heads), GPT's block with biases, learned positions, a tied
#: embedding and a vocabulary of 50,368 (each shape gives the table's parameter count exactly).
MPT_MODELS = {"760m": (24, 1536, 12), "1b": (24, 2048, 16), "3b": (32, 2560, 20),
              "7b": (32, 4096, 32), "13b": (40, 5120, 40), "30b": (48, 7168, 56),
              "70b": (80, 8192, 64)}


def _mpt(model: str, sequence: int, gpus: int, micro_batch: int, accumulation: int,
         batch: int, tokens_per_s: float, checkpointing: bool) -> Run:
    """A row of the table: PyTorch FSDP's FULL_SHARD over every GPU (ZeRO 3), its gathers
    prefetched under the compute, gathers and reductions in bfloat16 (the table's "MP Mode"
    is Composer's ``DEFAULT``, which gathered in the autocast type and, until Composer's
    ``d745fcb`` of 10 October 2023, reduced in it too), fused attention (the benchmark's
    default ``attn_impl`` was ``triton``: a Triton FlashAttention, priced here at the H100
    preset's FlashAttention-2 rate), float32 master weights; the step measured from its tokens
    a second."""
    blocks, d, heads = MPT_MODELS[model]
    plan = Plan(blocks=blocks, d_model=d, heads=heads, sequence=sequence, vocabulary=50368,
                batch=batch, micro_batches=accumulation, precision="bfloat16", data=gpus,
                zero=3, recompute="full" if checkpointing else "none", overlap=True,
                exchange_precision="bfloat16", attention="fused", embedding="lookup", tied=True)
    assert plan.micro_batch == micro_batch, (model, sequence, gpus)
    return Run(f"MPT {model}, {gpus} GPUs, {sequence:,} tokens", plan,
               batch * sequence / tokens_per_s, hardware="h100")


#: (model, sequence, GPUs, micro-batch, accumulation, global batch, tokens/s, checkpointing)
MPT_RUNS = tuple(_mpt(*row) for row in (
    ("70b", 2048, 64, 8, 4, 2048, 66523, True), ("70b", 2048, 32, 2, 16, 1024, 28242, True),
    ("30b", 8192, 8, 1, 21, 168, 11072, True), ("30b", 4096, 8, 1, 21, 168, 14419, True),
    ("30b", 2048, 32, 14, 3, 1344, 73860, True), ("30b", 2048, 16, 10, 3, 480, 36209, True),
    ("30b", 2048, 8, 3, 21, 504, 16022, True), ("30b", 1024, 8, 6, 21, 1008, 16672, True),
    ("13b", 32768, 8, 1, 3, 24, 15812, True), ("13b", 16384, 8, 3, 3, 72, 23881, True),
    ("13b", 4096, 8, 10, 3, 240, 37740, True), ("13b", 2048, 64, 2, 1, 128, 307209, False),
    ("13b", 2048, 32, 2, 1, 64, 153960, False), ("13b", 2048, 16, 2, 1, 32, 76280, False),
    ("13b", 2048, 8, 2, 1, 16, 38336, False), ("13b", 1024, 8, 40, 3, 960, 44019, True),
    ("7b", 65536, 8, 1, 2, 16, 15654, True), ("7b", 32768, 8, 2, 2, 32, 26550, True),
    ("7b", 8192, 8, 8, 2, 128, 55481, True), ("7b", 4096, 8, 16, 2, 256, 68893, True),
    ("7b", 2048, 8, 6, 1, 48, 85144, False), ("7b", 1024, 8, 64, 2, 1024, 81628, True),
    ("3b", 65536, 8, 1, 2, 16, 26099, True), ("3b", 32768, 8, 3, 6, 144, 46984, True),
    ("3b", 16384, 8, 1, 6, 48, 89223, False), ("3b", 8192, 8, 3, 6, 144, 132626, False),
    ("3b", 4096, 8, 5, 6, 240, 167712, False), ("3b", 2048, 64, 6, 3, 1152, 1441663, False),
    ("3b", 2048, 32, 6, 3, 576, 736701, False), ("3b", 2048, 16, 10, 3, 480, 386285, False),
    ("3b", 1024, 8, 20, 6, 960, 216369, False), ("3b", 512, 8, 40, 6, 1920, 223721, False),
    ("1b", 65536, 8, 1, 2, 16, 44050, True), ("1b", 32768, 8, 1, 4, 32, 96203, False),
    ("1b", 16384, 8, 2, 4, 64, 157194, False), ("1b", 8192, 8, 3, 4, 96, 233256, False),
    ("1b", 4096, 8, 7, 4, 224, 308282, False), ("1b", 2048, 64, 20, 1, 1280, 2841754, False),
    ("1b", 2048, 32, 20, 1, 640, 1444183, False), ("1b", 2048, 16, 20, 1, 320, 736596, False),
    ("1b", 2048, 8, 14, 1, 112, 363645, False), ("1b", 1024, 8, 18, 4, 576, 391287, False),
    ("1b", 512, 8, 56, 4, 1792, 418201, False), ("760m", 32768, 8, 1, 2, 16, 130333, False),
    ("760m", 16384, 8, 3, 2, 48, 222521, False), ("760m", 8192, 8, 6, 2, 96, 334602, False),
    ("760m", 4096, 8, 12, 2, 192, 443674, False), ("760m", 2048, 32, 24, 1, 768, 2175091, False),
    ("760m", 2048, 16, 24, 1, 384, 1096819, False), ("760m", 2048, 8, 24, 2, 384, 505177, False),
    ("760m", 1024, 8, 48, 2, 768, 628648, False), ("760m", 512, 8, 96, 2, 1536, 669998, False),
))
