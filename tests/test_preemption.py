"""preemption.Watcher: SIGTERM and a first Ctrl-C ask for a save; the handlers it found come back."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from bert_jax import preemption
from conftest import REPO_ROOT


def test_sigterm_sets_the_preemption_flag():
  before = signal.getsignal(signal.SIGTERM)
  watcher = preemption.Watcher()
  try:
    assert not watcher.reached(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert watcher.reached(2)
  finally:
    watcher.close()
  assert signal.getsignal(signal.SIGTERM) == before   # the handler it found, again


def test_a_first_ctrl_c_saves_and_exits_a_second_stops_at_once(capsys):
  # A handler of the caller's own, raising as Python's does at a terminal (a process started in the background,
  # as pytest may be, ignores SIGINT).
  def callers(signum, frame):
    signal.default_int_handler(signum, frame)

  before = signal.signal(signal.SIGINT, callers)
  try:
    watcher = preemption.Watcher()
    try:
      os.kill(os.getpid(), signal.SIGINT)
      assert watcher.reached(1) and "Ctrl-C: saving a checkpoint at the next step" in capsys.readouterr().err
      with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
    finally:
      watcher.close()
    assert signal.getsignal(signal.SIGINT) is callers   # the handler it found, again
  finally:
    signal.signal(signal.SIGINT, before)


def test_an_ignored_ctrl_c_stays_ignored_and_another_thread_sets_no_handler():
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)   # as a job started in the background has it
  try:
    watcher = preemption.Watcher()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    watcher.close()
  finally:
    signal.signal(signal.SIGINT, before)
  made = []
  thread = threading.Thread(target=lambda: made.append(preemption.Watcher()))
  thread.start()
  thread.join()
  assert len(made) == 1 and not made[0].reached(1)   # no ValueError from signal.signal
  made[0].close()


def test_a_sigterm_before_pretraining_loop_is_one_line_and_exit_143(tmp_path):
  """Before the loop's handler is set (the data, the model and the step being set up), `bert-jax pretrain` ends on
  SIGTERM with one line and 143, as it does after saving, not silently."""
  script = f"""
import os, signal, sys, time
sys.argv = ["bert-jax pretrain", "--config={REPO_ROOT}/configs/tiny.py", "--workdir=w"]
from bert_jax import cli, main, train
def setting_up(config, workdir):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(60)
train.train_to_end = setting_up
cli.run_module(main.main, "bert-jax pretrain")
"""
  run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
  assert run.returncode == 143, run.stderr[-2000:]
  assert run.stderr.strip().splitlines() == [
      "bert-jax pretrain: stopped by SIGTERM; the checkpoints saved before are kept: the same command resumes from "
      "the latest one (or starts afresh where there is none)"], run.stderr[-2000:]
