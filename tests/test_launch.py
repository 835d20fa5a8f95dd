"""The launcher's commands, exactly as `--dry-run` prints them (no gcloud, no network).

Two targets: BERT-large's single slice (v3-128: 64 chips, the v3:8x8 of `bert-jax aot`, 16 hosts)
and a Multislice job (2 x v5litepod-256 in one queued resource). Expected lines are written out by
hand, so a changed flag spelling fails here before it fails on a rented pod.
"""

import os
import subprocess

import pytest

from launch import tpu

SINGLE = ["bert-large", "--zone=ZONE"]
MULTI = ["big", "--zone=ZONE", "--node-count=2"]
PHASE1 = ["--", "bert-jax", "pretrain", "--config=configs/bert_large.py:phase1"]

TAR = ("bash -o pipefail -c 'cd /home/me/src && { if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && "
       "! git check-ignore -q . 2>/dev/null; then git ls-files -z --cached --others --exclude-standard; else find . "
       "-path ./.git -prune -o ! -type d -print0; fi; } | while IFS= read -r -d "
       '\'"\'"\'\'"\'"\' f; do if [ -e "$f" ] || [ -L "$f" ]; then printf \'"\'"\'%s\\0\'"\'"\' "$f"; fi; done | tar '
       '--exclude=.git --exclude=__pycache__ \'"\'"\'--exclude=*.egg-info\'"\'"\' --exclude=.pytest_cache '
       "--null -T - -czf /tmp/src.tgz'")
INSTALL = ('{ [ -x "$HOME/.local/bin/uv" ] || curl -LsSf https://astral.sh/uv/install.sh | sh; } && '
           '"$HOME/.local/bin/uv" venv --clear --python 3.11 "$HOME/bert_jax_venv" && '
           '"$HOME/.local/bin/uv" pip install --python "$HOME/bert_jax_venv/bin/python" '
           '"jax[tpu]==0.10.2" "$HOME/bert_jax" && '
           '"$HOME/bert_jax_venv/bin/python" -c "import jax, bert_jax; print(jax.__version__)"')
UNPACK = ('rm -rf "$HOME/bert_jax" && mkdir -p "$HOME/bert_jax" && '
          'tar -xzf "$HOME/bert_jax-src.tar.gz" -C "$HOME/bert_jax" && ')
CLONE = ('rm -rf "$HOME/bert_jax" && git clone --quiet https://github.com/ORG/bert_jax.git "$HOME/bert_jax" && '
         'git -C "$HOME/bert_jax" checkout --quiet v0.1.0 && ')
START = ('mkdir -p "$HOME/bert_jax_logs" && cd "$HOME/bert_jax" && rm -f "$HOME/bert_jax_logs/train.exit" && '
         'export PATH="$HOME/bert_jax_venv/bin:$PATH" && '
         "export LIBTPU_INIT_ARGS='\"'\"'--xla_a=true --xla_b=1'\"'\"' && "
         'export JAX_COMPILATION_CACHE_DIR=gs://BUCKET/jax-cache && '
         'echo "=== $(date -u +%FT%TZ) $(hostname): train starts" >> "$HOME/bert_jax_logs/train.log" && '
         '{ setsid nohup bash "$HOME/bert_jax/launch/job.sh" train '
         'bert-jax pretrain --config=configs/bert_large.py:phase1 --workdir=gs://BUCKET/phase1 '
         '>> "$HOME/bert_jax_logs/train.log" 2>&1 < /dev/null & }')
JOB_STATE = ('if [ -f "$HOME/bert_jax_logs/train.exit" ]; then echo exit $(cat "$HOME/bert_jax_logs/train.exit"); '
             'elif grep -qsxz BERT_JAX_JOB=train /proc/$(cat "$HOME/bert_jax_logs/train.pid" 2>/dev/null)/environ; '
             'then echo running; else echo none; fi')


@pytest.fixture(autouse=True)
def no_real_commands(monkeypatch):
  """A test that reaches subprocess.run would call the real gcloud: fail it instead."""
  def refuse(argv, **kwargs):
    raise AssertionError(f"a test tried to run {argv}")
  monkeypatch.setattr(subprocess, "run", refuse)


def with_dry_run(argv) -> list[str]:
  split = argv.index("--") if "--" in argv else len(argv)
  return [*argv[:split], "--dry-run", *argv[split:]]


def dry(capsys, *argv: str) -> list[str]:
  assert tpu.main(with_dry_run(argv)) == 0
  return capsys.readouterr().out.splitlines()


def test_create_single_slice_spot(capsys):
  assert dry(capsys, "create", *SINGLE, "--accelerator-type=v3-128", "--spot") == [
      "gcloud compute tpus tpu-vm create bert-large --zone=ZONE --accelerator-type=v3-128 "
      "--version=tpu-ubuntu2204-base --spot"]


def test_create_with_project_version_and_extra_flags(capsys):
  assert dry(capsys, "create", *SINGLE, "--project=PROJECT", "--type=v4", "--topology=4x4x4",
             "--version=RUNTIME", "--preemptible", "--create-arg=--network=NET") == [
      "gcloud compute tpus tpu-vm create bert-large --zone=ZONE --project=PROJECT --type=v4 "
      "--topology=4x4x4 --version=RUNTIME --preemptible --network=NET"]


def test_create_multislice_queued_resource(capsys):
  assert dry(capsys, "create", *MULTI, "--accelerator-type=v5litepod-256", "--spot",
             "--valid-until-duration=6h") == [
      "gcloud compute tpus queued-resources create big --zone=ZONE --accelerator-type=v5litepod-256 "
      "--runtime-version=v2-alpha-tpuv5-lite --node-count=2 --node-prefix=big "
      "--valid-until-duration=6h --spot"]


def test_create_one_slice_queued_resource_uses_node_id(capsys):
  assert dry(capsys, "create", "bert-large", "--queued", "--accelerator-type=v4-128") == [
      "gcloud compute tpus queued-resources create bert-large --accelerator-type=v4-128 "
      "--runtime-version=tpu-ubuntu2204-base --node-id=bert-large"]


def test_setup_single_slice_from_local_copy(capsys):
  assert dry(capsys, "setup", *SINGLE, "--source=/home/me/src", "--tarball=/tmp/src.tgz") == [
      TAR,
      "gcloud compute tpus tpu-vm scp /tmp/src.tgz bert-large:bert_jax-src.tar.gz --zone=ZONE --quiet --worker=all",
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=all '--command=" + UNPACK + INSTALL + "'"]


@pytest.mark.parametrize("in_git", [True, False, "ignored by the repository around it"])
def test_the_local_source_is_packed_without_what_git_ignores(tmp_path, in_git):
  """What .gitignore keeps out (the docs' output folders) stays home; outside git, all but caches; a copy
  inside another repository that ignores it, all but caches too (git would list none of it)."""
  from launch import actions   # pylint: disable=g-import-not-at-top
  src = tmp_path / "src"
  for name in ("bert_jax/a.py", "bert_jax/__pycache__/a.pyc", "runs/big/ckpt", "configs/mine.py", "old.py"):
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / name).write_text("x")
  (src / ".gitignore").write_text("/runs/\n__pycache__/\n")
  env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b",
         "PATH": os.environ["PATH"], "HOME": str(tmp_path)}
  if in_git == "ignored by the repository around it":
    (tmp_path / ".gitignore").write_text("src/\n")
    assert subprocess.Popen(["git", "init", "-q"], cwd=tmp_path, env=env).wait() == 0
  elif in_git:
    for argv in (["git", "init", "-q"], ["git", "add", "bert_jax/a.py", "old.py", ".gitignore"],
                 ["git", "commit", "-qm", "x"], ["git", "rm", "-q", "old.py"]):   # configs/mine.py: untracked
      assert subprocess.Popen(argv, cwd=src, env=env).wait() == 0
  tarball = tmp_path / "src.tgz"
  source = actions.Source(local_dir=str(src), tarball=str(tarball))
  assert subprocess.Popen(actions.pack_command(source), env=env).wait() == 0
  listed = subprocess.Popen(["tar", "-tzf", str(tarball)], stdout=subprocess.PIPE, text=True).communicate()[0]
  names = sorted(n.removeprefix("./") for n in listed.split() if not n.endswith("/"))
  kept = [".gitignore", "bert_jax/a.py", "configs/mine.py"]
  assert names == (kept if in_git is True else sorted(kept + ["runs/big/ckpt", "old.py"]))


def test_setup_multislice_from_git(capsys):
  assert dry(capsys, "setup", *MULTI, "--git-url=https://github.com/ORG/bert_jax.git", "--git-ref=v0.1.0") == [
      "gcloud compute tpus queued-resources ssh big --zone=ZONE --quiet --node=all --worker=all '--command="
      + CLONE + INSTALL + "'"]


def test_setup_pins_the_requested_jax(capsys):
  line, = dry(capsys, "setup", *SINGLE, "--git-url=U", "--jax-version=0.10.1", "--python=3.12")
  assert '"jax[tpu]==0.10.1"' in line and "--python 3.12" in line


RUN_FLAGS = ["--workdir=gs://BUCKET/phase1", "--env=LIBTPU_INIT_ARGS=--xla_a=true --xla_b=1",
             "--compilation-cache=gs://BUCKET/jax-cache"]


def test_run_single_slice_all_workers_in_background(capsys):
  assert dry(capsys, "run", *SINGLE, *RUN_FLAGS, *PHASE1) == [
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=all '--command=" + START + "'"]


def test_run_multislice_every_node_and_worker(capsys):
  assert dry(capsys, "run", *MULTI, *RUN_FLAGS, *PHASE1) == [
      "gcloud compute tpus queued-resources ssh big --zone=ZONE --quiet --node=all --worker=all '--command="
      + START + "'"]


def test_logs_follow_stream_and_collect(capsys):
  assert dry(capsys, "logs", *SINGLE, "--follow") == [
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=0 "
      "'--command=tail -n 100 -F \"$HOME/bert_jax_logs/train.log\"'"]
  assert dry(capsys, "logs", *SINGLE, "--worker=all", "--lines=20") == [
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=all "
      "'--command=tail -n 20 \"$HOME/bert_jax_logs/train.log\"'"]
  lines = dry(capsys, "logs", *SINGLE, "--collect=out", "--accelerator-type=v3-128")
  assert len(lines) == 16  # one per host of the 64-chip slice
  assert lines[0] == ("gcloud compute tpus tpu-vm scp bert-large:bert_jax_logs/train.log "
                      "out/train.node0.worker0.log --zone=ZONE --quiet --worker=0")
  assert lines[15] == ("gcloud compute tpus tpu-vm scp bert-large:bert_jax_logs/train.log "
                       "out/train.node0.worker15.log --zone=ZONE --quiet --worker=15")


def test_logs_collect_multislice_names_each_node(capsys):
  lines = dry(capsys, "logs", *MULTI, "--collect=out", "--workers=2", "--job=phase2")
  assert lines == [
      f"gcloud compute tpus tpu-vm scp big-{n}:bert_jax_logs/phase2.log out/phase2.node{n}.worker{w}.log "
      f"--zone=ZONE --quiet --worker={w}" for n in range(2) for w in range(2)]


def test_status_stop_delete_single_slice(capsys):
  assert dry(capsys, "status", *SINGLE) == [
      "gcloud compute tpus tpu-vm describe bert-large --zone=ZONE "
      "'--format=yaml(name,acceleratorType,runtimeVersion,state,health,healthDescription)'",
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=0 '--command=" + JOB_STATE + "'"]
  assert dry(capsys, "stop", *SINGLE) == [
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=all '--command="
      'if grep -qsxz BERT_JAX_JOB=train /proc/$(cat "$HOME/bert_jax_logs/train.pid" 2>/dev/null)/environ; '
      'then kill -TERM $(cat "$HOME/bert_jax_logs/train.pid"); fi\'']
  assert dry(capsys, "delete", *SINGLE) == [
      "gcloud compute tpus tpu-vm delete bert-large --zone=ZONE --quiet"]


def test_a_dry_run_s_status_reports_no_gcloud_failure(capsys):
  """Nothing runs in a dry run, so nothing failed: the job's state is unknown, silently."""
  assert tpu.main(with_dry_run(["status", *SINGLE])) == 0
  assert "gcloud failed" not in capsys.readouterr().err


def test_status_stop_delete_multislice(capsys):
  assert dry(capsys, "status", *MULTI)[0] == (
      "gcloud compute tpus queued-resources describe big --zone=ZONE '--format=yaml(name,state,tpu.nodeSpec)'")
  assert dry(capsys, "stop", *MULTI)[0].startswith(
      "gcloud compute tpus queued-resources ssh big --zone=ZONE --quiet --node=all --worker=all '--command=if")
  assert dry(capsys, "delete", *MULTI) == [
      "gcloud compute tpus queued-resources delete big --zone=ZONE --force --quiet"]


def test_supervise_dry_run_prints_the_plan(capsys):
  lines = dry(capsys, "supervise", *SINGLE, "--accelerator-type=v3-128", "--spot", "--source=/home/me/src",
              "--tarball=/tmp/src.tgz", *RUN_FLAGS, "--poll-seconds=120", *PHASE1)
  assert lines == [
      "# every 120 s: the slice's state, then the job's on worker 0",
      "gcloud compute tpus tpu-vm describe bert-large --zone=ZONE '--format=value(state)'",
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=0 '--command=" + JOB_STATE + "'",
      "# slice up, job not running: set up the workers and start the job",
      TAR,
      "gcloud compute tpus tpu-vm scp /tmp/src.tgz bert-large:bert_jax-src.tar.gz --zone=ZONE --quiet --worker=all",
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=all '--command=" + UNPACK + INSTALL + "'",
      "gcloud compute tpus tpu-vm ssh bert-large --zone=ZONE --quiet --worker=all '--command=" + START + "'",
      "# slice PREEMPTED/TERMINATED (or gone): delete and recreate it, then set up and start as above",
      "gcloud compute tpus tpu-vm delete bert-large --zone=ZONE --quiet",
      "gcloud compute tpus tpu-vm create bert-large --zone=ZONE --accelerator-type=v3-128 "
      "--version=tpu-ubuntu2204-base --spot"]


@pytest.mark.parametrize("argv, message", [
    (["run", *SINGLE, "--workdir=/tmp/run", *PHASE1], "must be on GCS"),
    (["run", *SINGLE, "--workdir=gs://B/r"], "no command"),
    (["run", *SINGLE, "--workdir=gs://B/r", "--", "bert-jax", "pretrain", "--workdir=gs://B/x"], "--workdir"),
    (["run", *SINGLE, "--workdir=gs://B/r", "--env=NOVALUE", *PHASE1], "KEY=VALUE"),
    (["run", *SINGLE, "--workdir=gs://B/r", "--job=a;b", *PHASE1], "job names"),
    (["create", *MULTI, "--accelerator-type=v4-128", "--preemptible"], "--spot, not --preemptible"),
    (["create", *SINGLE, "--accelerator-type=v4-8", "--valid-until-duration=1h"], "queued resource"),
    (["create", *SINGLE, "--accelerator-type=v9-8"], "pass --version"),
    (["create", *SINGLE, "--accelerator-type=v3-100"], "v3 slices come as v3-8, v3-32"),
    (["create", *SINGLE, "--accelerator-type=v5litepod-2"], "v5litepod slices come as"),
    (["create", *SINGLE, "--accelerator-type=v4-12"], "count TensorCores, 8 a host"),
    (["create", *SINGLE, "--accelerator-type=v3"], "give GENERATION-SIZE"),
    (["logs", *SINGLE, "--collect=out", "--accelerator-type=v3-100"], "v3 slices come as"),
    (["setup", *SINGLE, "--source=.", "--git-ref=main"], "--git-ref needs --git-url"),
    (["logs", *SINGLE, "--collect=out"], "--workers or --accelerator-type"),
    (["logs", *SINGLE, "--node=2"], "the slice has nodes 0 to 0"),
    (["supervise", *SINGLE, "--accelerator-type=v4-8", "--valid-until-duration=1h", "--source=.", *RUN_FLAGS, *PHASE1],
     "queued resource"),   # checked before a supervisor on an existing slice could delete it
])
def test_bad_flags_are_refused_before_any_command(capsys, argv, message):
  assert tpu.main(with_dry_run(argv)) == 2
  out, err = capsys.readouterr()
  assert out == "" and message in err


def test_dry_run_after_the_separator_is_refused(capsys):
  with pytest.raises(SystemExit) as exit_:
    tpu.main(["run", *SINGLE, "--workdir=gs://B/r", *PHASE1, "--dry-run"])
  assert exit_.value.code == 2 and "--dry-run goes before" in capsys.readouterr().err


@pytest.mark.parametrize("subcommand", ["", "create", "setup", "run", "logs", "status", "stop", "delete",
                                        "supervise"])
def test_every_subcommand_has_help(capsys, subcommand):
  with pytest.raises(SystemExit) as exit_:
    tpu.main([subcommand, "--help"] if subcommand else ["--help"])
  assert exit_.value.code == 0
  assert "--dry-run" in capsys.readouterr().out or not subcommand


def test_a_missing_source_directory_stops_before_any_command(capsys, monkeypatch):
  """Its tar would fail at every setup attempt, for hours, on a slice already made and billed."""
  ran = []
  monkeypatch.setattr(tpu, "Subprocess", lambda: ran.append)
  assert tpu.main(["setup", *SINGLE, "--source=/no/such/dir"]) == 2
  assert "--source '/no/such/dir' is not a directory" in capsys.readouterr().err and not ran


def test_no_gcloud_on_the_path_is_a_message_not_a_traceback(capsys, monkeypatch):
  def no_gcloud(argv, capture=False):
    raise FileNotFoundError(2, "No such file or directory", argv[0])
  monkeypatch.setattr(tpu, "Subprocess", lambda: no_gcloud)
  assert tpu.main(["status", *SINGLE]) == 2
  assert "gcloud not found on PATH" in capsys.readouterr().err
