"""The documentation site: it builds with warnings as errors, its API reference documents every
public module and every name a notebook uses, and it renders every tutorial with its outputs."""

import importlib
import pkgutil
import posixpath
import re
from pathlib import Path

import pytest
from tutorials import NOTEBOOKS, name

import dtflab

pytestmark = [pytest.mark.docs, pytest.mark.slow, pytest.mark.timeout(3000)]

#: A public name in a notebook's code: dtflab.X, train.X (dtflab.train, not tf's), exercises.X.
USED = re.compile(r"(?<![\w.])(dtflab|train|exercises)\.(\w+)")
IMPORTED = re.compile(r"^\s*from (dtflab(?:\.train)?) import \(?([\w, ]+)", re.M)
MAGIC = re.compile(r"^\s*%%?(dtf_\w+)", re.M)
MAGIC_CLASSES = {"dtf_cluster": ("dtflab.magics", "ClusterMagics"), "dtf_run": ("dtflab.magics", "RunMagics"),
                 "dtf_trace": ("dtflab.magics", "TraceMagics"),
                 "dtf_solution": ("dtflab.exercises", "SolutionMagics"),
                 **{magic: ("dtflab.ui.workers", "WorkersMagics")
                    for magic in ("dtf_workers", "dtf_px", "dtf_pull", "dtf_autopx")}}


def inventory(site: str) -> set[str]:
    """Every object the site documents, by full name (Sphinx's objects.inv)."""
    from sphinx.util.inventory import InventoryFile

    with open(Path(site) / "objects.inv", "rb") as stream:
        data = InventoryFile.load(stream, "", posixpath.join)
    return {name for role, entries in data.items() if role.startswith("py:") for name in entries}


def documented_as(obj) -> str:
    """Where the reference documents ``obj``: the module that defines it."""
    if isinstance(obj, type(dtflab)):
        return obj.__name__
    return f"{obj.__module__}.{obj.__qualname__}"


def names_notebooks_use() -> dict[str, object]:
    spaces = {"dtflab": dtflab, "dtflab.train": dtflab.train, "train": dtflab.train,
              "exercises": importlib.import_module("dtflab.exercises")}
    found = {}
    for path in NOTEBOOKS:
        code = "\n".join(cell.source if isinstance(cell.source, str) else "".join(cell.source)
                         for cell in _cells(path) if cell.cell_type == "code")
        for space, attribute in USED.findall(code):
            found[f"{space}.{attribute}"] = getattr(spaces[space], attribute)
        for space, names in IMPORTED.findall(code):
            for attribute in filter(None, (n.strip() for n in names.split(","))):
                found[f"{space}.{attribute}"] = _imported(spaces[space], attribute)
        for magic in MAGIC.findall(code):
            module, owner = MAGIC_CLASSES[magic]
            found[f"%{magic}"] = getattr(getattr(importlib.import_module(module), owner), magic)
    return found


def _imported(space, attribute):
    """What ``from space import attribute`` gives: a name of the module, or its submodule."""
    try:
        return getattr(space, attribute)
    except AttributeError:
        return importlib.import_module(f"{space.__name__}.{attribute}")


def _cells(path):
    import nbformat

    return nbformat.read(path, as_version=4).cells


def test_the_site_builds_with_warnings_as_errors(built_site):
    site, log = built_site
    assert (Path(site) / "index.html").exists()
    assert not re.search(r"(WARNING|ERROR):", log), log[-4000:]  # Sphinx's; a kernel's "WARNING |" is not


def test_every_public_module_has_a_page_in_the_api_reference(built_site):
    modules = {info.name for info in pkgutil.walk_packages(dtflab.__path__, "dtflab.")
               if not any(part.startswith("_") for part in info.name.split("."))}
    assert sorted((modules | {"dtflab"}) - inventory(built_site[0])) == []


def test_every_public_name_a_notebook_uses_is_in_the_api_reference(built_site):
    used = names_notebooks_use()
    assert {"dtflab.start_cluster", "train.sync_data_parallel", "%dtf_cluster"} <= set(used)
    documented = inventory(built_site[0])
    missing = {name: documented_as(obj) for name, obj in used.items()
               if documented_as(obj) not in documented}
    assert missing == {}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=name)
def test_every_tutorial_is_rendered_with_its_outputs(built_site, path):
    edition = "ja" if path.parent.name == "ja" else "en"
    page = Path(built_site[0]) / "tutorials" / edition / f"{path.stem}.html"
    html = page.read_text(encoding="utf-8")
    code_cells = [cell for cell in _cells(path) if cell.cell_type == "code"]
    # most cells print or draw something; a page rendered without its run has no output at all
    assert html.count('class="cell_output') >= len(code_cells) // 2, f"{page}: few outputs"


def visible_text(html: str) -> str:
    """What a page shows as prose: its text without code, scripts, styles and tags."""
    import html as markup

    html = re.sub(r"<(pre|code|script|style|math)\b.*?</\1>", " ", html, flags=re.S)
    return markup.unescape(re.sub(r"<[^>]+>", " ", html))


def test_every_formula_is_mathml_and_no_page_shows_latex_as_typed(built_site):
    site = Path(built_site[0])
    typed = {str(page.relative_to(site)) for page in site.rglob("*.html")
             if re.search(r"\$\$|\\frac|\\text\{", visible_text(page.read_text(encoding="utf-8")))}
    assert typed == set(), f"pages that show LaTeX as typed: {sorted(typed)}"
    block = '<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">'
    for edition in ("en", "ja"):  # notebook 09: the bubble's formula and the step model's
        html = (site / "tutorials" / edition / "09_pipeline_parallelism.html").read_text(encoding="utf-8")
        assert html.count(block) == 2 and "<mfrac>" in html


def test_the_front_page_says_how_to_install_where_to_start_and_shows_a_step(built_site):
    site = Path(built_site[0])
    html = (site / "index.html").read_text(encoding="utf-8")
    text = " ".join(re.sub(r"<[^>]+>", "", html).replace("&amp;", "&").split())
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/dtflab lab" in text
    assert 'href="tutorials/en/00_quickstart.html"' in html  # start here
    assert 'href="tutorials/index.html"' in html and 'href="guide/index.html"' in html
    (picture,) = re.findall(r'<img[^>]*src="([^"]+)"', html)
    assert (site / picture).stat().st_size > 10_000


@pytest.mark.parametrize("edition", ["en", "ja"])
@pytest.mark.parametrize("tutorial, says", [("11_transformer_memory", "the fullest holds"),
                                            ("13_experts_and_schedules", "formula: each worker idles")])
def test_a_widget_the_tutorial_is_about_shows_a_still_on_the_site(built_site, tutorial, says, edition):
    """The memory planner and the schedule playground have no kernel on the site: each shows a
    still of itself (its plot and its line), not an empty widget view."""
    html = (Path(built_site[0]) / "tutorials" / edition / f"{tutorial}.html").read_text(encoding="utf-8")
    stills = re.findall(r'<div class="dtflab-still">(.*?)</i></p></div>', html, flags=re.S)
    assert stills, f"{tutorial}: no still of its widget"
    assert all("data-root-id" in still and "Bokeh" in still for still in stills)  # a plot, drawn by BokehJS
    assert any(says in still for still in stills)
