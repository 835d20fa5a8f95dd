"""How a run ends when something outside the code goes wrong: one paragraph and an exit code.

`bert-jax pretrain` (main.py) prints a `RunError`'s message, without a traceback, and exits with its
`exit_code`; launch/supervisor.py reads the code (of worker 0) to decide what comes next:

  2   USER_ERROR  the config, a path or the data is wrong: a restart would fail the same way
  3   DIVERGED    non-finite steps in a row: a restart would replay them from the same checkpoint
  75  RESTART     another host of the job died (EX_TEMPFAIL): restart the whole job, it resumes
  1   anything else, e.g. a checkpoint that could not be written: restarted

The optional loss-spike guard (`LossSpikeGuard`) keeps a run going instead: it goes back to the last
checkpoint before a spike and skips the batches that caused it.

A dead host is noticed two ways: a collective of the train step fails (the loop turns that into
`PeerLost`), or, when a host hangs instead of dying, `watch_peers` sees it drop out of the
coordination service after `heartbeat_timeout_seconds` and ends this process.
"""

import math
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
    unanswered_since = None
    while not stop.wait(poll_s):
      try:
        live, unanswered_since = client.get_live_nodes(everyone), None
        why = f"process(es) {sorted(set(everyone) - set(live))} stopped answering for {timeout_s:g} s"
      except Exception as e:  # pylint: disable=broad-except  (the coordinator is gone, or a hiccup)
        unanswered_since = unanswered_since or time.time()
        live = everyone if time.time() - unanswered_since < timeout_s else {}
        why = f"the coordinator did not answer for {timeout_s:g} s ({str(e).splitlines()[0][:200]})"
      if len(live) < len(everyone) and not stop.is_set():
        say_and_exit(PeerLost(f"a peer host of this job is gone: {why}. Exiting with code {RESTART} so "
                              "that the supervisor restarts the whole job; it resumes from the latest "
                              "checkpoint."), prefix=f"{prefix} (process {distributed.global_state.process_id})")

  threading.Thread(target=watch, name="watch_peers", daemon=True).start()
  return stop


class LossSpikeGuard:
  """The loss-spike guard of the loop (on when `config.loss_spike_factor` > 0).

  A log interval whose mean train loss exceeds `factor` x the running mean of the intervals before
  it (an exponential moving average, from the `warmup`-th interval on) is a spike: `undo` restores
  the newest checkpoint written before the interval, and `next_batch` jumps over the interval's
  batches when the data stream reaches them again. After `max_spikes` spikes the run stops.
  """

  def __init__(self, factor: float, max_spikes: int, warmup: int = 3, decay: float = 0.9):
    self.factor, self.max_spikes, self.warmup, self.decay = factor, max_spikes, warmup, decay
    self.mean, self.intervals, self.spikes, self.skipped = None, 0, 0, 0
    self._start, self._skip = None, None   # (first step, data position) of the interval; (from, to)

  def start_interval(self, step: int, train_iter) -> None:
    """Called before the first step of each log interval."""
    if self.factor > 0:
      self._start = (step, train_iter.get_state())

  def next_batch(self, train_iter):
    """The next batch of `train_iter`, past the batches of an undone spike."""
    if self._skip is not None and train_iter.get_state() == self._skip[0]:
      train_iter.set_state(self._skip[1])
      self._skip = None
    return next(train_iter)

  def is_spike(self, loss: float) -> bool:
    """Whether an interval's mean loss is a spike; otherwise it joins the running mean."""
    if self.factor <= 0 or not math.isfinite(loss):   # non-finite steps are the other guard's
      return False
    if self.intervals >= self.warmup and loss > self.factor * self.mean:
      return True
    self.mean = loss if self.mean is None else self.decay * self.mean + (1 - self.decay) * loss
    self.intervals += 1
    return False

  def scalars(self) -> dict[str, int]:
    return {"train/loss_spikes": self.spikes, "train/spike_skipped_batches": self.skipped} if self.factor > 0 else {}

  def undo(self, checkpointer, abstract_state, train_iter, step: int, loss: float):
    """((state, its step) or None, a line saying what happened) after a spike at `step`."""
    first, position = self._start
    what = f"loss {loss:.4g} at step {step} is more than {self.factor:g} x the running mean {self.mean:.4g}"
    if self.spikes >= self.max_spikes:
      raise Diverged(f"stopping at step {step}: {what}, a spike after {self.spikes} others (max_loss_spikes). "
                     f"The latest checkpoint is {checkpointer.directory}/{checkpointer.latest_step()}. Lower "
                     "optimizer.learning_rate or check the data.")
    checkpointer.check(wait=True)
    state, data_state, good = checkpointer.restore_latest(abstract_state, move_aside=False, at_most=first - 1)
    if good is None:
      return None, f"{what}, but no checkpoint precedes step {first}: going on"
    self.spikes += 1
    self.skipped += step - first + 1
    self._skip = (position, train_iter.get_state())
    train_iter.set_state(data_state)
    return (state, good), (f"loss spike {self.spikes}/{self.max_spikes}: {what}; back to "
                           f"{checkpointer.directory}/{good}, the batches of steps {first}-{step} will be skipped")
