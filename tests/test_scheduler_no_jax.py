"""The scheduler side must stay plain Python + numpy: importing it must not import jax.

``jaxfl/__init__.py`` may import jax, so each package is loaded under a bare stub ``jaxfl``
parent (its ``__init__`` never runs) in a fresh interpreter, where ``sys.modules`` is clean.
"""

import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
PURE_PYTHON_PACKAGES = ["jaxfl.scheduler", "jaxfl.algorithms"]

_CHECK = r"""
import importlib.util, pkgutil, sys, types

root, package = sys.argv[1], sys.argv[2]
stub = types.ModuleType("jaxfl")
stub.__path__ = [root + "/jaxfl"]
sys.modules["jaxfl"] = stub

folder = root + "/" + package.replace(".", "/")
spec = importlib.util.spec_from_file_location(
    package, folder + "/__init__.py", submodule_search_locations=[folder]
)
module = importlib.util.module_from_spec(spec)
sys.modules[package] = module
spec.loader.exec_module(module)

imported = [package]
for info in pkgutil.walk_packages(module.__path__, prefix=package + "."):
    importlib.import_module(info.name)
    imported.append(info.name)

leaked = sorted(name for name in sys.modules if name == "jax" or name.startswith(("jax.", "jaxlib", "flax", "optax")))
assert not leaked, f"importing {imported} pulled in {leaked[:5]}"
print("ok", len(imported))
"""


@pytest.mark.parametrize("package", PURE_PYTHON_PACKAGES)
def test_package_imports_without_jax(package):
    folder = REPO_ROOT / package.replace(".", "/")
    assert (folder / "__init__.py").exists(), f"{package} has no __init__.py"
    result = subprocess.run(
        [sys.executable, "-c", _CHECK, str(REPO_ROOT), package],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )
    assert result.returncode == 0, result.stderr or result.stdout
    assert result.stdout.startswith("ok")
