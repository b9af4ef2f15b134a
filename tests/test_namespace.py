"""Packaging: everything installs under the one import name ``iron_spec`` (issue 12). The
folders keep the project's layout; pyproject.toml maps them to ``iron_spec.runtime``,
``iron_spec.operators`` and ``iron_spec.specs``. A generic top-level name (``runtime``,
``operators``, ``specs``) in site-packages would clash with other packages."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = re.compile(r"^\s*(from|import)\s+(runtime|operators|specs)\b", re.M)


def test_pyproject_installs_one_namespace():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "iron_spec" or p.startswith("iron_spec.") for p in tool["packages"])
    assert tool["package-dir"] == {"iron_spec.runtime": "runtime", "iron_spec.operators": "operators",
                                   "iron_spec.specs": "specs"}


def test_every_package_folder_installs():
    # A sub-package missing from the list installs nowhere: an editable install still finds
    # it, a plain one does not (tests/test_layering.py names the layers they form).
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"iron_spec": "iron_spec", **{v: k for k, v in tool["package-dir"].items()}}
    found = {".".join([folders[top], *init.parent.relative_to(ROOT / top).parts])
             for top in folders for init in (ROOT / top).rglob("__init__.py")}
    assert found - {"iron_spec.specs"} <= set(tool["packages"]), \
        f"not in pyproject's packages: {sorted(found - set(tool['packages']))}"


def test_no_source_imports_a_top_level_folder():
    offenders = [f"{path.relative_to(ROOT)}:{src[:m.start()].count(chr(10)) + 1}"
                 for folder in ("iron_spec", "runtime", "operators", "tests", "bench")
                 for path in (ROOT / folder).rglob("*.py") if ".venv" not in path.parts
                 for src in [path.read_text()] for m in TOP_LEVEL.finditer(src)]
    assert not offenders, f"import these as iron_spec.<folder>: {offenders}"


def test_the_extension_and_specs_load_under_the_namespace():
    from iron_spec.operators import native
    from iron_spec.spec.registry import SPECS

    assert native.__name__ == "iron_spec.operators.native"
    assert (SPECS / "llama3.yaml").is_file()
