"""How a run ends when something outside the code goes wrong: one paragraph and an exit code.

`bert-jax pretrain` (main.py) prints a `RunError`'s message, without a traceback, and exits with its
`exit_code`; launch/supervisor.py reads the code (of worker 0) to decide what comes next:

  2   USER_ERROR  the config, a path or the data is wrong: a restart would fail the same way
  3   DIVERGED    non-finite steps in a row: a restart would replay them from the same checkpoint
  75  RESTART     another host of the job died (EX_TEMPFAIL): restart the whole job, it resumes
  143 STOPPED     SIGTERM (or a first Ctrl-C) before the end (128 + 15): `bert-jax pretrain` or `ablate` saved
                  the run and stopped; the same command resumes it
  1   anything else, e.g. a checkpoint that could not be written: restarted

The optional loss-spike guard (`LossSpikeGuard`) keeps a run going instead: it goes back to the last
checkpoint before a spike and skips the batches that caused it.

A dead host is noticed two ways: a collective of the train step fails (the loop turns that into
`PeerLost`), or, when a host hangs instead of dying, `watch_peers` sees it drop out of the
coordination service after `heartbeat_timeout_seconds` and ends this process. Process 0 also runs
that service: when it dies or hangs, JAX's C++ client aborts every other process (SIGABRT, a C++
stack trace) before Python can act, so a multi-process job runs in a child process
(`run_in_child_process`) whose parent turns that abort into the same message and exit code.
"""

import contextlib
import ctypes
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

USER_ERROR = 2
DIVERGED = 3
RESTART = 75   # launch/supervisor.py's RESTART_EXIT_CODE: keep the two equal
STOPPED = 128 + signal.SIGTERM


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


class Stopped(RunError):
  """SIGTERM ended a stage before its end; what it did is saved."""
  exit_code = STOPPED


class PeerLost(RunError):
  """A collective failed because another process of the job is gone."""
  exit_code = RESTART


@contextlib.contextmanager
def as_user_errors(prog: str, *kinds: type[BaseException]):
  """Inside, an exception of `kinds` (say a FileNotFoundError for a path the user typed) ends the command as a
  `UserError` does: its message in one paragraph, exit 2, no traceback."""
  try:
    yield
  except kinds as e:
    say_and_exit(e if isinstance(e, RunError) else UserError(str(e)), prefix=prog)


class _Terminated(BaseException):
  """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def stop_message(prog: str, what: str, at_once: bool = True):
  """Inside, SIGTERM or Ctrl-C ends the command with one line saying so and what becomes of the run (`what`), and
  the shell's exit code for that signal (143, 130), instead of a silent death or a traceback. For commands that
  save nothing to stop on (finetune, sweep, prepare): `bert-jax pretrain` saves and exits (preemption.py) instead.
  `at_once`: without the interpreter's exit, which waits for the JAX steps already dispatched (tens of seconds on
  a CPU); False where that exit has work to do (multiprocessing's semaphores to release)."""
  main = threading.current_thread() is threading.main_thread()
  previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}

  def on_sigterm(signum, frame):
    del signum, frame
    raise _Terminated()

  if main:
    signal.signal(signal.SIGTERM, on_sigterm)
  try:
    yield
  except (KeyboardInterrupt, _Terminated) as e:
    if main:   # a second signal while it ends is not a traceback
      signal.signal(signal.SIGTERM, signal.SIG_IGN)
      signal.signal(signal.SIGINT, signal.SIG_IGN)
    signum = signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM
    _tell(f"{prog}: stopped by {'Ctrl-C' if signum == signal.SIGINT else 'SIGTERM'}; {what}")
    if at_once:
      sys.stdout.flush()
      os._exit(128 + signum)  # pylint: disable=protected-access
    sys.exit(128 + signum)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


@contextlib.contextmanager
def cut_short_by_sigterm(prog: str, what: str):
  """Inside `stop_message`: a SIGTERM ends this block with one line (`what`: what is kept) and the command goes on,
  to exit 0 where nothing else fails. For the last lines of a run whose work is saved (a finished pretraining run's
  report): the run is done, so a supervisor or a `&&` chain takes it as done rather than stopped. Ctrl-C still
  stops the command (130); a second SIGTERM after this block, `stop_message`'s 143."""
  try:
    yield
  except _Terminated:
    _tell(f"{prog}: SIGTERM; {what}")
    _SIGTERM_CUT_SHORT.set()


# Set when `cut_short_by_sigterm` took a SIGTERM: a command that goes on after the block (`bert-jax ablate`, after
# a variant's pretraining) stops at its next stage instead of losing the signal.
_SIGTERM_CUT_SHORT = threading.Event()


def sigterm_cut_short() -> bool:
  """Whether a SIGTERM cut a finished stage's last lines short in this process (`cut_short_by_sigterm`)."""
  return _SIGTERM_CUT_SHORT.is_set()


def _tell(line: str) -> None:
  """`line` on stderr, where it can still be written (not into a program the same Ctrl-C ended)."""
  try:
    print(line, file=sys.stderr, flush=True)
  except OSError:
    pass


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


def peer_lost(why: str) -> PeerLost:
  """`PeerLost` with the message every lost peer ends with."""
  return PeerLost(f"a peer host of this job is gone: {why}. Exiting with code {RESTART} so that the supervisor "
                  "restarts the whole job; it resumes from the latest checkpoint.")


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
        say_and_exit(peer_lost(why), prefix=f"{prefix} (process {distributed.global_state.process_id})")

  threading.Thread(target=watch, name="watch_peers", daemon=True).start()
  return stop


# -- A multi-process job in a child process ------------------------------------------------------
# The client's `missed_heartbeat_callback` option would replace the abort, but jaxlib 0.10.2 cannot
# hand its error to a Python callable (std::bad_cast: the same abort), so a parent process watches.

_PARENT_PID = "BERT_JAX_PARENT_PID"   # in the child's environment
# JAX's client writes these to stderr once it cannot reach the coordination service (and aborts).
_COORDINATION_TROUBLE = re.compile(rb"coordination_service_agent\.cc|preemption_sync_manager\.cc|"
                                   rb"JAX distributed service detected fatal errors|xla\.coordination\.")
_HOLD_S = 5.0   # how long such lines are held back, waiting to see whether the child aborts
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def run_in_child_process(prefix: str = "bert-jax") -> None:
  """Runs this command again as a child process and exits with its exit code; returns in the child.

  The child's stderr passes through, except when JAX's coordination service client aborts it: its
  C++ stack trace becomes one message and the exit code RESTART. SIGTERM (preemption), SIGHUP and
  SIGUSR1/2 are passed on; SIGINT is not, a terminal sends it to the child too. The child dies with
  this process, so a supervisor that SIGKILLs the job's pid does not leave it holding the devices.
  """
  if _PARENT_PID in os.environ:
    _die_with_parent(int(os.environ[_PARENT_PID]))
    return
  child = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], stderr=subprocess.PIPE,
                           env={**os.environ, _PARENT_PID: str(os.getpid())})
  for signum in _FORWARDED:
    signal.signal(signum, lambda signum, _: child.send_signal(signum))
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  held, said = _relay_stderr(child.stderr)
  code = child.wait()
  if code < 0 and held and not said:   # aborted (or killed) just after losing the coordination service
    rpcs = re.findall(r"CoordinationService/(\w+)", b"".join(held).decode(errors="replace")) or ["RPC"]
    say_and_exit(peer_lost(f"this process lost the coordination service, which runs in process 0 (its {rpcs[-1]} "
                           f"call failed), and JAX ended it with {signal.Signals(-code).name}"), prefix=prefix)
  if not said:   # else they are the C++ client's view of the loss that the child's message names
    _write(held)
  sys.stdout.flush()
  # os._exit: nothing here needs cleaning up, and tearing down the libraries imported takes a second.
  os._exit(RESTART if said else code if code >= 0 else 128 - code)   # 128 + N: a shell's death by signal N


def _relay_stderr(stream) -> tuple[list[bytes], bool]:
  """Copies `stream` to our stderr until it closes, holding lines back from the first one about the
  coordination service on (after _HOLD_S s they pass on), except messages of this package.

  Returns:
    the lines held when it closed, and whether the child said it exits with RESTART.
  """
  pieces = queue.Queue()

  def read():
    while chunk := stream.read1(1 << 16):   # whatever is there: a progress bar's \r passes at once
      for piece in chunk.splitlines(keepends=True):
        pieces.put(piece)
    pieces.put(None)

  threading.Thread(target=read, name="relay_stderr", daemon=True).start()
  held, until, said = [], None, False
  while True:
    try:
      piece = pieces.get(timeout=None if until is None else max(0.0, until - time.monotonic()))
    except queue.Empty:   # the child lives on: not an abort
      _write(held)
      held, until = [], None
      continue
    if piece is None:
      return held, said
    ours = piece.startswith(b"bert-jax")
    said = said or (ours and f"Exiting with code {RESTART} ".encode() in piece)
    if until is None and not ours and _COORDINATION_TROUBLE.search(piece):
      until = time.monotonic() + _HOLD_S
    if until is None or ours:
      _write([piece])
    else:
      held.append(piece)


def _write(pieces: list[bytes]) -> None:
  sys.stderr.buffer.write(b"".join(pieces))
  sys.stderr.flush()


def _die_with_parent(parent: int) -> None:
  """The kernel SIGKILLs this process when its parent dies (Linux; elsewhere nothing happens)."""
  if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:   # it died before the prctl
      os.kill(os.getpid(), signal.SIGKILL)


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
