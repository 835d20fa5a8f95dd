"""The CLI's flag rule: modules the tests (or other code) import as libraries define no flags at import."""

import ast
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


def _bert_jax_modules_imported_by_tests() -> list[str]:
  found = set()
  for path in sorted((REPO_ROOT / "tests").glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        found.update(a.name for a in node.names if a.name.startswith("bert_jax"))
      elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bert_jax"):
        # `from bert_jax.tools import aot` imports bert_jax.tools.aot when aot is a module.
        found.update(f"{node.module}.{a.name}" for a in node.names)
        found.add(node.module)
  return sorted(found)


@pytest.mark.slow
def test_every_module_the_tests_import_can_be_imported_in_one_process():
  """pytest imports all of them into one process: two modules defining `--config` at import collide there."""
  modules = _bert_jax_modules_imported_by_tests()
  assert "bert_jax.tools.aot" in modules and "bert_jax.ablate.main" in modules  # with finetune.main: two `--config`s
  code = ("import importlib, importlib.util, sys\n"
          "for name in sys.argv[1:]:\n"
          "  try:\n"
          "    spec = importlib.util.find_spec(name)\n"
          "  except ModuleNotFoundError:  # a name imported from a module\n"
          "    spec = None\n"
          "  if spec is not None:\n"
          "    importlib.import_module(name)\n")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  run = subprocess.run([sys.executable, "-c", code, *modules], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=300, env=env)
  assert run.returncode == 0, run.stderr[-3000:]


def test_shipped_configs_are_read_from_the_clone_in_any_directory(tmp_path):
  """`bert-jax bench train` without --config and `api.finetune` read the configs this clone ships, also from a
  directory holding a `configs` package of its own. The package is loaded from this checkout without its root
  on sys.path, as an installed package runs."""
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "__init__.py").write_text("")   # a user's own configs, with no common.py
  code = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("bert_jax", "{REPO_ROOT}/bert_jax/__init__.py",
                                              submodule_search_locations=["{REPO_ROOT}/bert_jax"])
module = importlib.util.module_from_spec(spec)
sys.modules["bert_jax"] = module
spec.loader.exec_module(module)
from bert_jax.tools import bench_train
assert bench_train.__file__.startswith("{REPO_ROOT}"), bench_train.__file__
print(bench_train.comparison_config().model.preset)
from bert_jax import api
print(api._config("classification", [{{"text": "a", "label": "x"}}], ["x"]).task)
"""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                       timeout=300, check=False)
  assert run.returncode == 0 and run.stdout.split()[-2:] == ["mini", "generic"], run.stderr[-2000:]


@pytest.mark.parametrize("group", ["bench", "analyze"])
def test_a_command_group_lists_its_commands(capsys, group):
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  for argv, code in (([group, "--help"], 0), ([group, "-h"], 0), ([group], 2)):
    with pytest.raises(SystemExit) as stopped:
      cli.main(["bert-jax", *argv])
    listed = [line.split()[:2] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert stopped.value.code == code
    assert listed == [name.split() for name in cli.SUBCOMMANDS if name.startswith(f"{group} ")], listed


def test_a_ctrl_c_no_command_handles_is_one_line_and_exit_130(capsys):
  from bert_jax import cli  # pylint: disable=g-import-not-at-top

  def interrupted(argv):
    del argv
    raise KeyboardInterrupt

  with pytest.raises(SystemExit) as stopped:
    cli._run(interrupted, "bert-jax embed", ["bert-jax embed"])  # pylint: disable=protected-access
  assert stopped.value.code == 130 and capsys.readouterr().err == "bert-jax embed: stopped by Ctrl-C\n"


def test_a_required_flag_not_given_is_one_line_and_exit_2_in_every_command(tmp_path):
  """absl's UsageError would print the command's whole --help, then the message, and exit 1."""
  for command in (["embed", "--checkpoint=x"], ["analyze", "heads", "--checkpoint=x", "--input=y"]):
    run = subprocess.run([sys.executable, "-m", "bert_jax.cli", *command], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1].endswith("is required (--help lists the flags)"), run.stderr[-2000:]
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("module,prog", [("bert_jax.main", "pretrain"), ("bert_jax.finetune.main", "finetune"),
                                         ("bert_jax.finetune.sweep", "sweep"), ("bert_jax.ablate.main", "ablate")])
def test_a_usage_error_by_python_m_is_one_line_and_exit_2(tmp_path, module, prog):
  """`python -m <module>` runs the command as `bert-jax` does: an unexpected argument is one line, not absl's whole
  --help and exit 1."""
  run = subprocess.run([sys.executable, "-m", module, "--config=x.py", "--workdir=w", "extra"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 2, run.stderr[-2000:]
  assert run.stderr.strip().splitlines() == [f"bert-jax {prog}: unexpected arguments: ['extra'] (--help lists the "
                                             "flags)"], run.stderr[-2000:]


def test_fill_mask_with_an_input_file_of_no_texts_or_none_is_one_message_and_exit_2(tmp_path):
  (tmp_path / "empty.txt").write_text("\n  \n")
  command = [sys.executable, "-m", "bert_jax.cli", "fill-mask", "--checkpoint=nowhere", "--input=empty.txt"]
  result = subprocess.run(command, cwd=tmp_path, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 2 and "empty.txt holds no texts" in result.stderr, result.stderr[-3000:]
  missing = subprocess.run(command[:-1] + ["--input=typo.txt"], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120)
  assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr[-3000:]


def test_export_of_a_checkpoint_that_is_not_there_is_one_message_and_exit_2(tmp_path):
  run = subprocess.run([sys.executable, "-m", "bert_jax.cli", "export", "--checkpoint=runs/typo", "--output=out"],
                       cwd=tmp_path, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                       timeout=120)
  assert run.returncode == 2 and run.stderr.startswith("bert-jax export: "), run.stderr[-3000:]
  assert "Traceback" not in run.stderr and not (tmp_path / "out").exists()
