"""The suite's memory budget (tests/conftest.py): a run past it fails, naming its peak."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import MEMORY_BUDGET, ROOT, peak_rss

BUDGET_OF_ONE_BYTE = """
import sys, pytest

class Budget:
    def pytest_sessionstart(self, session):
        for plugin in session.config.pluginmanager.get_plugins():
            if str(getattr(plugin, "__file__", "")).endswith("tests/conftest.py"):
                plugin.MEMORY_BUDGET = 1

sys.exit(pytest.main(["tests/test_layering.py", "-q", "-p", "no:cacheprovider", "-k",
                      "circle"], plugins=[Budget()]))
"""


def test_a_run_past_the_budget_fails_naming_its_peak():
    out = subprocess.run([sys.executable, "-c", BUDGET_OF_ONE_BYTE], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "passed" in out.stdout and "is past the suite's budget of 0 GB" in out.stdout


def test_the_budget_is_the_readmes():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert f"peak memory at most {MEMORY_BUDGET // 10**9} GB" in text
    assert 0 < peak_rss() < MEMORY_BUDGET
