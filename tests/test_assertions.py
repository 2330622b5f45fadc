"""Every assertion in the tests can fail. Read with ``ast``, no test module asserts

- ``X is not None`` where X is a call, or comes from a call in the statement right before
  (the call could only raise);
- a value ``==`` (or ``pytest.approx``) the very expression that made it, or two sides that
  are the same expression;
- ``X in choices`` where X is what a call returned when given those same choices;

unless a comment containing ``meant:`` on the assertion's lines or the line before says why.
Nothing is run."""

import ast
import io
import tokenize
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
MARKER = "meant:"
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
NESTED = FUNCTIONS + (ast.ClassDef, ast.Lambda)
BLOCKS = (ast.stmt, ast.excepthandler, ast.match_case)  # what holds statements


def hollow_assertions(source: str, filename: str) -> list[str]:
    """Each assertion in ``source`` that cannot fail and carries no ``meant:`` comment, as
    ``filename:line: why``."""
    meant = {row for kind, text, (row, _), _, _ in
             tokenize.generate_tokens(io.StringIO(source).readline)
             if kind == tokenize.COMMENT and MARKER in text}
    found = []
    tree = ast.parse(source)
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, FUNCTIONS)]:
        assigned = [s for block in _blocks(scope) for s in block if _target(s)]
        for block in _blocks(scope):
            for before, statement in zip([None] + block, block):
                if not isinstance(statement, ast.Assert):
                    continue
                lines = range(statement.lineno - 1, statement.end_lineno + 1)
                for claim in _claims(statement.test):
                    why = _hollow(claim, before, assigned, statement.lineno)
                    if why and not meant.intersection(lines):
                        found.append(f"{filename}:{statement.lineno}: {why}")
    return found


def _blocks(scope):
    """Each list of statements in ``scope``, leaving out nested functions and classes."""
    todo = [scope]
    while todo:
        node = todo.pop()
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                yield value
            if isinstance(value, list):
                todo += [n for n in value if isinstance(n, BLOCKS) and not isinstance(n, NESTED)]


def _target(statement) -> str | None:
    """The name a plain ``name = value`` statement assigns."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        target = statement.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


def _claims(test):
    """The parts of ``a and b and ...``, each a claim of its own."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        for value in test.values:
            yield from _claims(value)
    else:
        yield test


def _hollow(claim, before, assigned, line) -> str | None:
    """Why ``claim`` cannot fail, or None."""
    if not isinstance(claim, ast.Compare):
        return None
    sides = [claim.left, *claim.comparators]
    for op, left, right in zip(claim.ops, sides, sides[1:]):
        if isinstance(op, ast.IsNot) and _is_none(right) and _call(left, before):
            return f"'{ast.unparse(left)} is not None' after a call that can only raise"
        if isinstance(op, ast.Eq):
            left, right = _unwrap(left), _unwrap(right)
            if (_same(left, right) or _same(_made(left, assigned, line), right)
                    or _same(_made(right, assigned, line), left)):
                return (f"'{ast.unparse(claim)}' compares a value with the expression that "
                        f"made it")
        if isinstance(op, ast.In):
            call = _call(left, before)
            if call and any(_same(right, given) for given in
                            call.args + [k.value for k in call.keywords]):
                return (f"'{ast.unparse(claim)}': a call's answer among the very choices it "
                        f"was given")
    return None


def _call(expression, before) -> ast.Call | None:
    """The call ``expression`` comes from: one in it, or the one the statement ``before``
    assigned to its name."""
    node = expression
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Call):
            return node
        node = node.value
    if (isinstance(node, ast.Name) and before is not None and _target(before) == node.id
            and isinstance(before.value, ast.Call)):
        return before.value
    return None


def _made(expression, assigned, line):
    """The value last assigned before ``line`` to ``expression``, where that is a name."""
    if not isinstance(expression, ast.Name):
        return None
    values = [s.value for s in assigned if _target(s) == expression.id and s.lineno < line]
    return max(values, key=lambda value: value.lineno) if values else None


def _is_none(expression) -> bool:
    """Whether ``expression`` is the literal ``None``."""
    return isinstance(expression, ast.Constant) and expression.value is None


def _unwrap(expression):
    """What ``pytest.approx(x)`` compares: ``x``."""
    if (isinstance(expression, ast.Call) and expression.args
            and ast.unparse(expression.func) in ("pytest.approx", "approx")):
        return expression.args[0]
    return expression


def _same(a, b) -> bool:
    """Whether two expressions read the same (a tuple and a list of the same items alike)."""
    if a is None or b is None:
        return False
    if all(isinstance(e, (ast.Tuple, ast.List, ast.Set)) for e in (a, b)):
        return [ast.dump(e) for e in a.elts] == [ast.dump(e) for e in b.elts]
    return ast.dump(a) == ast.dump(b)


@pytest.mark.parametrize("module", sorted(TESTS.rglob("test_*.py")), ids=lambda path: path.name)
def test_no_assertion_in_a_test_module_is_one_that_cannot_fail(module):
    """The repository's own test modules pass the checker."""
    name = module.relative_to(TESTS.parent).as_posix()
    assert hollow_assertions(module.read_text(), name) == []


RAISES, MADE, GIVEN = "a call that can only raise", "the expression that made it", "choices"


@pytest.mark.parametrize("source, line, why", [
    ("thing = make()\nassert thing is not None\n", 2, RAISES),
    ("thing = make()\nassert thing.part is not None\n", 2, RAISES),
    ("assert make().part is not None\n", 1, RAISES),
    ("total = add(1, 2)\nother = 3\nassert total == pytest.approx(add(1, 2))\n", 3, MADE),
    ("assert f(x) == f(x)\n", 1, MADE),
    ("assert ready and best((1, 4, 8)) in (1, 4, 8)\n", 1, GIVEN),
    ("best = pick([1, 2], key=k)\nassert best in (1, 2)\n", 2, GIVEN),
], ids=["name-from-a-call", "attribute-of-it", "on-a-call", "value-and-its-maker",
        "same-both-sides", "choice-given", "choice-given-the-line-before"])
def test_each_hollow_kind_is_reported_naming_its_file_and_line(source, line, why):
    """Each kind of hollow assertion, inside a test function, is named with its line."""
    body = "".join(f"    {row}\n" for row in source.splitlines())
    (found,) = hollow_assertions(f"def test():\n{body}", "tests/test_x.py")
    assert found.startswith(f"tests/test_x.py:{line + 1}: ") and why in found, found


def test_assertions_that_can_fail_or_are_marked_meant_are_not_reported():
    """Checks of a value, and a marked hollow one, pass."""
    source = (
        "def test():\n"
        "    thing = make()\n"
        "    assert thing.size == 3\n"
        "    total = add(1, 2)\n"
        "    assert total == pytest.approx(add(2, 1)) and total == 3\n"
        "    best = pick((1, 4, 8))\n"
        "    assert best in (4, 8)\n"
        "    # meant: only that the import works\n"
        "    assert make() is not None\n"
        "    assert make() is None  # a call can return None\n")
    assert hollow_assertions(source, "tests/test_x.py") == []
