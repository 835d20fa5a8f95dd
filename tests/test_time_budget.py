"""The test run's --time-budget (tests/conftest.py), which CI's slow run takes from what is left of its limit."""

import re
import subprocess
import sys

from conftest import REPO_ROOT


def _pytest(*args: str) -> str:
  run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_paths.py", *args],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
  return run.stdout


def test_a_spent_budget_starts_no_test_and_says_so():
  out = _pytest("--time-budget=0")
  assert "passed" not in out and "failed" not in out, out
  assert "not started: this run's --time-budget of 0 s was spent" in out, out
  listed = re.search(r"--time-budget: (\d+) tests not started\n  tests/test_paths\.py::", out)
  assert listed and int(listed[1]) > 0, out


def test_a_budget_left_runs_every_test():
  out = _pytest("--time-budget=600")
  assert "passed" in out and "skipped" not in out and "failed" not in out, out
  assert "--time-budget: 0 tests not started" in out, out
