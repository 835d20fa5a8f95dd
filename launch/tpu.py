r"""Cloud TPU launcher: one command per step, from creating a slice to deleting it.

  python -m launch.tpu create    NAME --accelerator-type=v3-128 [--spot] [--queued --node-count=2]
  python -m launch.tpu setup     NAME (--git-url=URL [--git-ref=REF] | --source=DIR)
  python -m launch.tpu run       NAME --workdir=gs://BUCKET/run -- bert-jax pretrain --config=...
  python -m launch.tpu logs      NAME [--follow] [--worker=all] | --collect=DIR
  python -m launch.tpu status    NAME
  python -m launch.tpu stop      NAME          # SIGTERM: the job saves a checkpoint and exits
  python -m launch.tpu delete    NAME
  python -m launch.tpu supervise NAME <create, setup and run flags> -- bert-jax pretrain ...

Every subcommand takes --zone, --project (both optional: gcloud's defaults otherwise), --queued /
--node-count / --node-prefix (a queued resource, several slices for Multislice) and --dry-run,
which prints each command, shell-quoted, one per line, instead of running it.
"""

import argparse
import os
import tempfile
import sys

from launch import actions
from launch import gcloud
from launch import remote
from launch import supervisor
from launch.runner import DryRun, Runner, Subprocess


def _common_flags() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("name", help="TPU VM name, or queued resource id (--queued)")
  p.add_argument("--zone", help="e.g. the zone of your quota; default: gcloud's compute/zone")
  p.add_argument("--project", help="default: gcloud's core/project")
  p.add_argument("--queued", action="store_true", help="a queued resource instead of a TPU VM")
  p.add_argument("--node-count", type=int, default=1,
                 help="slices in the queued resource (Multislice when > 1; implies --queued)")
  p.add_argument("--node-prefix", help="names of the slices: PREFIX-0, PREFIX-1, ... (default NAME)")
  p.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
  return p


def _create_flags() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(add_help=False)
  shape = p.add_mutually_exclusive_group(required=True)
  shape.add_argument("--accelerator-type", help="e.g. v3-128 (64 chips), v4-128, v5litepod-256")
  shape.add_argument("--type", dest="tpu_type", help="TPU generation with --topology, e.g. v4")
  p.add_argument("--topology", help="chip topology with --type, e.g. 4x4x4")
  p.add_argument("--version", help="TPU software (runtime) version; default: "
                 + ", ".join(f"{k}: {v}" for k, v in gcloud.RUNTIME_VERSIONS.items()))
  lifetime = p.add_mutually_exclusive_group()
  lifetime.add_argument("--spot", action="store_true", help="Spot TPUs (cheaper, preemptible)")
  lifetime.add_argument("--preemptible", action="store_true", help="preemptible TPU VM (legacy)")
  p.add_argument("--valid-until-duration", help="queued resources: give up waiting after, e.g. 6h")
  p.add_argument("--create-arg", action="append", default=[],
                 help="extra flag for the create command, verbatim (repeatable), e.g. --network=NET")
  return p


def _setup_flags() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(add_help=False)
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--git-url", help="clone the project from this repository on every worker")
  src.add_argument("--source", help="send this local checkout (e.g. .) to every worker as a tarball")
  p.add_argument("--git-ref", help="branch, tag or commit to check out (with --git-url)")
  p.add_argument("--tarball", help="local tarball path (--source; default: bert_jax-src-NAME.tar.gz in the "
                 "temporary directory, one a slice)")
  p.add_argument("--jax-version", default=remote.JAX_VERSION, help="installs jax[tpu]==VERSION")
  p.add_argument("--python", default=remote.PYTHON_VERSION, help="Python of the workers' virtualenv")
  return p


def _run_flags() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("--workdir", required=True, help="gs://BUCKET/DIR: checkpoints, logs; resumes from it")
  p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                 help="environment variable for the job (repeatable), e.g. LIBTPU_INIT_ARGS=...")
  p.add_argument("--compilation-cache", help="JAX compilation cache dir, e.g. gs://BUCKET/jax-cache")
  return p


def _job_flag() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("--job", default="train", help="job name: ~/bert_jax_logs/JOB.log on the workers")
  return p


def parser() -> argparse.ArgumentParser:
  """The argument parser of every subcommand."""
  top = argparse.ArgumentParser(prog="python -m launch.tpu", description=__doc__,
                                usage="python -m launch.tpu SUBCOMMAND NAME [flags] [-- command]",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = top.add_subparsers(dest="subcommand", required=True)
  common, create, setup, run, job = (_common_flags(), _create_flags(), _setup_flags(),
                                     _run_flags(), _job_flag())
  sub.add_parser("create", parents=[common, create], help="create a TPU VM slice or a queued resource")
  sub.add_parser("setup", parents=[common, setup], help="install jax[tpu] and the project on all workers")
  sub.add_parser("run", parents=[common, run, job], help="start a command on all workers, in the background")
  logs = sub.add_parser("logs", parents=[common, job], help="show, follow or collect a job's logs")
  logs.add_argument("--worker", default="0", help="worker index, or all (with --follow / tail)")
  logs.add_argument("--node", type=int, default=0, help="which slice of a Multislice job")
  logs.add_argument("--lines", type=int, default=100)
  logs.add_argument("--follow", action="store_true", help="tail -F until interrupted")
  logs.add_argument("--collect", metavar="DIR", help="copy every worker's log into DIR")
  logs.add_argument("--accelerator-type", help="with --collect: how many workers each slice has")
  logs.add_argument("--workers", type=int, help="with --collect: workers per slice")
  sub.add_parser("status", parents=[common, job], help="state and health of the slice, and of the job")
  sub.add_parser("stop", parents=[common, job], help="SIGTERM the job on all workers (it checkpoints)")
  sub.add_parser("delete", parents=[common], help="delete the slice or queued resource")
  sup = sub.add_parser("supervise", parents=[common, create, setup, run, job],
                       help="run the job, and recreate the slice and restart it after preemptions")
  sup.add_argument("--poll-seconds", type=float, default=300.0)
  sup.add_argument("--max-restarts", type=int, default=20)
  sup.add_argument("--backoff-seconds", type=float, default=60.0)
  sup.add_argument("--max-backoff-seconds", type=float, default=1800.0)
  return top


# --- from flags to the launcher's objects -------------------------------------------------------


def _slice(a) -> gcloud.Slice:
  return gcloud.Slice(a.name, zone=a.zone, project=a.project, queued=a.queued or a.node_count > 1,
                      node_count=a.node_count, node_prefix=a.node_prefix)


def _hardware(a) -> gcloud.Hardware:
  return gcloud.Hardware(runtime_version=a.version, accelerator_type=a.accelerator_type,
                         tpu_type=a.tpu_type, topology=a.topology, spot=a.spot,
                         preemptible=a.preemptible, valid_until_duration=a.valid_until_duration,
                         extra_flags=tuple(a.create_arg))


def _source(a, dry_run: bool = False) -> actions.Source:
  if a.git_ref and not a.git_url:
    raise ValueError("--git-ref needs --git-url")
  if a.source and not dry_run and not os.path.isdir(a.source):   # before any slice: its tar would fail for hours
    raise ValueError(f"--source {a.source!r} is not a directory")
  local = os.path.abspath(a.source) if a.source else None
  tarball = a.tarball or os.path.join(tempfile.gettempdir(), f"bert_jax-src-{a.name}.tar.gz")
  return actions.Source(git_url=a.git_url, git_ref=a.git_ref, local_dir=local, tarball=tarball,
                        jax_version=a.jax_version, python_version=a.python)


def _job(a) -> actions.Job:
  env = []
  for item in a.env:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise ValueError(f"--env takes KEY=VALUE, got {item!r}")
    env.append((key, value))
  return actions.Job(tuple(a.command), a.workdir, tuple(env), a.job, a.compilation_cache)


# --- subcommands --------------------------------------------------------------------------------


def _logs(run: Runner, tpu: gcloud.Slice, a) -> bool:
  if not 0 <= a.node < tpu.node_count:
    raise ValueError(f"--node {a.node}: the slice has nodes 0 to {tpu.node_count - 1}")
  if not a.collect:
    return run(gcloud.ssh_one(tpu, remote.tail(a.job, a.lines, a.follow), worker=a.worker, node=a.node)).ok
  workers = a.workers or (gcloud.chips_and_hosts(a.accelerator_type)[1] if a.accelerator_type else None)
  if not workers:
    raise ValueError("--collect needs --workers or --accelerator-type")
  if not isinstance(run, DryRun):
    os.makedirs(a.collect, exist_ok=True)
  ok = True
  for node in range(tpu.node_count):
    for worker in range(workers):
      local = os.path.join(a.collect, f"{a.job}.node{node}.worker{worker}.log")
      ok &= run(gcloud.scp_from(tpu, remote.log_path(a.job), local, worker, node)).ok
  return ok


def _status(run: Runner, tpu: gcloud.Slice, a) -> bool:
  ok = run(gcloud.describe(tpu)).ok
  job = actions.job_state(run, tpu, a.job)
  if not isinstance(run, DryRun):
    print(f"job {a.job} on worker 0: {job}")
  return ok


def execute(a, run: Runner) -> int:
  """Runs the parsed subcommand `a` through `run`; returns the process exit code."""
  tpu = _slice(a)
  if a.subcommand == "create":
    ok = run(gcloud.create(tpu, _hardware(a))).ok
  elif a.subcommand == "setup":
    ok = actions.setup(run, tpu, _source(a, isinstance(run, DryRun)))
  elif a.subcommand == "run":
    ok = actions.start(run, tpu, _job(a))
  elif a.subcommand == "logs":
    ok = _logs(run, tpu, a)
  elif a.subcommand == "status":
    ok = _status(run, tpu, a)
  elif a.subcommand == "stop":
    ok = run(gcloud.ssh_all(tpu, remote.stop(a.job))).ok
  elif a.subcommand == "delete":
    ok = run(gcloud.delete(tpu)).ok
  else:
    policy = supervisor.Policy(a.poll_seconds, a.max_restarts, a.backoff_seconds, a.max_backoff_seconds)
    hardware = _hardware(a)
    gcloud.create(tpu, hardware)   # its flags checked now: on an existing slice it runs after a deletion
    sup = supervisor.Supervisor(run, tpu, hardware, _source(a, isinstance(run, DryRun)), _job(a), policy)
    if isinstance(run, DryRun):
      sup.print_plan(run)
      return 0
    return sup.supervise()
  return 0 if ok else 1


def parse(argv: list[str]) -> argparse.Namespace:
  """The job's command follows `--` (run, supervise): everything after it is passed on verbatim."""
  split = argv.index("--") if "--" in argv else len(argv)
  a = parser().parse_args(argv[:split])
  a.command = argv[split + 1:]
  if "--dry-run" in a.command:  # it would be passed to the job, and everything before it would run
    parser().error("--dry-run goes before `--` (after `--` comes the job's own command)")
  if a.subcommand in ("create", "supervise") and bool(a.tpu_type) != bool(a.topology):
    parser().error("--type and --topology go together")
  return a


def main(argv: list[str] | None = None) -> int:
  """Entry point of `python -m launch.tpu`; returns the exit code."""
  a = parse(list(sys.argv[1:] if argv is None else argv))
  try:
    return execute(a, DryRun() if a.dry_run else Subprocess())
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except FileNotFoundError as e:
    if e.filename != "gcloud":
      raise
    print("error: gcloud not found on PATH: install the Google Cloud CLI (cloud.google.com/sdk)", file=sys.stderr)
    return 2
  except KeyboardInterrupt:  # e.g. the end of `logs --follow`; the slice and the job keep running
    return 130


if __name__ == "__main__":
  sys.exit(main())
