"""Two processes on 127.0.0.1 (jax.distributed, gloo CPU collectives) train, checkpoint and resume;
when one dies or hangs (the coordinator too), the other exits for a restart within the heartbeat
timeout; a SIGTERM to one makes both save and exit.

Each process has 2 CPU devices; the 4 form one (data, fsdp, tensor) = (1, 2, 2) mesh, so the batch is
split across processes and every step all-reduces between them.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import REPO_ROOT
from test_train import data_dir  # noqa: F401  (the prepared-corpus fixture)

WORKER = textwrap.dedent("""
    import json, sys
    process_id, port, data_dir, workdir, steps, scan, init_from = sys.argv[1:]
    import jax
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=int(process_id), initialization_timeout=120)
    from bert_jax import train
    from test_train import tiny_config
    config = tiny_config(data_dir, train_steps=int(steps), checkpoint_every=1000, eval_steps=0,
                         init_from=init_from, init_from_params_only=bool(init_from),
                         **{"optimizer.total_steps": 20, "model.scan_layers": scan == "scan"})
    results = train.train_and_evaluate(config, workdir)
    print("RESULT " + json.dumps({"processes": jax.process_count(), "devices": jax.device_count(),
                                  "loss": results["train/loss"]}), flush=True)
""")
TIMEOUT_S = 300


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch_pair(data_dir, workdir, steps, scan=False, init_from="") -> list[dict]:
  """Runs both processes to completion (or kills both); returns each one's RESULT line. `scan`: the
  model's layers scanned; `init_from`: a checkpoint to take the params from."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2",
             PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]))
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), str(port), data_dir, workdir, str(steps),
                             "scan" if scan else "unrolled", init_from],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  # One failing process leaves the other waiting in a collective: show the end of both outputs.
  assert [p.returncode for p in procs] == [0, 0], "\n\n".join(
      f"process {i} (exit {p.returncode}):\n{out[-2000:]}" for i, (p, out) in enumerate(zip(procs, outputs)))
  results = []
  for out in outputs:
    results.append(json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[len("RESULT "):]))
  return results


def _logged_steps(workdir) -> list[int]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [m["step"] for m in map(json.loads, f) if "train/loss" in m]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_train_checkpoint_and_resume(data_dir, tmp_path):  # noqa: F811
  workdir = str(tmp_path / "run")
  first = _launch_pair(data_dir, workdir, steps=4)
  assert [r["processes"] for r in first] == [2, 2] and [r["devices"] for r in first] == [4, 4]
  # Both processes see the same globally reduced loss.
  assert first[0]["loss"] == first[1]["loss"]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4"]

  second = _launch_pair(data_dir, workdir, steps=6)
  assert second[0]["loss"] == second[1]["loss"]
  # The second launch resumed at step 4: steps 1-4 are not trained (nor logged) again.
  assert _logged_steps(workdir) == [1, 2, 3, 4, 5, 6]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4", "6"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_resume_a_scanned_run_unrolled(data_dir, tmp_path):  # noqa: F811
  """The checkpoint of a run with its layers scanned, sharded over both processes, resumed with them
  unrolled: the params and Adam moments are laid out anew on each host (`checkpoint_layout.relayout`)."""
  workdir = str(tmp_path / "run")
  _launch_pair(data_dir, workdir, steps=4, scan=True)
  second = _launch_pair(data_dir, workdir, steps=6)
  assert second[0]["loss"] == second[1]["loss"]
  assert _logged_steps(workdir) == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_start_from_a_hugging_face_directory(data_dir, tmp_path):  # noqa: F811
  """`init_from` a Hugging Face directory with the params sharded over both processes: the parts it lacks
  (the MLM and NSP heads) stay as initialised on the mesh, where no process can fetch them whole."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import checkpoints_hf  # pylint: disable=g-import-not-at-top
  from bert_jax.models import encoder  # pylint: disable=g-import-not-at-top
  from test_train import tiny_config  # pylint: disable=g-import-not-at-top
  cfg = train.bert_config(tiny_config(data_dir))
  ids = jax.numpy.zeros([1, 8], jax.numpy.int32)
  params = jax.jit(encoder.BertEncoder(cfg).init)(jax.random.key(7), ids)["params"]
  checkpoints_hf.save_hf(str(tmp_path / "hf"), cfg, {"bert": jax.device_get(params)})
  results = _launch_pair(data_dir, str(tmp_path / "run"), steps=2, init_from=str(tmp_path / "hf"))
  assert results[0]["loss"] == results[1]["loss"]


def _cli(process_id: int, port: int, data_dir, workdir, heartbeat_s: int) -> list[str]:  # noqa: F811
  """`bert-jax pretrain` as one process of a two-process job (the tiny config, endless)."""
  from test_train import TINY  # pylint: disable=g-import-not-at-top
  changes = {**TINY, "data.train_files": data_dir, "train_steps": 100_000, "checkpoint_every": 4, "eval_steps": 0,
             "distributed.coordinator_address": f"127.0.0.1:{port}", "distributed.num_processes": 2,
             "distributed.process_id": process_id, "distributed.heartbeat_timeout_seconds": heartbeat_s}
  return [sys.executable, "-m", "bert_jax.main", f"--config={REPO_ROOT}/configs/tiny.py", f"--workdir={workdir}",
          *[f"--config.{k}={v}" for k, v in changes.items()]]


def _signal_process_group(proc, signum) -> None:
  """Signals every process of a host (`bert-jax pretrain` and what it started), as a host's death would."""
  try:
    os.killpg(proc.pid, signum)
  except ProcessLookupError:
    pass


@contextlib.contextmanager
def _cli_pair(data_dir, workdir, heartbeat_s):  # noqa: F811
  """Starts the two processes, each in a session of its own (a host), and yields them past step 6 with
  checkpoint 4 committed (a peer stopped during the save would leave it unfinished); kills what is left."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
  port = _free_port()
  procs = [subprocess.Popen(_cli(i, port, data_dir, workdir, heartbeat_s), cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
           for i in range(2)]
  try:
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline and all(p.poll() is None for p in procs):
      if (os.path.exists(os.path.join(workdir, "metrics.jsonl")) and max(_logged_steps(workdir), default=0) >= 6
          and os.path.isdir(os.path.join(workdir, "checkpoints", "4"))):
        break
      time.sleep(0.05)
    assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
    yield procs
  finally:
    for p in procs:
      if p.poll() is None:
        _signal_process_group(p, signal.SIGKILL)
        p.wait()
      p.stdout.close()
      p.stderr.close()


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("how,victim", [("killed", 1), ("hung", 1), ("killed", 0), ("hung", 0)],
                         ids=["peer_killed", "peer_hung", "coordinator_killed", "coordinator_hung"])
def test_survivor_of_a_dead_peer_exits_for_a_restart_within_the_bound(how, victim, data_dir, tmp_path):  # noqa: F811
  """One process is killed (its sockets close) or stopped (it hangs, a host gone silent) after step 6:
  the other exits with the "restart the job" code and one message, within the heartbeat timeout.

  Process 0 also runs the coordination service: when it is gone, JAX's C++ client aborts the survivor's
  job process (SIGABRT, a C++ stack trace), and the parent process of `bert-jax pretrain` says why instead.
  """
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  workdir, heartbeat_s, survivor = str(tmp_path / "run"), 10, 1 - victim
  with _cli_pair(data_dir, workdir, heartbeat_s) as procs:
    _signal_process_group(procs[victim], signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    start = time.time()
    _, err = procs[survivor].communicate(timeout=TIMEOUT_S)
    seconds = time.time() - start
  assert procs[survivor].returncode == failures.RESTART, err[-3000:]
  assert seconds < heartbeat_s + 5, seconds
  lines = [l for l in err.splitlines() if l.startswith("bert-jax")]
  assert len(lines) == 1 and "Exiting with code 75 so that the supervisor restarts the whole job" in lines[0], err
  assert lines[0].startswith(f"bert-jax pretrain (process {survivor}): "), lines[0]
  assert "Traceback" not in err and "Check failure" not in err and "*** " not in err, err[-3000:]
  assert "4" in os.listdir(os.path.join(workdir, "checkpoints"))   # the checkpoint before is intact
  print(f"{how} process {victim}: process {survivor} exited with {procs[survivor].returncode} after {seconds:.1f} s: "
        f"{lines[0]}")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sigterm_to_one_process_saves_both_at_one_step_and_exits_143(data_dir, tmp_path):  # noqa: F811
  """A supervisor's SIGTERM reaches the job process under `bert-jax pretrain`: JAX's preemption service
  picks one step for both processes, they save it and exit 143, stopped (the one that ends first is no lost
  peer)."""
  workdir = str(tmp_path / "run")
  with _cli_pair(data_dir, workdir, heartbeat_s=10) as procs:
    procs[1].send_signal(signal.SIGTERM)   # to the pid of `bert-jax pretrain` only, not its child
    outputs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
  assert [p.returncode for p in procs] == [143, 143], [err[-2000:] for _, err in outputs]
  assert not [l for _, err in outputs for l in err.splitlines() if l.startswith("bert-jax")], outputs
  saved = max(_logged_steps(workdir))
  assert f"preempted: saved checkpoint at step {saved}, exiting" in outputs[0][0]
  assert str(saved) in os.listdir(os.path.join(workdir, "checkpoints"))
