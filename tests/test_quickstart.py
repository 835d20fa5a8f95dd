"""The README's quick-start pretraining command, as a new user types it.

Taken from the README itself and run as a subprocess in a fresh working directory (holding a copy of
`configs/`, as a clone does) with the README's relative `--workdir`, shortened only by config
overrides: through asynchronous checkpoints, then a second run that resumes from the latest one.
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import compilation_cache_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
  """The shell lines of the README's `## Quick start` bash block (comments dropped)."""
  text = (ROOT / "README.md").read_text()
  section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
  block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
  return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_quick_start_has_exactly_two_commands():
  commands = readme_commands()
  assert len(commands) == 2, commands
  assert "bert-jax pretrain" in commands[0]
  assert "pytest" in commands[1]


def _pretrain_argv() -> list[str]:
  """The `bert-jax pretrain ...` part of the first command, run with this interpreter."""
  command = readme_commands()[0].split("&&")[-1].strip()
  argv = shlex.split(command)
  assert argv[:2] == ["bert-jax", "pretrain"], argv
  return [sys.executable, "-m", "bert_jax.cli"] + argv[1:]


def _run(argv, cwd, overrides, cache_dir):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}   # one CPU device, as a user has
  env.update(compilation_cache_env(cache_dir))   # the second run loads what the first compiled
  return subprocess.run(argv + overrides, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_readme_pretrain_command_runs_checkpoints_and_resumes(tmp_path, compilation_cache_dir):
  shutil.copytree(ROOT / "configs", tmp_path / "configs")
  argv = _pretrain_argv()
  workdir = next(a.split("=", 1)[1] for a in argv if a.startswith("--workdir="))
  assert not os.path.isabs(workdir), "the README's --workdir is relative: that is what this test is about"
  short = ["--config.log_every=2", "--config.eval_every=4", "--config.eval_steps=1", "--config.checkpoint_every=2",
           "--config.keep_checkpoints=2", "--config.optimizer.total_steps=8", "--config.data.eval_fraction=0.05"]

  first = _run(argv, tmp_path, short + ["--config.train_steps=4"], compilation_cache_dir)
  assert first.returncode == 0, first.stderr[-3000:]
  checkpoints = tmp_path / workdir / "checkpoints"
  assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [2, 4]
  assert not list(checkpoints.glob("*tmp*")), "a temporary checkpoint directory was left behind"
  assert "eval/unigram_accuracy" in (tmp_path / workdir / "metrics.jsonl").read_text()
  assert (tmp_path / workdir / "curves.png").stat().st_size > 0
  assert "fill-mask on held-out lines" in first.stdout and "masked: " in first.stdout, first.stdout[-3000:]

  second = _run(argv, tmp_path, short + ["--config.train_steps=6"], compilation_cache_dir)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "resumed from" in second.stdout and "at step 4" in second.stdout, second.stdout
  assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [4, 6]
  # A quiet start: none of TensorFlow's or libtpu's start-up lines on a CPU host.
  for noise in ("cuInit", "cuda drivers", "oneDNN", "TPU_ACCELERATOR_TYPE"):
    assert noise not in first.stderr + second.stderr, (noise, first.stderr[-2000:])
