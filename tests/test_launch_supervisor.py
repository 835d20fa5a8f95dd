"""The supervisor against a scripted fake gcloud: preemption, restart, give-up, backoff. No sleeping."""

import shlex

import pytest

from launch import actions
from launch import gcloud
from launch import supervisor
from launch import tpu
from launch.runner import Result

JOB_PROBE = "echo running"  # a fragment only the job-state command has


class FakeGcloud:
  """Answers state queries and job probes from scripts; every other command succeeds (or fails
  when its line contains a string of `fail`). Records every command, shell-quoted."""

  def __init__(self, states, jobs, fail=()):
    self.states, self.jobs, self.fail = list(states), list(jobs), list(fail)
    self.calls = []

  def __call__(self, argv, *, capture=False):
    line = shlex.join(argv)
    self.calls.append(line)
    if "--format=value(state" in line:
      state = self.states.pop(0)
      if state == "MISSING":
        return Result(1, "", f"ERROR: (gcloud) NOT_FOUND: Resource '{argv[5]}' was not found")
      return Result(0, state + "\n") if state != "UNREACHABLE" else Result(1, "", "ERROR: network")
    if JOB_PROBE in line:
      job = self.jobs.pop(0)
      return Result(0, job + "\n") if job != "UNREACHABLE" else Result(255, "", "ssh: connect: timed out")
    if self.fail and self.fail[0] in line:
      self.fail.pop(0)
      return Result(1, "", "ERROR: no capacity")
    return Result(0)

  def kinds(self):
    """Each call named by its gcloud verb: state, job, create, delete, setup, start."""
    names = []
    for line in self.calls:
      if "--format=value(state" in line:
        names.append("state")
      elif JOB_PROBE in line:
        names.append("job")
      elif " create " in line or " delete " in line:
        names.append(line.split()[4])
      elif "venv --clear" in line:
        names.append("setup")
      elif "job.sh" in line:
        names.append("start")
      else:
        names.append(line)
    return names


SINGLE = gcloud.Slice("bert-large", zone="ZONE")
MULTI = gcloud.Slice("big", zone="ZONE", queued=True, node_count=2)
V3 = gcloud.Hardware(accelerator_type="v3-128", spot=True)
V5E = gcloud.Hardware(accelerator_type="v5litepod-256", spot=True)
SOURCE = actions.Source(git_url="https://github.com/ORG/bert_jax.git")
JOB = actions.Job(("bert-jax", "pretrain", "--config=configs/bert_large.py:phase1"), "gs://BUCKET/phase1")


def make(tpu, hw, fake, **policy):
  sleeps, logs = [], []
  sup = supervisor.Supervisor(fake, tpu, hw, SOURCE, JOB, supervisor.Policy(**policy),
                              sleep=sleeps.append, log=logs.append)
  return sup, sleeps, logs


def test_preempted_slice_is_deleted_recreated_set_up_and_restarted():
  fake = FakeGcloud(states=["READY", "READY", "PREEMPTED", "CREATING", "READY", "READY", "READY"],
                    jobs=["none", "running", "none", "running", "exit 0"])
  sup, sleeps, logs = make(SINGLE, V3, fake, poll_seconds=60)
  assert sup.supervise() == 0
  assert fake.kinds() == [
      "state", "job", "setup", "start",          # a live slice, no job yet: launch it
      "state", "job",                            # running
      "state", "delete", "create",               # preempted: recreate
      "state",                                   # still creating
      "state", "job", "setup", "start",          # up again: same command, resumes from checkpoints
      "state", "job",                            # running
      "state", "job"]                            # exit 0: done
  assert sleeps == [60] * 5  # none right after the recreate
  assert sup.restarts == 1
  assert "bert-large is PREEMPTED" in logs and "the slice is PREEMPTED: restart 1/20" in logs
  assert logs[-1] == "job train finished (exit 0)"
  # The exact recreate commands, and the identical relaunch.
  assert fake.calls[7:9] == [
      "gcloud compute tpus tpu-vm delete bert-large --zone=ZONE --quiet",
      "gcloud compute tpus tpu-vm create bert-large --zone=ZONE --accelerator-type=v3-128 "
      "--version=tpu-ubuntu2204-base --spot"]
  assert fake.calls[3] == fake.calls[13] and fake.calls[2] == fake.calls[12]
  assert fake.calls[0] == "gcloud compute tpus tpu-vm describe bert-large --zone=ZONE '--format=value(state)'"


def test_multislice_suspended_queued_resource_is_recreated():
  fake = FakeGcloud(states=["ACTIVE", "SUSPENDING", "SUSPENDED", "WAITING_FOR_RESOURCES", "PROVISIONING",
                            "ACTIVE", "ACTIVE"],
                    jobs=["running", "none", "exit 0"])
  sup, sleeps, _ = make(MULTI, V5E, fake, poll_seconds=30)
  assert sup.supervise() == 0
  assert fake.kinds() == ["state", "job", "state", "state", "delete", "create", "state", "state",
                          "state", "job", "setup", "start", "state", "job"]
  assert fake.calls[4:6] == [
      "gcloud compute tpus queued-resources delete big --zone=ZONE --force --quiet",
      "gcloud compute tpus queued-resources create big --zone=ZONE --accelerator-type=v5litepod-256 "
      "--runtime-version=v2-alpha-tpuv5-lite --node-count=2 --node-prefix=big --spot"]
  assert fake.calls[1].startswith("gcloud compute tpus tpu-vm ssh big-0 --zone=ZONE --quiet --worker=0 ")
  assert fake.calls[11].startswith(
      "gcloud compute tpus queued-resources ssh big --zone=ZONE --quiet --node=all --worker=all '--command=")
  assert "--workdir=gs://BUCKET/phase1" in fake.calls[11]
  assert sleeps == [30] * 5


def test_a_missing_slice_at_start_is_created_without_counting_a_restart():
  fake = FakeGcloud(states=["MISSING", "READY", "READY"], jobs=["none", "exit 0"])
  sup, sleeps, _ = make(SINGLE, V3, fake)
  assert sup.supervise() == 0
  assert fake.kinds() == ["state", "create", "state", "job", "setup", "start", "state", "job"]
  assert sup.restarts == 0
  assert sleeps == [300]  # the new slice is looked at again at once


def test_a_slice_gone_later_is_recreated_without_delete():
  fake = FakeGcloud(states=["READY", "MISSING", "READY", "READY"], jobs=["running", "none", "exit 0"])
  sup, _, _ = make(SINGLE, V3, fake)
  assert sup.supervise() == 0
  assert fake.kinds() == ["state", "job", "state", "create", "state", "job", "setup", "start",
                          "state", "job"]
  assert sup.restarts == 1


def test_a_running_job_is_watched_not_relaunched():
  fake = FakeGcloud(states=["READY", "UNREACHABLE", "READY"], jobs=["running", "exit 0"])
  sup, sleeps, logs = make(SINGLE, V3, fake)
  assert sup.supervise() == 0
  assert "setup" not in fake.kinds() and "start" not in fake.kinds()
  assert "job train is already running: watching it" in logs and "bert-large is UNKNOWN" in logs
  assert sleeps == [300, 60]   # the state gcloud could not read is a failed step: backed off


def test_a_job_whose_state_cannot_be_read_on_attach_is_not_launched_over(capsys):
  """A launch would kill the job that may well be running there; the next poll decides."""
  fake = FakeGcloud(states=["READY"] * 3, jobs=["UNREACHABLE", "running", "exit 0"])
  sup, _, logs = make(SINGLE, V3, fake)
  assert sup.supervise() == 0
  assert "setup" not in fake.kinds() and "start" not in fake.kinds()
  assert "job train is already running: watching it" in logs
  assert "gcloud failed (exit 255): ssh: connect: timed out" in capsys.readouterr().err


def test_a_job_that_crashes_on_a_live_slice_is_restarted_in_place():
  fake = FakeGcloud(states=["READY"] * 4, jobs=["running", "exit 1", "running", "exit 0"])
  sup, _, logs = make(SINGLE, V3, fake)
  assert sup.supervise() == 0
  assert fake.kinds() == ["state", "job", "state", "job", "setup", "start", "state", "job", "state", "job"]
  assert "job train ended (exit 1) on a live slice: restart 1/20" in logs


def test_preempted_exit_marker_is_not_success():
  fake = FakeGcloud(states=["READY", "READY", "PREEMPTED", "READY", "READY"],
                    jobs=["running", "exit preempted", "none", "exit 0"])
  sup, _, _ = make(SINGLE, V3, fake, max_restarts=1)
  assert sup.supervise() == 1  # the job-level restart used the only one; the preemption is one more
  assert fake.kinds()[:6] == ["state", "job", "state", "job", "setup", "start"]


def test_a_job_stopped_with_143_is_restarted_where_another_worker_was_preempted():
  """Worker 0's 143 after JAX's preemption service spread another worker's shutdown: every worker is asked, one
  says "preempted", and the job restarts; where gcloud cannot ask them all, it asks again at the next poll."""
  fake = FakeGcloud(states=["READY"] * 4, jobs=["running", "exit 143", "UNREACHABLE", "exit 143",
                                                "exit 143\nexit preempted\nexit 143\nexit 143", "exit 0"])
  # A preempted worker's line counts even where another could not be reached (gcloud failed for it).
  run = lambda argv, capture=False: Result(255, "exit 143\nexit preempted\n", "ssh: connect: timed out")
  assert actions.preempted_anywhere(run, MULTI, "train") is True
  sup, _, logs = make(MULTI, V5E, fake)
  assert sup.supervise() == 0 and sup.restarts == 1
  assert fake.kinds() == ["state", "job", "state", "job", "job", "state", "job", "job", "setup", "start",
                          "state", "job"]
  assert "job train stopped (exit 143) as another worker was preempted: restart 1/20" in logs
  assert all("--worker=all" in fake.calls[i] for i in (4, 7))


def test_gives_up_after_max_restarts():
  fake = FakeGcloud(states=["PREEMPTED", "PREEMPTED", "PREEMPTED"], jobs=[])
  sup, _, logs = make(SINGLE, V3, fake, max_restarts=2)
  assert sup.supervise() == 1
  assert fake.kinds() == ["state", "delete", "create", "state", "delete", "create", "state"]
  assert logs[-1] == "the slice is PREEMPTED; giving up after 2 restarts"


def test_failed_creates_back_off_exponentially_up_to_the_cap():
  fake = FakeGcloud(states=["PREEMPTED", "MISSING", "MISSING", "MISSING", "MISSING", "READY", "READY"],
                    jobs=["none", "exit 0"], fail=["create"] * 4)
  sup, sleeps, logs = make(SINGLE, V3, fake, backoff_seconds=10, max_backoff_seconds=50)
  assert sup.supervise() == 0
  assert sleeps == [10, 20, 40, 50, 300]
  assert logs.count("creating bert-large failed") == 4
  assert sup.restarts == 5


def test_failed_setup_is_retried_with_backoff():
  fake = FakeGcloud(states=["READY"] * 3, jobs=["none", "none", "exit 0"], fail=["venv --clear"])
  sup, sleeps, logs = make(SINGLE, V3, fake, backoff_seconds=7)
  assert sup.supervise() == 0
  assert fake.kinds() == ["state", "job", "setup", "state", "job", "setup", "start", "state", "job"]
  assert sleeps == [7, 300]
  assert "setup or start failed: will retry" in logs


def test_consecutive_failures_are_bounded():
  fake = FakeGcloud(states=["READY"] * 3, jobs=["none"] * 3, fail=["venv --clear"] * 3)
  sup, sleeps, logs = make(SINGLE, V3, fake, max_restarts=2)
  assert sup.supervise() == 1
  assert logs[-1] == "giving up after 3 failed steps in a row"


@pytest.mark.parametrize("slice_or_job", ["slice", "job"])
def test_states_gcloud_cannot_read_back_off_and_are_bounded(slice_or_job):
  """An expired login or a lost permission fails every gcloud call: the supervisor gives up on it."""
  unreadable = ["UNREACHABLE"] * 4
  fake = (FakeGcloud(states=unreadable, jobs=[]) if slice_or_job == "slice" else
          FakeGcloud(states=["READY"] * 5, jobs=["running"] + unreadable))
  sup, sleeps, logs = make(SINGLE, V3, fake, max_restarts=2, backoff_seconds=10)
  assert sup.supervise() == 1
  assert sleeps == ([10, 20] if slice_or_job == "slice" else [300, 10, 20])
  assert logs[-1].startswith("giving up after 3 failed steps in a row: gcloud could not read")
  assert "start" not in fake.kinds() and "create" not in fake.kinds()


@pytest.mark.parametrize("state", ["CREATING", "REPAIRING", "SUSPENDING", "WAITING_FOR_RESOURCES"])
def test_transitional_states_only_wait(state):
  fake = FakeGcloud(states=[state, "READY", "READY"], jobs=["running", "exit 0"])
  sup, _, _ = make(SINGLE, V3, fake)
  assert sup.supervise() == 0
  assert "create" not in fake.kinds() and "delete" not in fake.kinds()


def test_supervise_subcommand_wires_its_flags_into_the_loop(capsys):
  fake = FakeGcloud(states=["MISSING", "WAITING_FOR_RESOURCES", "ACTIVE", "SUSPENDED"], jobs=["none"])
  a = tpu.parse(["supervise", "big", "--zone=ZONE", "--node-count=2", "--accelerator-type=v4-128", "--spot",
                 "--git-url=https://github.com/ORG/bert_jax.git", "--workdir=gs://BUCKET/phase1",
                 "--poll-seconds=0", "--max-restarts=0", "--job=phase1", "--",
                 "bert-jax", "pretrain", "--config=configs/bert_large.py:phase1"])
  assert tpu.execute(a, fake) == 1  # preempted with no restarts allowed
  assert fake.kinds() == ["state", "create", "state", "state", "job", "setup", "start", "state"]
  assert fake.calls[1] == ("gcloud compute tpus queued-resources create big --zone=ZONE --accelerator-type=v4-128 "
                           "--runtime-version=tpu-ubuntu2204-base --node-count=2 --node-prefix=big --spot")
  assert "phase1.exit" in fake.calls[4]
  assert ('"$HOME/bert_jax/launch/job.sh" phase1 bert-jax pretrain --config=configs/bert_large.py:phase1 '
          "--workdir=gs://BUCKET/phase1 >>") in fake.calls[6]
  assert "giving up after 0 restarts" in capsys.readouterr().err
