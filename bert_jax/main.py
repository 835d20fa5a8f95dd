"""`bert-jax pretrain`: flags, multi-host initialization, then `train.train_and_evaluate`.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny
    bert-jax pretrain --config=configs/bert_large.py:phase2 --workdir=DIR --config.init_from=PHASE1/checkpoints
    python -m bert_jax.main --config=configs/tiny.py --workdir=/tmp/bert_tiny --config.train_steps=100

A mistake in the config, a path or the data ends the command with one paragraph on stderr and exit
code 2, before anything is compiled; the other exit codes are listed in bert_jax/failures.py. A job
of several processes trains in a child process of the command (`failures.run_in_child_process`).
"""

import contextlib
import logging as python_logging
import os
import socket
import sys
import threading
import time

from bert_jax import config_path
from bert_jax import host_env

config_path.put_config_root_on_path(sys.argv)
host_env.configure()   # before JAX is imported: quiet on CPU hosts

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from bert_jax import cli
from bert_jax import config_loading
from bert_jax import failures
from bert_jax import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, e.g. configs/tiny.py or configs/bert_large.py:phase2.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard logs go here.")
flags.mark_flags_as_required(["config", "workdir"])
_PROG = "bert-jax pretrain"
_STOPPED_OUTSIDE_THE_LOOP = ("the checkpoints saved before are kept: the same command resumes from the latest one "
                             "(or starts afresh where there is none)")
_END_SKEW_S = 600   # how long after this process the others may end training (process 0 draws the curves)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, a misspelt `--config.` field as one line (exit 2): `config_loading.parse_flags`."""
  return config_loading.parse_flags(argv, prog=_PROG)


class _NoLibraryTracebacks(python_logging.Filter):
  """Orbax logs every failed background write with a traceback before the run reports the failure in
  one paragraph (failures.SaveFailed): its lines stay, their tracebacks go (--verbosity keeps them)."""

  def filter(self, record) -> bool:
    if record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname:
      record.exc_info, record.exc_text = None, None
    return True


def _needs_distributed(dist) -> bool:
  """`auto`: a coordinator is configured or the environment is a multi-host TPU slice."""
  if dist.initialize == "yes":
    return True
  if dist.initialize == "no":
    return False
  if dist.initialize != "auto":
    raise failures.UserError(f"distributed.initialize must be auto, yes or no; got {dist.initialize!r}")
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return bool(dist.coordinator_address) or "," in hosts or "MEGASCALE_COORDINATOR_ADDRESS" in os.environ


def initialize_distributed(dist) -> threading.Event:
  """`jax.distributed.initialize` when the job has several processes, and a watch on its peers.

  In recoverable mode the coordination service reports a dead process instead of aborting every
  other one with a C++ stack trace; `failures.watch_peers` then ends this process with exit code
  `failures.RESTART` within `heartbeat_timeout_seconds` (sooner when a collective fails first).
  """
  if not _needs_distributed(dist):
    return threading.Event()
  jax.config.update("jax_enable_recoverability", True)
  jax.distributed.initialize(
      coordinator_address=dist.coordinator_address or None,
      num_processes=dist.num_processes if dist.num_processes > 0 else None,
      process_id=dist.process_id if dist.process_id >= 0 else None,
      heartbeat_timeout_seconds=dist.heartbeat_timeout_seconds)
  return failures.watch_peers(dist.heartbeat_timeout_seconds, prefix=_PROG)


def leave_distributed(stop_watching: threading.Event, timeout_s: float) -> None:
  """Ends a multi-process run that ended well here: waits for the other processes to end too (the
  watch on them stays on until then), and leaves in an order that is no failure: process 0, which
  runs the coordination service, last. In recoverable mode leaving has no barrier of its own: a
  process that left early would look lost to the watch, and one left behind by process 0 aborts.
  """
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  client = distributed.global_state.client
  if client is None:
    return
  try:
    client.wait_at_barrier("bert_jax_trained", timeout_in_ms=_END_SKEW_S * 1000)
  except Exception as e:  # pylint: disable=broad-except  (a peer died before the end)
    raise failures.peer_lost(f"it did not end training ({str(e).splitlines()[0][:200]})") from e
  stop_watching.set()
  if jax.process_index() != 0:
    jax.distributed.shutdown()
    return
  everyone, deadline = list(range(jax.process_count())), time.time() + timeout_s
  while len(client.get_live_nodes(everyone)) > 1 and time.time() < deadline:
    time.sleep(0.05)


def _this_process(dist) -> str:
  """The process id when the config sets it (before JAX knows it), else the host's name."""
  return f"process {dist.process_id}" if dist.process_id >= 0 else f"host {socket.gethostname()}"


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # libraries' INFO lines would bury the progress lines
    logging.get_absl_handler().addFilter(_NoLibraryTracebacks())
  config = config_loading.load_config(_CONFIG, _PROG, kind="pretrain")
  stop_watching = threading.Event()
  try:
    if _needs_distributed(config.distributed):   # a lost coordinator aborts JAX's client: watch from outside
      failures.run_in_child_process(prefix=f"{_PROG} ({_this_process(config.distributed)})")
    stop_watching = initialize_distributed(config.distributed)
    logging.info("process %d/%d, %d devices", jax.process_index(), jax.process_count(), jax.device_count())
    # One process: a SIGTERM while the run sets up or compiles (before the loop's own handler, which saves), or while
    # it ends, is one line and exit 143 too; while a finished run draws its report, one line and exit 0 (done,
    # `failures.cut_short_by_sigterm`). Several: JAX's preemption service takes SIGTERM from here on.
    stopping = (failures.stop_message(_PROG, _STOPPED_OUTSIDE_THE_LOOP) if jax.process_count() == 1
                else contextlib.nullcontext())
    with stopping:
      _, ended = train.train_to_end(config, _WORKDIR.value)   # checks config and inputs before compiling
    leave_distributed(stop_watching, config.distributed.heartbeat_timeout_seconds)
    if ended < config.train_steps:
      # Saved, not finished (its last line says so): `bert-jax pretrain ... && next` stops here.
      sys.stdout.flush()
      sys.exit(failures.STOPPED)
  except failures.RunError as e:
    failures.say_and_exit(e, prefix=_PROG if jax.process_count() == 1 else f"{_PROG} (process {jax.process_index()})")
  finally:
    stop_watching.set()   # the peers end now too: not a lost peer


if __name__ == "__main__":
  cli.run_module(main, _PROG)
