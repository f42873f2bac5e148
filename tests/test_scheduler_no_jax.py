"""The scheduler side must stay plain Python + numpy: importing it, and every algorithm's options and
policy, must not import jax (device hooks import it only when the engine builds them).

``jaxfl/__init__.py`` may import jax, so each package is loaded under a bare stub ``jaxfl`` parent
(its ``__init__`` never runs) in a fresh interpreter in which importing jax, jaxlib, flax or optax
fails (:func:`jaxfl.testing.check_imports_without_jax`, which the conformance suite also uses).
"""

import pathlib

import pytest

from jaxfl.testing import check_imports_without_jax

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
PURE_PYTHON_PACKAGES = ["jaxfl.scheduler", "jaxfl.algorithms"]


@pytest.mark.parametrize("package", PURE_PYTHON_PACKAGES)
def test_package_imports_without_jax(package):
    folder = REPO_ROOT / package.replace(".", "/")
    assert (folder / "__init__.py").exists(), f"{package} has no __init__.py"
    check_imports_without_jax(package, walk=True)


def test_the_check_catches_a_module_that_imports_jax():
    with pytest.raises(AssertionError, match="jax is blocked"):
        check_imports_without_jax("jaxfl.kernels.tree")
