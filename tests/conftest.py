"""Test setup: 8 fake CPU devices, so every sharding is exercised on one host.

The flags must be set before jax is imported anywhere, hence here, at the top. The 8 devices' threads share
two cores here: a collective's participants can arrive further apart than XLA:CPU's 40 s before it aborts
the process (a finetuning subprocess beside the test session did, once), so its collectives wait longer.
"""

import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_cpu_collective_call_terminate_timeout_seconds=600 "
                      "--xla_cpu_collective_timeout_seconds=600")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


_STARTED = pytest.StashKey[float]()
# Under a budget the training, resume, mesh and multihost modules run first and the benchmark and analysis
# commands' last, so that a run cut short leaves out the latter first.
_FIRST_UNDER_A_BUDGET = ("tests/test_train.py", "tests/test_multihost.py", "tests/test_mesh.py",
                         "tests/test_objectives.py", "tests/test_quickstart.py")
_LAST_UNDER_A_BUDGET = ("tests/test_bench_", "tests/test_analyze_")
_NOT_STARTED = "not started: this run's --time-budget"


def pytest_addoption(parser):
  parser.addoption("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="start no test after SECONDS of this run; those not started are reported as skipped "
                        "(CI gives its slow run what is left of its time limit)")


def pytest_xdist_auto_num_workers(config):
  """Workers for `-n auto` (setup.cfg): one a core this process may run on, at most 8. In one process the
  default tests kept 0.9 of 2 cores busy (CPU time over wall time: most of a test is XLA compiling, on one
  thread); two workers kept 1.5 busy and ran them in 711 s against 1,101 s, on the same machine that hour.
  Whole modules go to a worker (`--dist loadfile`); beyond 8 the longest module bounds the run, and each
  worker is a process of its own with TensorFlow and JAX loaded."""
  del config
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  return max(1, min(cores, 8))


# Modules whose tests share a session fixture too costly to set up once per worker run on one worker, as one
# unit of `--dist loadfile`: the MiniLM finetune (about 110 s) of `minilm_rotten_tomatoes`.
_ONE_WORKER = {"tests/test_predict.py": "tests/test_finetune_train.py"}


def pytest_xdist_make_scheduler(config, log):
  """`--dist loadfile` with the modules of `_ONE_WORKER` sent to one worker together; other modes as xdist has them."""
  if config.getvalue("dist") != "loadfile":
    return None
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  class LoadFileSharingFixtures(LoadFileScheduling):

    def _split_scope(self, nodeid):
      scope = super()._split_scope(nodeid)
      return _ONE_WORKER.get(scope, scope)

  return LoadFileSharingFixtures(config, log)


def pytest_sessionstart(session):
  session.config.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  budget = item.config.getoption("--time-budget")
  if budget is not None and time.monotonic() - item.config.stash[_STARTED] > budget:
    pytest.skip(f"{_NOT_STARTED} of {budget:.0f} s was spent")


def pytest_terminal_summary(terminalreporter, config):
  if config.getoption("--time-budget") is None:
    return
  left = [r.nodeid for r in terminalreporter.stats.get("skipped", []) if _NOT_STARTED in str(r.longrepr)]
  terminalreporter.write_line(f"--time-budget: {len(left)} tests not started" + "".join(f"\n  {n}" for n in left))


def pytest_collection_modifyitems(config, items):
  if config.getoption("--time-budget") is not None:
    items.sort(key=lambda item: (not item.nodeid.startswith(_FIRST_UNDER_A_BUDGET))
               + item.nodeid.startswith(_LAST_UNDER_A_BUDGET))   # stable: file order within each group


def shared_path(*parts: str) -> pathlib.Path:
  """A path under ../shared/data; the calling test is skipped when it is absent."""
  path = SHARED_DATA.joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} not available (real-data test)")
  return path


def assert_one_line_errors(command: list[str], cases: dict, cwd, common: tuple = ()) -> None:
  """Runs `python -m bert_jax.cli *command *common *argv` for each `argv` of `cases` at once, in `cwd` on the CPU;
  each must exit 2 with one line on stderr that starts with its message (a user's mistake, no traceback)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  procs = {argv: subprocess.Popen([sys.executable, "-m", "bert_jax.cli", *command, *common, *argv], cwd=cwd, env=env,
                                  stderr=subprocess.PIPE, text=True) for argv in cases}
  for argv, message in cases.items():
    _, err = procs[argv].communicate(timeout=300)
    assert procs[argv].returncode == 2 and err.startswith(message) and err.count("\n") == 1, (argv, err[-3000:])


@pytest.fixture(scope="session")
def compilation_cache_dir(tmp_path_factory) -> str:
  """One persistent compilation cache for the whole run. JAX opens its cache once per process, at the
  first directory it is given: one directory keeps this process and the CLI processes the tests start
  (which get it by environment) on the same entries, so a tiny step compiled by one is loaded by the next."""
  return str(tmp_path_factory.mktemp("jax_cache"))


def compilation_cache_env(path: str) -> dict[str, str]:
  """The environment variables that point a JAX process at the cache in `path`, for every entry."""
  return {"JAX_COMPILATION_CACHE_DIR": path, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


@pytest.fixture(scope="session")
def minilm_rotten_tomatoes(tmp_path_factory) -> tuple[pathlib.Path, dict]:
  """(workdir, results) of one short finetune of the real MiniLM on rotten_tomatoes, shared by the tests
  that need it: 960 training sentences (30 steps) of at most 40 tokens, every dev sentence.

  It runs as `bert-jax finetune` in its own process (one CPU device, as a user's): the command users run,
  and a process of its own rather than this long-lived one.
  """
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp("minilm_rotten_tomatoes") / "run"
  argv = [sys.executable, "-m", "bert_jax.cli", "finetune", "--config=configs/finetune/sst2.py",
          f"--workdir={workdir}", f"--config.init_checkpoint={shared_path('minilm')}",
          f"--config.data_dir={shared_path('tasks', 'rotten_tomatoes')}", "--config.max_seq_length=40",
          "--config.max_train_examples=960", "--config.num_epochs=1", "--config.learning_rate=2e-4"]
  # One device: on 8 CPU devices this subprocess's collectives stalled (an abort at XLA:CPU's timeout, or no
  # end in 900 s) in two full slow runs beside the test session, not on its own; the cause is not found.
  run = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, XLA_FLAGS=""))
  assert run.returncode == 0, (run.returncode, run.stdout[-2000:], run.stderr[-5000:])
  return workdir, json.loads((workdir / "results.json").read_text())


def shipped_bert_large_steps() -> list:
  """pytest params (model fields, whether the mesh splits over tensor) of each distinct way
  `configs/bert_large.py` computes a (topology, phase) of its MESHES, named by the first entry with it:
  every field of `models.config.COMPUTE_FIELDS` and `scan_layers` as the whole config has it (the entry's
  own, and what it takes from bert_base.py), at BertConfig's default where the config leaves it. The
  LayerNorm kernel "pallas" is "interpret" here: the kernel itself in Pallas' interpreter, where "pallas"
  would take XLA's ops on a CPU."""
  from bert_jax.models import config as model_config  # pylint: disable=g-import-not-at-top
  from configs import bert_large  # pylint: disable=g-import-not-at-top
  fields, defaults = model_config.COMPUTE_FIELDS + ("scan_layers",), model_config.BertConfig()
  cases = {}
  for topology, phase in bert_large.MESHES:
    c = bert_large.get_config(f"{phase},{topology}")
    model = {name: c.model.get(name, getattr(defaults, name)) for name in fields}
    if model["layer_norm_kernel"] == "pallas":
      model["layer_norm_kernel"] = "interpret"
    cases.setdefault((tuple(sorted(model.items())), c.mesh.tensor > 1), f"{topology}:{phase}")
  return [pytest.param(dict(model), tensor, id=name) for (model, tensor), name in cases.items()]


def shipped_steps_in_ci(*more: str) -> list:
  """`shipped_bert_large_steps`, all but two (and `more`) marked `exhaustive` (left out of the slow run and CI).
  v5e:8x8's phase 1 has the decoder and the lookup on shards, the fused query-key-value matmul, remat, the stack
  unrolled and the tensor split; v3:8x8's `phase1_tokens` the hash bits, the attention projections gathered
  once and the scanned loop. Each switch of the other seven is in one of those two or is tested on its own, but
  two: the LayerNorm kernel (a function of its inputs alone; it trains to the plain step's losses on a mesh,
  tests/test_layer_norm_kernel.py) and v5e phase 2's unconstrained attention layout (a sharding hint, no
  state). Combinations of switches other than those steps' are run by `-m exhaustive` only."""
  kept = ("v5e:8x8:phase1", "v3:8x8:phase1_tokens") + more
  return [p if p.id in kept else pytest.param(*p.values, id=p.id, marks=pytest.mark.exhaustive)
          for p in shipped_bert_large_steps()]
