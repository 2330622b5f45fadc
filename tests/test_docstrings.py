"""Every docstring example (``In [1]: ...``, the form the API reference shows) still matches the
code: a magic's line parses with that magic's own parser, Python is valid Python, and every
dtflab name it calls exists and accepts the arguments it is given. Nothing is run: the
examples start clusters and train models."""

import ast
import functools
import importlib
import inspect
import pkgutil
import re

import pytest

import dtflab
from dtflab import exercises, magics

PROMPT = re.compile(r"^\s*In \[\d+\]: ?(.*)$")
MORE = re.compile(r"^\s*\.\.\.: ?(.*)$")
#: What an example's usual variable names hold, where the example does not assign them.
CONVENTIONAL = {"cluster": "dtflab.cluster.base.Cluster", "step": "dtflab.tracing.step.StepTrace",
                "plan": "dtflab.placement.plan.PlacementPlan", "train": "dtflab.train",
                "dtflab": "dtflab", "editor": "dtflab.ui.placement_editor.PlacementEditor",
                "wire": "dtflab.train.machinery.callbacks.WireBytes", "runner": "dtflab.train.machinery.runner.Runner"}


def _load(dotted: str):
    module, _, name = dotted.rpartition(".")
    try:
        return importlib.import_module(dotted)
    except ImportError:
        return getattr(importlib.import_module(module), name)


def docstrings() -> list[tuple[str, str]]:
    """``(where, text)`` for the docstring of every module, class and function of dtflab."""
    found = []
    for name in ["dtflab"] + [m.name for m in pkgutil.walk_packages(dtflab.__path__, "dtflab.")]:
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    found.append((f"{name}:{getattr(node, 'name', '')}", doc))
    return found


def examples() -> list[tuple[str, str]]:
    """``(where, code)`` for every example in every docstring of dtflab."""
    found = []
    for where, doc in docstrings():
        current = None
        for line in doc.splitlines():
            prompt, more = PROMPT.match(line), MORE.match(line)
            if prompt:
                current = [prompt.group(1)]
                found.append((where, current))
            elif more and current is not None:
                current.append(more.group(1))
            else:
                current = None
    return [(where, "\n".join(lines)) for where, lines in found]


EXAMPLES = examples()


def magic_parses(code: str) -> None:
    first, _, _ = code.partition("\n")
    name, _, line = first.lstrip("%").partition(" ")
    tokens = magics._split(line)
    if name == "load_ext":
        assert callable(importlib.import_module(line.strip()).load_ipython_extension)
    elif name == "dtf_cluster" and tokens[:1] == ["run"]:
        magics.run_parser("%dtf_cluster run", with_script=True).parse_args(tokens[1:])
    elif name == "dtf_cluster":
        args = magics.ClusterMagics.dtf_cluster.parser.parse_args(tokens)
        assert args.command in magics.COMMANDS, code
    elif name == "dtf_run":
        magics.run_parser("%%dtf_run", with_script=False).parse_args(tokens)
    elif name == "dtf_trace":
        magics.TraceMagics.dtf_trace.parser.parse_args(tokens)
    elif name == "dtf_tensorboard":  # one folder, or none
        assert "dtf_tensorboard" in inspect.getsource(magics.register) and len(tokens) <= 1, code
    elif name == "dtf_solution":
        assert hasattr(exercises.SolutionMagics, "dtf_solution") and not tokens, code  # takes nothing
    elif name in ("dtf_workers", "dtf_px", "dtf_pull", "dtf_autopx"):
        from dtflab.ui import workers

        assert hasattr(workers.WorkersMagics, name), code
        tokens = workers._words(line)
        if name == "dtf_workers":
            assert tokens[0] in workers.COMMANDS, code
            if tokens[0] == "start":
                workers.start_arguments(tokens[1:])
        targets = {"dtf_px": tokens, "dtf_pull": tokens[-1:] if len(tokens) == 2 else []}
        assert all(workers.TARGETS.fullmatch(t) for t in targets.get(name, [])), code
        assert name != "dtf_autopx" or not tokens, code
    else:
        raise AssertionError(f"no magic %{name}")


def called(tree: ast.AST, names: dict, instances: set) -> list[tuple[str, object, ast.Call]]:
    """Each call whose callee resolves to a dtflab object: ``(text, object, call)``; a method of
    one of ``instances`` (names that hold an instance of their class) comes bound."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain, target = [], node.func
        while isinstance(target, ast.Attribute):
            chain.append(target.attr)
            target = target.value
        if not isinstance(target, ast.Name) or target.id not in names:
            continue
        obj, bound = names[target.id], target.id in instances
        for depth, attribute in enumerate(reversed(chain)):
            if bound and depth == 0 and not hasattr(obj, attribute):
                # an attribute the instance sets itself: known to exist, not what it holds
                assert f"self.{attribute} =" in inspect.getsource(obj), \
                    f"{target.id}.{attribute}: {obj.__name__} has no {attribute!r}"
                obj = None
                break
            assert hasattr(obj, attribute), f"{target.id}.{'.'.join(reversed(chain))}: no {attribute!r}"
            obj = getattr(obj, attribute)
        if obj is None:
            continue
        if bound and len(chain) == 1 and inspect.isfunction(obj):
            obj = functools.partial(obj, None)  # self
        found.append((ast.unparse(node.func), obj, node))
    return found


def test_there_are_examples_of_every_kind():
    kinds = {code.lstrip()[:2] for _, code in EXAMPLES}
    assert len(EXAMPLES) >= 40 and {"%d", "%%"} <= kinds


@pytest.mark.parametrize("where, code", EXAMPLES, ids=[f"{w}:{c[:40]}" for w, c in EXAMPLES])
def test_a_docstring_example_matches_the_code(where, code):
    if code.startswith("%"):
        magic_parses(code)
        if not code.startswith("%%"):
            return
        code = code.partition("\n")[2]
    tree = ast.parse(code)  # SyntaxError: the example is no longer Python
    module = importlib.import_module(where.partition(":")[0])
    assigned = {t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.With, ast.For))
                for t in ast.walk(node) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
    names = {name: _load(path) for name, path in CONVENTIONAL.items() if name not in assigned}
    names.update({name: getattr(module, name) for node in ast.walk(tree)
                  if isinstance(node, ast.Name) and node.id not in names and node.id not in assigned
                  and hasattr(module, (name := node.id)) and getattr(module, name).__class__.__module__ != "builtins"
                  and (getattr(getattr(module, name), "__module__", "") or "").startswith("dtflab")})
    instances = {name for name in CONVENTIONAL if name in names and inspect.isclass(names[name])}
    for text, obj, call in called(tree, names, instances):
        if not callable(obj) or isinstance(obj, type(dtflab)):
            continue
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        positional = [None] * sum(not isinstance(a, ast.Starred) for a in call.args)
        keywords = {k.arg: None for k in call.keywords if k.arg is not None}
        try:
            signature.bind(*positional, **keywords)
        except TypeError as exc:
            raise AssertionError(f"{where}: {text}(...) no longer fits {text}{signature}: {exc}") from None


def _sphinx_roles_as_plain_text() -> None:
    """Sphinx's cross-reference roles (``:class:``, ``:func:``...) as plain literals, so that
    docutils alone reads a docstring as autodoc would."""
    from docutils.parsers.rst import roles

    def literal(name, rawtext, text, lineno, inliner, options=None, content=None):
        from docutils import nodes
        return [nodes.literal(rawtext, text)], []

    for name in ("class", "func", "meth", "mod", "attr", "data", "exc", "obj", "doc", "ref",
                 "py:class", "py:func", "py:meth", "py:mod", "py:attr", "py:obj"):
        roles.register_local_role(name, literal)


def test_every_docstring_is_valid_restructured_text():
    """What the site's build (``sphinx -W``, the docs tier, at the run's end) would refuse,
    found in seconds: a docstring docutils warns about (an unindent, an unclosed literal)."""
    import io
    import os
    import runpy

    import docutils.core

    conf = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "docs", "conf.py"))
    _sphinx_roles_as_plain_text()
    bad = []
    for where, doc in docstrings():
        lines = doc.splitlines()
        conf["ipython_examples"](None, "", where, None, {}, lines)  # as the site shows them
        warnings = io.StringIO()
        docutils.core.publish_doctree("\n".join(lines), settings_overrides={
            "report_level": 2, "halt_level": 5, "warning_stream": warnings})
        if warnings.getvalue():
            bad.append(f"{where}: {warnings.getvalue().strip()}")
    assert not bad, "\n".join(bad)
