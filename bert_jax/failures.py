"""How a run ends when something outside the code goes wrong: one paragraph and an exit code.

`bert-jax pretrain` (main.py) prints a `RunError`'s message, without a traceback, and exits with its
`exit_code`; launch/supervisor.py reads the code (of worker 0) to decide what comes next:

  2   USER_ERROR  the config, a path or the data is wrong: a restart would fail the same way
  3   DIVERGED    non-finite steps in a row: a restart would replay them from the same checkpoint
  75  RESTART     another host of the job died (EX_TEMPFAIL): restart the whole job, it resumes
  1   anything else, e.g. a checkpoint that could not be written: restarted, with backoff

A dead host is noticed two ways: a collective of the train step fails (the loop turns that into
`PeerLost`), or, when a host hangs instead of dying, `watch_peers` sees it drop out of the
coordination service after `heartbeat_timeout_seconds` and ends this process.
"""

import os
import sys
import threading
import time

USER_ERROR = 2
DIVERGED = 3
RESTART = 75   # launch/supervisor.py's RESTART_EXIT_CODE: keep the two equal


class RunError(Exception):
  """A failure the person running the job can act on; its message says how."""
  exit_code = 1


class UserError(RunError, ValueError):
  """A config field, a path or the data is wrong."""
  exit_code = USER_ERROR


class DataError(UserError):
  """A prepared shard does not hold what `bert-jax prepare` recorded for it."""


class Diverged(RunError, FloatingPointError):
  """The non-finite guard (or the loss-spike guard) gave up."""
  exit_code = DIVERGED


class SaveFailed(RunError):
  """A checkpoint could not be written (a full disk, a revoked bucket permission ...)."""


class PeerLost(RunError):
  """A collective failed because another process of the job is gone."""
  exit_code = RESTART


def say_and_exit(error: RunError, prefix: str = "bert-jax") -> None:
  """Prints `error` as one paragraph and ends the process with its exit code.

  After `PeerLost` the process ends at once (`os._exit`): a normal exit would wait in JAX's
  shutdown barrier for the dead host and then abort with a C++ stack trace.
  """
  print(f"{prefix}: {error}", file=sys.stderr, flush=True)
  if isinstance(error, PeerLost):
    sys.stdout.flush()
    os._exit(error.exit_code)  # pylint: disable=protected-access
  sys.exit(error.exit_code)


def watch_peers(timeout_s: float, poll_s: float = 1.0, prefix: str = "bert-jax") -> threading.Event:
  """Starts a thread that ends this process (exit RESTART) once a peer leaves the job; set the
  returned event to stop it (before a normal exit, when the peers leave too).

  The coordination service stops listing a process `timeout_s` (its heartbeat timeout) after it
  last heard from it; a process blocked in a collective with a hung peer would otherwise wait for
  ever. Needs `jax.distributed.initialize` first and the service in recoverable mode, so that the
  service reports a dead peer instead of aborting every process.
  """
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  stop = threading.Event()
  client = distributed.global_state.client
  if client is None or distributed.global_state.num_processes < 2:
    return stop
  everyone = list(range(distributed.global_state.num_processes))

  def watch():
    while not stop.wait(poll_s):
      try:
        live = client.get_live_nodes(everyone)
      except Exception as e:  # pylint: disable=broad-except  (the coordinator itself is gone)
        live, why = {}, f"the coordinator does not answer ({str(e).splitlines()[0][:200]})"
      else:
        why = f"process(es) {sorted(set(everyone) - set(live))} stopped answering for {timeout_s:g} s"
      if len(live) < len(everyone) and not stop.is_set():
        say_and_exit(PeerLost(f"a peer host of this job is gone: {why}. Exiting with code {RESTART} so "
                              "that the supervisor restarts the whole job; it resumes from the latest "
                              "checkpoint."), prefix=f"{prefix} (process {distributed.global_state.process_id})")

  threading.Thread(target=watch, name="watch_peers", daemon=True).start()
  return stop
