"""Math on the site as MathML, written at build time (latex2mathml): browsers draw it natively, so
a page needs no script and no network to show a formula (MathJax would load from a CDN).

LaTeX that latex2mathml cannot read fails the build with the formula named (``sphinx -W``), rather
than reaching a reader as typed."""

from __future__ import annotations

from docutils import nodes
from latex2mathml.converter import convert
from sphinx.errors import ExtensionError


def mathml(latex: str, display: str) -> str:
    """``latex`` as a ``<math>`` element, ``display`` "inline" or "block"."""
    try:
        return convert(latex.strip(), display=display)
    except Exception as error:  # latex2mathml raises its own exceptions, one per kind of fault
        raise ExtensionError(f"cannot write {latex.strip()!r} as MathML: {error}; use the LaTeX "
                             f"that latex2mathml reads (\\frac, \\text, \\left ... \\right, ...)") from error


def visit_inline(translator, node) -> None:
    translator.body.append(f'<span class="math">{mathml(node.astext(), "inline")}</span>')
    raise nodes.SkipNode


def visit_block(translator, node) -> None:
    translator.body.append(f'<div class="math notranslate">{mathml(node.astext(), "block")}</div>\n')
    raise nodes.SkipNode


def setup(app):
    app.add_html_math_renderer("mathml", (visit_inline, None), (visit_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
