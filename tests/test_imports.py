"""Import hygiene: `import jaxfl` never pulls TensorFlow in."""
import subprocess
import sys


def test_import_jaxfl_does_not_import_tensorflow():
    code = ("import sys, jaxfl, jaxfl.cli, jaxfl.data, jaxfl.engine; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
