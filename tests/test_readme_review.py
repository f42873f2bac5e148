"""README statements that follow from code are checked against that code, so that they cannot go
stale: the fields left out of run names, the models, the demo's run time, the resume flags."""
import pathlib
import re

from jaxfl.experiment import NAME_LEFT_OUT

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_names_the_fields_left_out_of_run_names_as_the_code_does():
    found = re.search(r"leaving out what never changes results — (.*?) —", README, re.DOTALL)
    assert found, "README's run-name paragraph no longer lists the fields left out of the hash"
    listed = re.findall(r"`(\w+)`", found.group(1))
    assert sorted(listed) == sorted(NAME_LEFT_OUT), (
        f"README lists {listed} as left out of run names; jaxfl.experiment.NAME_LEFT_OUT is {list(NAME_LEFT_OUT)}")


def test_readme_model_list_names_every_built_in_model():
    from jaxfl.models import MODELS

    found = re.search(r"^- \*\*Models\*\* \(`--model`\):(.*?)(?=^- \*\*)", README, re.DOTALL | re.MULTILINE)
    assert found, "README's Models bullet is gone"
    named = set(re.findall(r"`(\w+)`", found.group(1)))
    built_in = [name for name, model in MODELS.items() if model.__module__.startswith("jaxfl.models")]
    assert len(built_in) >= 16
    missing = [name for name in built_in if name not in named]
    assert not missing, f"README's Models bullet does not name {missing} (jaxfl.models.MODELS)"
