"""Shell commands run on every TPU VM worker (through `gcloud ... ssh --command=...`).

Layout on each worker, all under the login user's home:
  ~/bert_jax            the project's source (configs/ live here: jobs run from this directory)
  ~/bert_jax_venv       a virtualenv with the pinned jax[tpu] and the project
  ~/bert_jax_logs/JOB.{log,pid,exit}   a job's output, its process id, its exit status

Each command is one line (joined with &&), so a dry run prints one copy-pasteable line per command.
"""

import re
import shlex

# The jax the project is developed and tested with (setup.cfg allows a range; workers get exactly
# this one, with the libtpu it pins).
JAX_VERSION = "0.10.2"
# jax 0.10 needs Python >= 3.11; the TPU base images ship 3.10, so uv installs a standalone Python.
PYTHON_VERSION = "3.11"

SRC = "$HOME/bert_jax"
VENV = "$HOME/bert_jax_venv"
LOGS = "$HOME/bert_jax_logs"
TARBALL = "bert_jax-src.tar.gz"  # relative to the home directory (scp's remote side)
UV = "$HOME/.local/bin/uv"
UV_INSTALLER = "https://astral.sh/uv/install.sh"


def check_job_name(job: str) -> str:
  """Job names become file names in shell commands: keep them plain."""
  if not re.fullmatch(r"[A-Za-z0-9_.-]+", job):
    raise ValueError(f"job names use letters, digits, '_', '.', '-': got {job!r}")
  return job


def _dq(path: str) -> str:
  """Double quotes, so that $HOME still expands on the worker."""
  return f'"{path}"'


def setup(*, git_url: str | None = None, git_ref: str | None = None,
          jax_version: str = JAX_VERSION, python_version: str = PYTHON_VERSION) -> str:
  """Installs the project from a git URL (at `git_ref`) or from the scp'd tarball, and pinned jax[tpu].

  Idempotent: the source directory and the virtualenv are rebuilt from scratch each time.
  """
  if git_url:
    fetch = [f"git clone --quiet {shlex.quote(git_url)} {_dq(SRC)}"]
    if git_ref:
      fetch.append(f"git -C {_dq(SRC)} checkout --quiet {shlex.quote(git_ref)}")
  else:
    fetch = [f"mkdir -p {_dq(SRC)}", f"tar -xzf {_dq('$HOME/' + TARBALL)} -C {_dq(SRC)}"]
  steps = [
      f"rm -rf {_dq(SRC)}",
      *fetch,
      f"{{ [ -x {_dq(UV)} ] || curl -LsSf {UV_INSTALLER} | sh; }}",
      f"{_dq(UV)} venv --clear --python {python_version} {_dq(VENV)}",
      f"{_dq(UV)} pip install --python {_dq(VENV + '/bin/python')} "
      f'"jax[tpu]=={jax_version}" {_dq(SRC)}',
      f'{_dq(VENV + "/bin/python")} -c "import jax, bert_jax; print(jax.__version__)"',
  ]
  return " && ".join(steps)


def run(command: list[str], *, env: dict[str, str], job: str = "train") -> str:
  """Starts `command` in the background, detached from the ssh session, from the source directory.

  The venv's bin/ comes first on PATH, so `bert-jax ...` is the installed one. Output is appended to
  ~/bert_jax_logs/JOB.log; launch/job.sh ends a previous instance of JOB still alive on the worker,
  records the process id in JOB.pid (for `stop`) and the exit status, or "preempted", in JOB.exit
  (for the supervisor).
  """
  check_job_name(job)
  bad = [key for key in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)]
  if bad:
    raise ValueError(f"not environment variable names: {bad}")
  log, status = _dq(f"{LOGS}/{job}.log"), _dq(f"{LOGS}/{job}.exit")
  exports = [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
  wrapper = _dq(f"{SRC}/launch/job.sh")  # shipped with the source: records pid and exit status
  steps = [
      f"mkdir -p {_dq(LOGS)}",
      f"cd {_dq(SRC)}",
      f"rm -f {status}",
      f'export PATH={_dq(VENV + "/bin:$PATH")}',
      *exports,
      f'echo "=== $(date -u +%FT%TZ) $(hostname): {job} starts" >> {log}',
      f"{{ setsid nohup bash {wrapper} {job} {shlex.join(command)} >> {log} 2>&1 < /dev/null & }}",
  ]
  return " && ".join(steps)


def _job_alive(job: str) -> str:
  """A test that JOB.pid is a live process of this job (not a reused pid): job.sh tags its env."""
  pid = _dq(f"{LOGS}/{check_job_name(job)}.pid")
  return f"grep -qsxz BERT_JAX_JOB={job} /proc/$(cat {pid} 2>/dev/null)/environ"


def stop(job: str = "train") -> str:
  """SIGTERM to the job: it saves a checkpoint and exits with 143 (stopped, not finished)."""
  pid = _dq(f"{LOGS}/{check_job_name(job)}.pid")
  return f"if {_job_alive(job)}; then kill -TERM $(cat {pid}); fi"


def job_state(job: str = "train") -> str:
  """Prints `exit N` (N a status, or "preempted"), `running`, or `none` (never started here)."""
  status = _dq(f"{LOGS}/{check_job_name(job)}.exit")
  return (f"if [ -f {status} ]; then echo exit $(cat {status}); "
          f"elif {_job_alive(job)}; then echo running; else echo none; fi")


def tail(job: str = "train", lines: int = 100, follow: bool = False) -> str:
  """Prints the last `lines` of a job's log; with `follow`, keeps printing (tail -F)."""
  return f"tail -n {lines}{' -F' if follow else ''} {_dq(f'{LOGS}/{check_job_name(job)}.log')}"


def log_path(job: str = "train") -> str:
  """The log's path relative to the home directory (scp's remote side)."""
  return f"bert_jax_logs/{check_job_name(job)}.log"
