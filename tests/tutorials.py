"""The tutorial notebooks the tests run: the English edition, then the Japanese one."""

from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "notebooks"
ENGLISH = sorted(HERE.glob("*.ipynb"))
NOTEBOOKS = ENGLISH + sorted(HERE.glob("ja/*.ipynb"))


def name(path: Path) -> str:
    """``00_quickstart.ipynb``, ``ja/00_quickstart.ipynb``: a test id per edition."""
    return str(path.relative_to(HERE))
