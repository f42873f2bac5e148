"""Docs cite papers, never files a user of the package does not have (DESIGN.md, the specs)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"DESIGN\.md|\bspecs/|\bspecs? §|\bspecs? `?\w+\.md|\w+\.md`? §|\bthe spec\b|\bspec's\b")


def test_no_reference_points_outside_the_repository():
    files = [ROOT / "README.md", *(ROOT / "jaxfl").rglob("*.py"), *(ROOT / "examples").rglob("*.py"),
             *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.md"),
             *(ROOT / "notebooks").rglob("*.ipynb")]
    # only the project's own files: not virtual environments or outputs kept under benchmarks/
    files = [path for path in files if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in files for number, line in enumerate(path.read_text().splitlines(), 1)
             if OUTSIDE.search(line)]
    assert not found, "\n".join(found)
