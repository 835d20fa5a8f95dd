"""What runs on the workers, run here in bash against a temporary $HOME; and the launcher's hygiene:
no credentials, project ids, buckets or zones in launch/, and the pinned jax is the project's."""

import configparser
import importlib.metadata
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from packaging.requirements import Requirement

from launch import gcloud
from launch import remote

REPO = pathlib.Path(__file__).resolve().parents[1]
# A job that checkpoints on SIGTERM and exits 143 (stopped, not finished), like `bert-jax pretrain`.
JOB = [sys.executable, "-c",
       "import signal, sys, time\n"
       "signal.signal(signal.SIGTERM, lambda *_: (print('saved', flush=True), sys.exit(143)))\n"
       "print('step 1', flush=True)\n"
       "time.sleep(60)"]


@pytest.fixture
def worker(tmp_path):
  """A fake worker home: the source tree (with launch/job.sh) where setup would have put it."""
  (tmp_path / "bert_jax" / "launch").mkdir(parents=True)
  shutil.copy(REPO / "launch" / "job.sh", tmp_path / "bert_jax" / "launch" / "job.sh")
  env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}

  def sh(script: str) -> str:
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          check=True, timeout=20).stdout.strip()

  def wait_for(script: str, expected: str) -> str:
    for _ in range(200):
      out = sh(script)
      if out == expected:
        return out
      time.sleep(0.05)
    return out

  yield tmp_path, sh, wait_for
  pid = tmp_path / "bert_jax_logs" / "train.pid"
  if pid.exists():  # the job is ours: never leave it behind
    try:
      os.kill(int(pid.read_text()), signal.SIGKILL)
    except ProcessLookupError:
      pass


def test_run_detaches_then_stop_checkpoints_and_exits_143(worker):
  home, sh, wait_for = worker
  started = time.time()
  sh(remote.run(JOB, env={"MY_FLAG": "a b"}))
  assert time.time() - started < 5  # returned at once: the job runs in the background
  assert wait_for(remote.job_state(), "running") == "running"
  assert wait_for("tail -n 1 $HOME/bert_jax_logs/train.log", "step 1") == "step 1"  # handler is set
  sh(remote.stop())
  assert wait_for(remote.job_state(), "exit 143") == "exit 143"
  log = (home / "bert_jax_logs" / "train.log").read_text()
  assert log.startswith("=== ") and "train starts" in log and log.endswith("step 1\nsaved\n")


def test_env_reaches_the_job_and_the_job_runs_from_the_source_dir(worker):
  home, sh, wait_for = worker
  probe = [sys.executable, "-c", "import os; print(os.environ['MY_FLAG'], os.getcwd())"]
  sh(remote.run(probe, env={"MY_FLAG": "it's here"}, job="probe"))
  assert wait_for(remote.job_state("probe"), "exit 0") == "exit 0"
  assert (home / "bert_jax_logs" / "probe.log").read_text().splitlines()[-1] == f"it's here {home}/bert_jax"


def test_sigterm_to_the_wrapper_marks_preempted_not_finished(worker):
  home, sh, wait_for = worker
  sh(remote.run(JOB, env={}))
  assert wait_for(remote.job_state(), "running") == "running"
  job_pid = int((home / "bert_jax_logs" / "train.pid").read_text())
  wrapper_pid = int(subprocess.run(["ps", "-o", "ppid=", "-p", str(job_pid)], capture_output=True,
                                   text=True, check=True).stdout)
  os.kill(wrapper_pid, signal.SIGTERM)  # what a VM shutdown does to every process
  assert wait_for(remote.job_state(), "exit preempted") == "exit preempted"


def test_a_failing_job_reports_its_status_and_a_new_run_clears_it(worker):
  _, sh, wait_for = worker
  assert sh(remote.job_state()) == "none"
  sh(remote.run([sys.executable, "-c", "raise SystemExit(3)"], env={}))
  assert wait_for(remote.job_state(), "exit 3") == "exit 3"
  sh(remote.run(JOB, env={}))
  assert wait_for(remote.job_state(), "running") == "running"
  assert wait_for("tail -n 1 $HOME/bert_jax_logs/train.log", "step 1") == "step 1"  # handler is set
  sh(remote.stop())
  assert wait_for(remote.job_state(), "exit 143") == "exit 143"


def test_a_new_run_ends_a_hung_previous_instance_first(worker):
  home, sh, wait_for = worker
  hung = [sys.executable, "-c", "import signal, time\n"
          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('hung', flush=True)\ntime.sleep(60)"]
  sh(remote.run(hung, env={}))
  assert wait_for("tail -n 1 $HOME/bert_jax_logs/train.log", "hung") == "hung"
  first = int((home / "bert_jax_logs" / "train.pid").read_text())
  sh(remote.run(JOB, env={}))
  assert wait_for("tail -n 1 $HOME/bert_jax_logs/train.log", "step 1") == "step 1"
  assert int((home / "bert_jax_logs" / "train.pid").read_text()) != first
  with pytest.raises(ProcessLookupError):
    os.kill(first, 0)
  assert f"killing the previous train (pid {first})" in (home / "bert_jax_logs" / "train.log").read_text()
  sh(remote.stop())
  assert wait_for(remote.job_state(), "exit 143") == "exit 143"


def test_a_new_run_over_a_live_job_reads_running_not_the_old_job_s_kill(worker):
  """The wrapper of the job killed for the new one does not write its 137 over the new job's state."""
  home, sh, wait_for = worker
  sh(remote.run(JOB, env={}))
  assert wait_for(remote.job_state(), "running") == "running"
  # Its first line written before the second run kills it (a loaded machine starts Python late).
  assert wait_for("tail -n 1 $HOME/bert_jax_logs/train.log", "step 1") == "step 1"
  first = int((home / "bert_jax_logs" / "train.pid").read_text())
  sh(remote.run(JOB, env={}))
  # grep -c exits 1 when it counts 0 lines: the count, not the exit status, is waited for.
  assert wait_for("grep -c 'step 1' $HOME/bert_jax_logs/train.log || true", "2") == "2"
  assert int((home / "bert_jax_logs" / "train.pid").read_text()) != first
  time.sleep(0.5)   # the killed job's wrapper has long returned from its wait
  assert sh(remote.job_state()) == "running"
  sh(remote.stop())
  assert wait_for(remote.job_state(), "exit 143") == "exit 143"


def test_a_reused_pid_is_neither_stopped_nor_taken_for_the_job(worker):
  home, sh, _ = worker
  stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    (home / "bert_jax_logs").mkdir()
    (home / "bert_jax_logs" / "train.pid").write_text(f"{stranger.pid}\n")
    assert sh(remote.job_state()) == "none"
    sh(remote.stop())
    time.sleep(0.2)
    assert stranger.poll() is None  # still alive
  finally:
    stranger.kill()
    stranger.wait()
    (home / "bert_jax_logs" / "train.pid").unlink()


# --- hygiene ----------------------------------------------------------------------------------

SECRETS = {
    "API key": r"AIza[0-9A-Za-z_\-]{35}",
    "private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    "service account key": r"\"type\"\s*:\s*\"service_account\"",
    "service account": r"[a-z0-9-]+@[a-z0-9-]+\.iam\.gserviceaccount\.com",
    "OAuth token": r"ya29\.[0-9A-Za-z_\-]+",
    "secret assignment": r"(?i)(api[_-]?key|secret|password|token)\s*[=:]\s*['\"][^'\"]{8,}",
    "project id": r"--project[= ]['\"]?(?![A-Z$<{])[a-z][a-z0-9-]{4,28}[a-z0-9]",
    "bucket": r"gs://(?![A-Z$<{])[a-z0-9][a-z0-9._-]{2,}",
    "zone": r"\b(us|europe|asia|northamerica|southamerica|australia|me|africa)-[a-z]+\d+-[a-z]\b",
}


def offences(text: str) -> list[str]:
  return [name for name, pattern in SECRETS.items() if re.search(pattern, text)]


def test_the_scan_catches_what_it_looks_for():
  fake_key = "AIza" + "B" * 35
  bad = [fake_key, "-----BEGIN RSA PRIVATE KEY-----", '"type": "service_account"',
         "runner@my-proj.iam.gserviceaccount.com", "ya29.a0AfH6SMB", 'token = "abcdefgh12345"',
         "--project=my-project-123", "gs://my-bucket/run", "--zone=us-central2-b"]
  assert [offences(text) for text in bad] == [[name] for name in SECRETS]
  good = ["--project=PROJECT", "--project=$PROJECT", "gs://BUCKET/run", "gs://$BUCKET/run",
          '--zone="$ZONE"', "f\"--project={self.project}\"", "v5litepod-256", "tpu-ubuntu2204-base"]
  assert [text for text in good if offences(text)] == []


def test_no_credentials_project_ids_buckets_or_zones_in_launch():
  files = [p for p in (REPO / "launch").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
  assert {p.name for p in files} >= {"README.md", "tpu.py", "gcloud.py", "job.sh"}
  found = {str(p.relative_to(REPO)): offences(p.read_text()) for p in files}
  assert {path: what for path, what in found.items() if what} == {}


def test_pinned_jax_is_the_projects():
  cfg = configparser.ConfigParser()
  cfg.read(REPO / "setup.cfg")
  jax_req = next(Requirement(line) for line in cfg["options"]["install_requires"].split("\n")
                 if line.strip().startswith("jax"))
  assert remote.JAX_VERSION in jax_req.specifier
  assert remote.JAX_VERSION == importlib.metadata.version("jax")  # what the tests here run with


@pytest.mark.parametrize("accelerator_type, chips, hosts", [
    ("v3-8", 4, 1), ("v3-128", 64, 16), ("v4-8", 4, 1), ("v4-128", 64, 16), ("v5p-256", 128, 32),
    ("v5litepod-8", 8, 1), ("v5litepod-16", 16, 4), ("v5litepod-256", 256, 64), ("v6e-256", 256, 64),
    ("V3-128", 64, 16),
])
def test_chips_and_hosts(accelerator_type, chips, hosts):
  assert gcloud.chips_and_hosts(accelerator_type) == (chips, hosts)


def test_accelerator_types_go_to_gcloud_in_its_spelling_and_unknown_generations_pass():
  assert gcloud.Hardware(accelerator_type="V3-128").shape_flags() == ["--accelerator-type=v3-128"]
  gcloud.check_accelerator_type("tpu7x-8")   # a generation not known here: its sizes are gcloud's to check
