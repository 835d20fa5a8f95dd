"""The steps the launcher and the supervisor share: set up workers, start the job, read states.

Each step sends its commands through a runner (launch/runner.py) and reports success; nothing here
sleeps or loops.
"""

import dataclasses
import shlex
import sys

from launch import gcloud
from launch import remote
from launch.runner import Runner

MISSING = "MISSING"  # the node or queued resource does not exist
UNKNOWN = "UNKNOWN"  # gcloud failed for another reason (network, permissions): no decision on it


@dataclasses.dataclass(frozen=True)
class Source:
  """Where workers get the project: a git URL (and ref), or a local directory sent as a tarball."""
  git_url: str | None = None
  git_ref: str | None = None
  local_dir: str | None = None
  tarball: str = "/tmp/bert_jax-src.tar.gz"  # where the local directory is packed first
  jax_version: str = remote.JAX_VERSION
  python_version: str = remote.PYTHON_VERSION

  def __post_init__(self):
    if bool(self.git_url) == bool(self.local_dir):
      raise ValueError("give either a git URL or a local source directory")


@dataclasses.dataclass(frozen=True)
class Job:
  """The command every worker runs (e.g. `bert-jax pretrain --config=...`), given its --workdir."""
  command: tuple[str, ...]
  workdir: str
  env: tuple[tuple[str, str], ...] = ()
  name: str = "train"
  compilation_cache: str | None = None  # e.g. gs://BUCKET/jax-cache, shared by restarts

  def __post_init__(self):
    if not self.command:
      raise ValueError("no command to run (put it after `--`)")
    if not self.workdir.startswith("gs://"):
      raise ValueError(f"the workdir must be on GCS (gs://...), got {self.workdir!r}: "
                       "every worker and every restarted slice must see the same checkpoints")
    if any(arg.startswith("--workdir") for arg in self.command):
      raise ValueError("give the workdir with --workdir, not inside the command")

  def argv(self) -> list[str]:
    """The command with the --workdir flag appended."""
    return [*self.command, f"--workdir={self.workdir}"]

  def environment(self) -> dict[str, str]:
    """Environment variables exported before the command."""
    env = dict(self.env)
    if self.compilation_cache:
      env["JAX_COMPILATION_CACHE_DIR"] = self.compilation_cache
    return env


def setup(run: Runner, tpu: gcloud.Slice, source: Source) -> bool:
  """Installs pinned jax[tpu] and the project on every worker."""
  if source.local_dir:
    if not run(pack_command(source)).ok or not run(gcloud.scp_to_all(tpu, source.tarball, remote.TARBALL)).ok:
      return False
  script = remote.setup(git_url=source.git_url, git_ref=source.git_ref,
                        jax_version=source.jax_version, python_version=source.python_version)
  return run(gcloud.ssh_all(tpu, script)).ok


def pack_command(source: Source) -> list[str]:
  """The tar of the local checkout: in a git checkout, the files git tracks or would track, so that what
  .gitignore keeps out (runs/, prepared/, workdir*/, where the docs put a user's outputs) stays home; in
  another directory, all of it (a copy inside another repository that ignores it too: git would list
  nothing). Either way without VCS data, caches and build metadata, and without a tracked file deleted
  since (no tar option skips one in both GNU tar and macOS' bsdtar)."""
  files = ("if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && ! git check-ignore -q . 2>/dev/null; "
           "then git ls-files -z --cached --others --exclude-standard; "
           "else find . -path ./.git -prune -o ! -type d -print0; fi")
  present = "while IFS= read -r -d '' f; do if [ -e \"$f\" ] || [ -L \"$f\" ]; then printf '%s\\0' \"$f\"; fi; done"
  tar = ["tar", "--exclude=.git", "--exclude=__pycache__", "--exclude=*.egg-info", "--exclude=.pytest_cache",
         "--null", "-T", "-", "-czf", source.tarball]
  script = f"cd {shlex.quote(source.local_dir)} && {{ {files}; }} | {present} | {shlex.join(tar)}"
  return ["bash", "-o", "pipefail", "-c", script]


def start(run: Runner, tpu: gcloud.Slice, job: Job) -> bool:
  """Starts the job in the background on every worker at once."""
  return run(gcloud.ssh_all(tpu, remote.run(job.argv(), env=job.environment(), job=job.name))).ok


def slice_state(run: Runner, tpu: gcloud.Slice) -> str:
  """READY, PREEMPTED, ... for a node; ACTIVE, SUSPENDED, ... for a queued resource; or MISSING."""
  result = run(gcloud.state_query(tpu), capture=True)
  if result.ok:
    return result.stdout.strip() or UNKNOWN
  if "NOT_FOUND" in result.stderr or "not found" in result.stderr:
    return MISSING
  return _unknown(result)


def job_state(run: Runner, tpu: gcloud.Slice, job_name: str) -> str:
  """What worker 0 of slice 0 says of the job: "running", "exit N", "exit preempted", or "none"."""
  result = run(gcloud.ssh_one(tpu, remote.job_state(job_name)), capture=True)
  lines = result.stdout.strip().splitlines()
  return lines[-1].strip() if result.ok and lines else _unknown(result)


def preempted_anywhere(run: Runner, tpu: gcloud.Slice, job_name: str) -> bool | None:
  """Whether a worker of any slice says the job was preempted (launch/job.sh's "exit preempted": its VM shut down).
  In a job of several hosts JAX's preemption service stops the others too, saved, with 143: on worker 0 that
  reads as `stop`'s SIGTERM. None where gcloud could not ask every worker."""
  result = run(gcloud.ssh_all(tpu, remote.job_state(job_name)), capture=True)
  if any(line.strip().endswith("exit preempted") for line in (result.stdout or "").splitlines()):
    return True   # even where another worker (say the preempted one, still down) could not be reached
  if not result.ok:
    _unknown(result)
    return None
  return False


def _unknown(result) -> str:
  """UNKNOWN, with gcloud's reason on stderr: a lasting one (an expired login, a missing permission, another
  project) would otherwise only show as a supervisor polling without end. A dry run's command was printed,
  not run: UNKNOWN, silently."""
  if result.dry_run:
    return UNKNOWN
  reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
  print(f"gcloud failed (exit {result.returncode}): {reason}", file=sys.stderr, flush=True)
  return UNKNOWN
