"""Keeps a job running through preemptions, from the machine that launched it.

Every `poll_seconds` the supervisor reads the slice's state (and, while it is up, the job's state on
worker 0). When the slice is gone, PREEMPTED or TERMINATED (a queued resource: SUSPENDED or FAILED),
it deletes and recreates it, sets the workers up again and restarts the same command; the job then
resumes from the latest checkpoint in its GCS workdir by itself. A job that exits with an error (or
"preempted", or RESTART_EXIT_CODE: a peer host died) on a slice that is still up is restarted in place.
It stops when the job exits with status 0, with STOPPED_EXIT_CODE (a SIGTERM to the job, as `stop` sends:
left stopped, unless a worker says it was preempted: JAX's preemption service then stops the others with it,
and the job is restarted), with a code that a restart cannot fix (FINAL_EXIT_CODES: a
user error, a diverged run), or after `max_restarts` restarts or more failed steps in a row (a create,
setup or start that failed, or gcloud unable to read the slice's or the job's state: an expired login
would otherwise be polled for ever), each failed step backed off. Clock and sleep are injected, so tests never wait.
"""

import dataclasses
import sys
import time
from typing import Callable

from launch import actions
from launch import gcloud
from launch.runner import DryRun, Runner

# Exit codes of `bert-jax pretrain` (bert_jax/failures.py; a test keeps the two in step).
RESTART_EXIT_CODE = 75          # a peer host of the job died: restart the whole job, it resumes
STOPPED_EXIT_CODE = 143         # SIGTERM to the job itself (as `stop` sends; the VM's reads "preempted"): left stopped
FINAL_EXIT_CODES = {2: "a config, path or data error", 3: "the run diverged (non-finite steps)"}

UP = {"READY", "ACTIVE"}
DEAD = {"PREEMPTED", "TERMINATED", actions.MISSING}       # a TPU VM node
DEAD_QUEUED = {"SUSPENDED", "FAILED", actions.MISSING}    # a queued resource (SUSPENDING: wait)


@dataclasses.dataclass(frozen=True)
class Policy:
  """How often to poll, how often to restart, and how to back off after failures."""
  poll_seconds: float = 300.0
  max_restarts: int = 20
  backoff_seconds: float = 60.0       # after a failed step, doubling up to max_backoff_seconds
  max_backoff_seconds: float = 1800.0


def _stderr_log(message: str) -> None:
  print(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} supervise: {message}",
        file=sys.stderr, flush=True)


def _exit_code(status: str) -> int | None:
  """3 for "exit 3"; None for "exit preempted", "running", "none"."""
  word = status.split()[-1] if status.startswith("exit ") else ""
  return int(word) if word.isdigit() else None


@dataclasses.dataclass
class Supervisor:
  """The preemption-restart loop of one job on one slice (or queued resource)."""
  run: Runner
  tpu: gcloud.Slice
  hardware: gcloud.Hardware
  source: actions.Source
  job: actions.Job
  policy: Policy = Policy()
  sleep: Callable[[float], None] = time.sleep
  log: Callable[[str], None] = _stderr_log

  def __post_init__(self):
    self.restarts = 0
    self.failures = 0       # consecutive failed steps, for the backoff
    self.launched = False   # the job was started (or found running) on the current slice
    self.job_unknown = False  # the last probe of the job's state failed (ssh): a failed step, backed off

  @property
  def dead_states(self) -> set[str]:
    """States that mean the slice must be recreated."""
    return DEAD_QUEUED if self.tpu.queued else DEAD

  def supervise(self) -> int:
    """Runs until the job succeeds (returns 0), fails for good (its exit code) or the restarts are used
    up (returns 1)."""
    first, last_state = True, None
    while True:
      state = actions.slice_state(self.run, self.tpu)
      if state != last_state:
        self.log(f"{self.tpu.name} is {state}")
        last_state = state
      if state in self.dead_states:
        if not (first and state == actions.MISSING) and not self._count_restart(f"the slice is {state}"):
          return 1
        ok = self._recreate(state)
      elif state in UP:
        outcome = self._check_job()
        if outcome is not None:
          return outcome
        ok = self.launched and not self.job_unknown
      else:  # CREATING, WAITING_FOR_RESOURCES, PROVISIONING, SUSPENDING, REPAIRING; UNKNOWN: gcloud failed
        ok = state != actions.UNKNOWN
      first = False
      self.failures = 0 if ok else self.failures + 1
      if self.failures > self.policy.max_restarts:
        unseen = state == actions.UNKNOWN or (state in UP and self.job_unknown)
        self.log(f"giving up after {self.failures} failed steps in a row" + (
            ": gcloud could not read the slice's or the job's state (see its reason above); the job may "
            "still be running" if unseen else ""))
        return 1
      if state in self.dead_states and ok:
        continue  # just recreated: look at the new slice at once
      self.sleep(self._backoff() if self.failures else self.policy.poll_seconds)

  def _check_job(self) -> int | None:
    """Launches the job on a fresh slice, or reads its state; returns an exit code when done."""
    status = actions.job_state(self.run, self.tpu, self.job.name)
    self.job_unknown = status == actions.UNKNOWN
    if not self.launched:
      if status == "running":
        self.log(f"job {self.job.name} is already running: watching it")
        self.launched = True
      elif status != actions.UNKNOWN:   # unknown (an ssh that failed): a launch would kill a live job
        self._launch()
      return None
    if status == "exit 0":
      self.log(f"job {self.job.name} finished (exit 0)")
      return 0
    code = _exit_code(status)
    if code == STOPPED_EXIT_CODE:
      preempted = actions.preempted_anywhere(self.run, self.tpu, self.job.name)
      if preempted is None:   # ask again at the next poll
        self.job_unknown = True
        return None
      if preempted:
        if not self._count_restart(f"job {self.job.name} stopped ({status}) as another worker was preempted"):
          return 1
        self._launch()
        return None
      self.log(f"job {self.job.name} stopped ({status}: a SIGTERM to the job, as `stop` sends; a pretraining run "
               "saves a checkpoint first, and `run` again resumes it): not restarting")
      return code
    if code in FINAL_EXIT_CODES:
      self.log(f"job {self.job.name} ended ({status}: {FINAL_EXIT_CODES[code]}); a restart would fail the same "
               "way: not restarting, see the job's log")
      return code
    if status.startswith("exit") or status == "none":
      why = ": a peer host died" if code == RESTART_EXIT_CODE else ""
      if not self._count_restart(f"job {self.job.name} ended ({status}{why}) on a live slice"):
        return 1
      self._launch()
    return None

  def _count_restart(self, why: str) -> bool:
    if self.restarts >= self.policy.max_restarts:
      self.log(f"{why}; giving up after {self.restarts} restarts")
      return False
    self.restarts += 1
    self.log(f"{why}: restart {self.restarts}/{self.policy.max_restarts}")
    return True

  def _recreate(self, state: str) -> bool:
    self.launched = False
    if state != actions.MISSING:
      self.log(f"deleting {self.tpu.name}")
      if not self.run(gcloud.delete(self.tpu)).ok:
        self.log(f"deleting {self.tpu.name} failed")
        return False
    self.log(f"creating {self.tpu.name}")
    if not self.run(gcloud.create(self.tpu, self.hardware)).ok:
      self.log(f"creating {self.tpu.name} failed")
      return False
    return True

  def _launch(self) -> None:
    self.log(f"setting up the workers and starting job {self.job.name}")
    self.launched = (actions.setup(self.run, self.tpu, self.source)
                     and actions.start(self.run, self.tpu, self.job))
    if not self.launched:
      self.log("setup or start failed: will retry")

  def _backoff(self) -> float:
    return min(self.policy.backoff_seconds * 2 ** (self.failures - 1), self.policy.max_backoff_seconds)

  def print_plan(self, dry: DryRun) -> None:
    """--dry-run: the commands of each kind of step, in the order the loop uses them."""
    dead = "/".join(sorted(self.dead_states - {actions.MISSING}))
    dry.comment(f"every {self.policy.poll_seconds:g} s: the slice's state, then the job's on worker 0")
    actions.slice_state(dry, self.tpu)
    actions.job_state(dry, self.tpu, self.job.name)
    dry.comment("slice up, job not running: set up the workers and start the job")
    actions.setup(dry, self.tpu, self.source)
    actions.start(dry, self.tpu, self.job)
    dry.comment(f"slice {dead} (or gone): delete and recreate it, then set up and start as above")
    dry(gcloud.delete(self.tpu))
    dry(gcloud.create(self.tpu, self.hardware))
