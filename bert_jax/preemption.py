"""Stopping a run cleanly: SIGTERM (a preemption notice) or a first Ctrl-C saves at a step boundary, then exits."""

import signal
import sys
import threading

import jax
from jax.experimental import multihost_utils


class Watcher:
  """Tells the loop when to save and stop after SIGTERM, at a step boundary agreed by all hosts.

  One process: a SIGTERM handler sets a flag, and so does a first Ctrl-C (SIGINT), which says so; a second
  Ctrl-C stops the run at once, as Python's own handler does. Several processes: JAX's preemption service
  (started by `jax.distributed.initialize`) spreads the notice and picks the same step on every host.
  """

  def __init__(self):
    self._signalled = False
    self._multihost = jax.process_count() > 1
    # Handlers can be set in the main thread only; elsewhere (a library caller's thread) the run has none.
    self._previous = {}
    if not self._multihost and threading.current_thread() is threading.main_thread():
      self._previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, self._on_sigterm)}
      if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:   # a job started in the background keeps it so
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)

  def _on_sigterm(self, signum, frame):
    del signum, frame
    self._signalled = True

  def _on_sigint(self, signum, frame):
    del signum, frame
    self._signalled = True
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
      print("Ctrl-C: saving a checkpoint at the next step, then exiting (Ctrl-C again stops at once, unsaved)",
            file=sys.stderr, flush=True)
    except OSError:   # stderr piped into a program the same Ctrl-C ended
      pass

  def reached(self, step: int) -> bool:
    """True at the step where every host should save and exit. Call it at every step."""
    if self._multihost:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._signalled

  def close(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
