"""Import hygiene: `import jaxfl` never pulls TensorFlow in."""
import subprocess
import sys


def test_import_jaxfl_does_not_import_tensorflow():
    code = ("import sys, jaxfl, jaxfl.cli, jaxfl.data, jaxfl.engine; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_datasets')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_modules_the_readme_calls_are_attributes_after_a_plain_import():
    import subprocess
    import sys

    code = ("import jaxfl; print(jaxfl.presets.preset_config('port-mnist', algorithm='fedbuff', max_updates=20)"
            ".max_updates, callable(jaxfl.comparison.compare), callable(jaxfl.plot.timeline_figure), "
            "callable(jaxfl.sweep.run_sweep), callable(jaxfl.report.make_report), callable(jaxfl.testing.check_algorithm))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["20", "True", "True", "True", "True", "True"], done.stderr[-2000:]
