"""The Japanese edition (notebooks/ja/) is the English notebooks translated: the same cells, the
same code once comments and the words inside strings are set aside (a solution's code too,
which IPython reads as one string), and every text cell in Japanese. (Both editions run in
test_notebooks, as a learner and solved, and have the exercise shape test_exercises checks.)"""

import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from tutorials import ENGLISH

from dtflab import exercises

ROOT = Path(__file__).resolve().parents[1]
JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
FIELD = re.compile(r"\{([^{}]*)\}")
WORDS = re.compile(r"'[^']*'")


def code_shape(source: str) -> list[str]:
    """The cell's tokens without comments; a string keeps only its f-string fields (what it
    computes), so translating its words changes nothing here and changing its code does."""
    python = TransformerManager().transform_cell(source)
    shape = [line.strip() for line in source.splitlines() if line.lstrip().startswith("%")]
    for token in tokenize.generate_tokens(io.StringIO(python).readline):
        if token.type == tokenize.COMMENT or token.type in (tokenize.NL, tokenize.NEWLINE):
            continue
        if token.type == tokenize.STRING:
            fields = FIELD.findall(token.string) if token.string.lstrip("rbuRBU").startswith(("f", "F")) else []
            fields = [WORDS.sub("'...'", field) for field in fields]  # {'workers':>8} is a word too
            shape.append("STRING" + repr(sorted(fields)))  # word order is the language's
        else:
            shape.append(token.string)
    return shape


def test_every_notebook_has_a_japanese_edition():
    assert [p.name for p in sorted((ROOT / "notebooks" / "ja").glob("*.ipynb"))] == [p.name for p in ENGLISH]


@pytest.mark.parametrize("english", ENGLISH, ids=lambda p: p.name)
def test_the_japanese_edition_translates_the_words_and_keeps_the_code(english):
    en = nbformat.read(english, as_version=4)
    ja = nbformat.read(english.parent / "ja" / english.name, as_version=4)
    assert [c.cell_type for c in ja.cells] == [c.cell_type for c in en.cells]
    for i, (a, b) in enumerate(zip(en.cells, ja.cells)):
        assert a.metadata == b.metadata, f"cell {i}: tags and collapsed state as in English"
        if a.cell_type == "code":
            assert code_shape(b.source) == code_shape(a.source), f"cell {i}: the code differs"
        else:
            assert b.source != a.source and JAPANESE.search(b.source), f"cell {i} is not translated"
            spans = lambda text: {" ".join(s.split()) for s in re.findall(r"`([^`]+)`", text)}  # noqa: E731
            assert spans(a.source) <= spans(b.source), \
                f"cell {i}: the translation lost code: {spans(a.source) - spans(b.source)}"
        if exercises.is_solution(a):
            assert code_shape(exercises.solution_code(b)) == code_shape(exercises.solution_code(a)), \
                f"cell {i}: the solution's code differs"


def test_the_code_check_notices_a_changed_expression_but_not_a_translated_word():
    english = 'print(f"{n} workers: {rate:.2f} steps/s")  # per second'
    assert code_shape('print(f"{n} ワーカ: {rate:.2f} ステップ/秒")  # 毎秒') == code_shape(english)
    assert code_shape('print(f"{n + 1} ワーカ: {rate:.2f} ステップ/秒")') != code_shape(english)
    assert code_shape('%dtf_cluster start 4') != code_shape('%dtf_cluster start 3')


def test_the_readme_links_the_japanese_edition():
    readme = (ROOT / "README.md").read_text()
    for notebook in ENGLISH:
        assert f"notebooks/ja/{notebook.name}" in readme
