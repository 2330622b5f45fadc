"""A stage's backward split in two, as the zero-bubble schedules run it (Qi et al. 2023): ``B``,
the gradient of the stage's input and everything it needs (the worker before waits for it), and
``W``, the gradients of the stage's weights (nobody waits for it).

``tf.gradients`` builds both in one graph; this module sorts the ops it built. An op is ``W`` if
only the weights' gradients need it, not the input's gradient nor the gradient of any other
tensor the stage's weights meet (a layer's input, where ``x @ w`` uses w): for ``y = x @ w``,
``dw = x^T dy`` is ``W`` and ``dx = dy w^T`` and everything before it is ``B``. Nothing is
computed twice. Which op is which is read from the graph, not from op names, so the split holds
for any model a stage runs (an MLP's layers, a transformer's blocks, recomputation, 16 bits).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Op types that hold or read a variable: what a weight is made of.
_VARIABLE_OPS = {"VarHandleOp", "ReadVariableOp", "VariableV2", "Variable"}


@dataclass
class Split:
    """The ops of one stage's backward of one micro-batch, sorted: ``weight_ops`` run as ``W``,
    ``input_ops`` as ``B``; ``input_ends`` are the ``B`` ops nothing else in ``B`` waits for,
    ``weight_starts`` the ``W`` ops that wait on nothing in ``W``."""

    input_ops: set
    weight_ops: set
    input_ends: list
    weight_starts: list


def weight_consumers(forward_ops) -> list:
    """The tensors where a stage's forward meets its weights: each floating-point input of an
    op that also takes a weight (a tensor made of variables alone, such as a variable's read or
    its 16-bit cast) and is not itself a weight."""
    made_of: dict = {}  # op name -> (depends on a variable, depends on anything else)

    def kinds(op) -> tuple[bool, bool]:
        stack = [op]
        while stack:  # depth first, without recursion: a transformer's graph is deep
            top = stack[-1]
            if top.name in made_of:
                stack.pop()
                continue
            waiting = [t.op for t in top.inputs if t.op.name not in made_of]
            if waiting and top.type not in _VARIABLE_OPS:
                stack += waiting
                continue
            stack.pop()
            if top.type in _VARIABLE_OPS:
                made_of[top.name] = (True, False)
            elif not top.inputs:
                made_of[top.name] = (False, top.type != "Const")
            else:
                parts = [made_of[t.op.name] for t in top.inputs]
                made_of[top.name] = (any(v for v, _ in parts), any(d for _, d in parts))
        return made_of[op.name]

    met, names = [], set()
    for op in forward_ops:
        if not any(kinds(t.op) == (True, False) for t in op.inputs):
            continue
        for t in op.inputs:
            if kinds(t.op)[1] and t.dtype.is_floating and t.name not in names:
                met.append(t)
                names.add(t.name)
    return met


def split(scope_ops, weight_gradients, activation_gradients, input_gradient=None) -> Split:
    """Sort ``scope_ops`` (the ops ``tf.gradients`` built for one backward): ``W`` is what the
    ``weight_gradients`` need and none of the ``activation_gradients`` (the gradients of
    :func:`weight_consumers`' tensors, and ``input_gradient``) need; ``B`` is what the
    ``input_gradient`` and the ``W`` ops need that is not ``W``."""
    inside = set(scope_ops)
    weight_side = _ancestors([g.op for g in weight_gradients if g is not None], inside)
    activation_side = _ancestors([g.op for g in activation_gradients if g is not None], inside)
    weight_ops = weight_side - activation_side
    fed = [t.op for op in weight_ops for t in op.inputs if t.op in inside - weight_ops]
    fed += [c for op in weight_ops for c in op.control_inputs if c in inside - weight_ops]
    if input_gradient is not None:
        fed.append(input_gradient.op)
    input_ops = _ancestors(fed, inside) - weight_ops
    return Split(input_ops, weight_ops, _ends(input_ops), _starts(weight_ops))


def _ancestors(ops, inside: set) -> set:
    """``ops`` and every op of ``inside`` they depend on (data or control), through ``inside``
    only."""
    seen, stack = set(), [op for op in ops if op in inside]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack += [t.op for t in op.inputs if t.op in inside]
        stack += [c for c in op.control_inputs if c in inside]
    return seen


def _ends(ops: set) -> list:
    """The ops of ``ops`` that no other op of ``ops`` takes an input from."""
    used = {t.op for op in ops for t in op.inputs} | {c for op in ops for c in op.control_inputs}
    return sorted((op for op in ops if op not in used), key=lambda op: op.name)


def _starts(ops: set) -> list:
    """The ops of ``ops`` that take nothing from another op of ``ops``."""
    return sorted((op for op in ops
                   if not any(t.op in ops for t in op.inputs)
                   and not any(c in ops for c in op.control_inputs)), key=lambda op: op.name)
