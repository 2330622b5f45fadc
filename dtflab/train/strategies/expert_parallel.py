"""Expert parallelism with data parallelism (GShard, Switch): a mixture-of-experts transformer
(``train.transformer(experts=E)``, ``problems.experts``) over w worker tasks, each holding E / w
of every block's experts and its slice of the batch.

Each worker runs its slice through its own copy of everything but the experts (the embeddings,
attention, LayerNorms, the router), routes its tokens, and sends each expert the tokens it took
(**dispatch**, an all-to-all: the tokens for worker j's experts go to worker j); each expert
runs on the tokens every worker sent it, one matrix multiply, and sends each worker its outputs
back (**combine**, the second all-to-all), where they are weighted by the router's gates and
added to the residual stream (with ``pad_to_capacity``, every worker sends every expert its
capacity's rows, whatever the routing). Shared experts (``shared_experts=``) are copied like the
attention: each worker runs them on its own tokens, nothing crosses for them but their
gradients' sum. Backward, the same two all-to-alls carry the gradients. The
copies' gradients are summed over the workers (all pairs, as ``train.combined``'s data axis);
an expert's gradient stays where the expert is.

Capacity is counted per sequence, so the routing is the one process's (``train.single`` on the
same problem) and so are the losses. What crosses depends on the routing: the formula
(:func:`dtflab.train.formulas.split_bytes.expert_parallel_bytes`) takes the step's tokens per worker
and expert, which ``history.details["per_step"]["routed"]`` holds, step by step.

Ops are named ``block{b}/experts_on_worker{j}/expert{e}/...`` (an expert's work, on its worker)
and ``worker{w}/...`` (the rest of worker w's), so a traced step shows who was busy.
"""

from __future__ import annotations

from dtflab import names
from dtflab._quiet import import_tf
from dtflab.train.layouts.layout import Layout, said_as
from dtflab.train.layouts.tasks import enough_workers, worker_devices
from dtflab.train.problems import Transformer, experts as moe
from dtflab.train.problems.transformer_block import norm_weights
from dtflab.train.machinery.graphs import TrainGraph, straggler
from dtflab.train.machinery.options import RunOptions, takes_options
from dtflab.train.machinery.sessions import train_graph

#: The variables each expert's worker holds alone; every other variable is copied.
EXPERT_PARTS = ("experts_fc_w", "experts_fc_b", "experts_out_w", "experts_out_b")


def expert_graph(problem, devices, seed: int, slow: dict | None = None) -> TrainGraph:
    """The training step over ``devices``, worker 0 first (see the module's docstring)."""
    tf = import_tf()
    slow, home, W, E = slow or {}, devices[0], len(devices), problem.experts
    mine, per, d = E // W, problem.batch_size // W, problem.d_model
    initial = dict(problem.initial_values(seed))
    expert = {name for name in initial if name.split("_", 1)[-1] in EXPERT_PARTS}
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(home):
            x, t = problem.placeholders()
        copies = [{} for _ in devices]  # worker -> {name: its copy}
        held = {}  # (block, part) -> [worker j's slice of its experts]
        for w, device in enumerate(devices):
            with tf.device(device), tf.compat.v1.variable_scope(f"worker{w}"):
                for name, value in initial.items():
                    if name in expert:
                        block, part = name.split("_", 1)
                        held.setdefault((block, part), []).append(tf.compat.v1.get_variable(
                            name, initializer=value[w * mine:(w + 1) * mine]))
                    else:
                        copies[w][name] = tf.compat.v1.get_variable(name, initializer=value)
        view = [{name: problem.compute_view(v) for name, v in copy.items()} for copy in copies]
        h, targets, routed, gates, flat, balances = {}, {}, {}, {}, {}, {w: [] for w in range(W)}
        always = {}  # worker -> its shared experts' output, on its own tokens
        for w, device in enumerate(devices):
            with tf.device(home), tf.name_scope(f"batch_for_worker{w}"):
                sliced = [ids[w * per:(w + 1) * per] for ids in (x, t)]
            with tf.device(device), tf.name_scope(f"worker{w}/embedding"):
                with tf.control_dependencies(straggler(slow, device)):
                    tokens, targets[w] = (tf.identity(ids) for ids in sliced)
                h[w] = problem.stage_forward([copies[w][n] for n in problem.stage_parameters(1, 0)],
                                             tokens, 1, 0)
        loads = []
        for b in range(1, problem.blocks + 1):
            for w, device in enumerate(devices):
                c = {name[len(f"h{b}_"):]: v for name, v in view[w].items()
                     if name.startswith(f"h{b}_")}
                with tf.device(device), tf.name_scope(f"worker{w}/block{b}"):
                    a = problem.normalise(tf, norm_weights(problem, c, "ln1"), h[w], "ln1")
                    h[w] += problem.attention(tf, a, c["qkv_w"], c["qkv_b"], c["proj_w"], c["proj_b"])
                    m = problem.normalise(tf, norm_weights(problem, c, "ln2"), h[w], "ln2")
                    always[w] = moe.shared(tf, problem, m, c)
                    weight, routed[w], balance, _ = moe.route(tf, problem, m, c["router_w"],
                                                               c["router_b"])
                    balances[w].append(balance)
                    flat[w], gates[w] = tf.reshape(m, [-1, d]), tf.reshape(weight, [-1, E])
            outputs = {w: tf.zeros_like(flat[w]) for w in range(W)}
            split = {}  # (owner, part) -> that worker's experts one by one: one unstack, whose
            # gradient is one stack (indexing each expert made a full-size gradient per expert)
            for e in range(E):
                owner, local = divmod(e, mine)
                sent, index, taken = [], {}, {}
                for w, device in enumerate(devices):
                    with tf.device(device), tf.name_scope(f"worker{w}/block{b}/dispatch{e}"):
                        index[w], taken[w] = moe.dispatched(tf, problem, routed[w], gates[w], e,
                                                            per)
                        sent.append(tf.gather(flat[w], index[w]))
                with tf.device(devices[owner]):
                    with tf.name_scope(f"block{b}/experts_on_worker{owner}/expert{e}"):
                        for part in EXPERT_PARTS:
                            if (owner, part) not in split:
                                split[owner, part] = tf.unstack(
                                    problem.compute_view(held[f"h{b}", part][owner]))
                        weights = [split[owner, part][local] for part in EXPERT_PARTS]
                        y = moe.expert_mlp(tf, problem, tf.concat(sent, axis=0), *weights)
                        back = tf.split(y, tf.stack([tf.shape(s)[0] for s in sent]), num=W)
                for w, device in enumerate(devices):
                    with tf.device(device), tf.name_scope(f"worker{w}/block{b}/combine{e}"):
                        outputs[w] += tf.scatter_nd(index[w][:, None], back[w] * taken[w][:, None],
                                                    tf.shape(flat[w], out_type=tf.int64))
            counted = []
            for w, device in enumerate(devices):
                with tf.device(device):
                    h[w] += tf.reshape(outputs[w], tf.shape(h[w]))
                    if always[w] is not None:
                        h[w] += always[w]
                    counted.append(tf.reduce_sum(routed[w], axis=[0, 1]))
            with tf.device(home):
                loads.append(tf.stack(counted))
        losses = []
        for w, device in enumerate(devices):
            with tf.device(device), tf.name_scope(f"worker{w}/output"):
                output = [copies[w][n] for n in problem.stage_parameters(problem.blocks + 1,
                                                                         problem.blocks)]
                logits = problem.stage_forward(output, h[w], problem.blocks + 1, problem.blocks)
                losses.append(problem.loss(logits, targets[w])
                              + problem.balance * tf.add_n(balances[w]))
        with tf.device(home):
            loss = tf.add_n(losses, name="loss")
        train = _applied(tf, problem, loss, copies, held)
        init = tf.compat.v1.global_variables_initializer()
        with tf.device(home):
            routed_by = tf.stack(loads)  # [blocks, workers, experts]
            reports = {"routed": routed_by, "tokens_per_expert": tf.reduce_sum(routed_by, 1)}
    variables = [v for copy in copies for v in copy.values()] + [
        v for slices in held.values() for v in slices]
    return TrainGraph(graph, init, train, loss, (x, t), variables=variables, reports=reports)


def _applied(tf, problem, loss, copies, held):
    """Adam on every variable: each copy with its gradient summed over the workers' copies,
    each expert with its own."""
    W = len(copies)
    order = list(copies[0])
    every = [copies[w][name] for w in range(W) for name in order]
    experts = [v for slices in held.values() for v in slices]
    gradients = tf.compat.v1.gradients(loss, every + experts, colocate_gradients_with_ops=True)
    by = dict(zip(((w, name) for w in range(W) for name in order), gradients))
    pairs = []
    for w in range(W):
        for name in order:
            variable = copies[w][name]
            with tf.device(variable.device), tf.name_scope(f"worker{w}/data_sum"):
                pairs.append((tf.add_n([by[u, name] for u in range(W)]) if W > 1 else by[w, name],
                              variable))
    pairs += list(zip(gradients[len(every):], experts))
    return problem.optimizer().apply_gradients(pairs)


@takes_options(RunOptions)
def expert_parallel(problem, cluster, *, workers: int | None = None,
                    layout: Layout | None = None, **options):
    """Train ``problem`` (a ``Transformer`` with ``experts=E``) with its experts spread over
    ``workers`` worker tasks, each with its slice of the batch (see the module's docstring).

    In [1]: problem = train.transformer(experts=4, top_k=2, skew=3.0)
    In [2]: run = train.expert_parallel(problem, cluster, workers=2, trace_step=5)
    In [3]: run.details["per_step"]["tokens_per_expert"][-1]   # per block, per expert

    ``layout=train.Layout(data=w, expert=w)`` says the same as ``workers=w`` (2 when left out):
    each worker a data replica holding its share of the experts. The losses are
    ``train.single``'s up to float rounding.
    """
    options = RunOptions(**options).checked()
    if not isinstance(problem, Transformer) or not problem.experts:
        raise ValueError(f"expert_parallel: {problem.name} has no experts; use "
                         f"train.transformer(experts=4, ...)")
    with said_as(layout is not None, data="workers", expert="workers"):
        layout = Layout.given(layout, "expert_parallel", {"data": 2, "expert": 2},
                              data=workers, expert=workers)
        workers = layout.alone("data", "expert_parallel")
        if layout.expert != workers:
            raise ValueError(f"expert={layout.expert}: expert_parallel spreads the experts over "
                             f"every data way; use train.Layout(data={workers}, "
                             f"expert={workers})")
        layout.without("expert_parallel", micro_batches="runs the whole batch at once",
                       schedule="has no pipeline", zero="keeps whole copies").fits(problem)
    enough_workers(cluster, workers, "workers", "each expert group runs on a worker task")
    devices, slow_devices = worker_devices(cluster, workers, options.slow)
    built = expert_graph(problem, tuple(devices), options.seed, slow_devices)
    return train_graph("expert_parallel", f"expert parallel ({workers} workers)", built,
                       devices[0], problem, cluster, options, details={
                           "workers": [names.task(device) for device in devices],
                           "layout": layout})
