"""The pretraining loop end to end on a tiny model and a small prepared corpus, the non-finite guard,
gradient accumulation, and exact resume after a real SIGTERM."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compilation_cache_env, shipped_steps_in_ci
from bert_jax.data import prepare
from bert_jax import failures
from bert_jax import sharding
from bert_jax import train
from bert_jax import train_setup
from configs import tiny

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny model: small enough that a step is milliseconds on the fake 8-device CPU mesh.
# Dropout is on: an exact resume must replay its keys.
TINY = {"model.vocab_size": 128, "model.hidden_size": 32, "model.num_layers": 1, "model.num_heads": 2,
        "model.intermediate_size": 64, "model.max_position_embeddings": 32, "model.hidden_dropout": 0.1,
        "model.attention_dropout": 0.1, "data.seq_length": 32, "data.max_predictions_per_seq": 5,
        "global_batch_size": 16, "optimizer.warmup_steps": 2, "optimizer.learning_rate": 5e-3,
        "optimizer.total_steps": 100, "log_every": 1, "eval_every": 1000, "eval_steps": 2,
        "checkpoint_every": 1000, "mesh.fsdp": 2, "mesh.tensor": 2}


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(compilation_cache_dir):
  """The tests here compile the same tiny train step many times (and in subprocesses): cache it."""
  path = compilation_cache_dir
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_min_entry_size_bytes")
  before = {name: getattr(jax.config, name) for name in names}
  for name, value in zip(names, (path, 0, 0)):
    jax.config.update(name, value)
  yield path
  for name, value in before.items():
    jax.config.update(name, value)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """A small corpus with a learnable pattern, prepared with its own 128-token vocabulary."""
  rng = np.random.default_rng(0)
  nouns = "king queen knight horse castle sword crown river forest dragon".split()
  verbs = "sees finds guards rides builds loses wears crosses".split()
  lines = []
  for _ in range(80):
    for _ in range(int(rng.integers(4, 12))):
      n1, n2 = rng.choice(nouns, 2)
      lines.append(f"the {rng.choice(['old', 'young', 'brave'])} {n1} {rng.choice(verbs)} the {n2} .")
    lines.append("")
  root = tmp_path_factory.mktemp("corpus")
  (root / "corpus.txt").write_text("\n".join(lines))
  out = str(root / "prepared")
  prepare.prepare_corpus(str(root / "corpus.txt"), out, train_vocab_size=128, eval_fraction=0.1,
                         num_shards=2, num_workers=1)
  return out


def tiny_config(data_dir, **changes):
  c = tiny.get_config()
  for key, value in {**TINY, "data.train_files": data_dir, **changes}.items():
    *path, last = key.split(".")
    target = c
    for p in path:
      target = target[p]
    target[last] = value
  return c


def test_a_workdir_holding_another_model_s_checkpoints_is_refused_before_anything_is_written(tmp_path):
  """Pretraining into the workdir of another run (another model) stops before it prepares data or writes its
  model config and tokenizer over that run's; the same model resumes, a workdir without checkpoints starts."""
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "20" / "state").mkdir(parents=True)   # a step, as checkpoint_loader sees one
  theirs = train.bert_config(tiny_config("unused", **{"model.hidden_size": 64}))
  record = json.dumps(theirs.to_hf_dict(), indent=2) + "\n"
  (workdir / "bert_config.json").write_text(record)
  config = tiny.get_config()   # the embedded corpus, prepared into <workdir>/data
  with pytest.raises(failures.UserError, match=r"holds the checkpoints of another model \(.*hidden_size.*\)"):
    train.train_and_evaluate(config, str(workdir))
  assert (workdir / "bert_config.json").read_text() == record and sorted(os.listdir(workdir)) == [
      "bert_config.json", "checkpoints"]
  from bert_jax import checkpoint_loader   # pylint: disable=g-import-not-at-top
  checkpoint_loader.check_run_model(str(workdir), theirs)   # the same model: a resumed run
  import dataclasses   # pylint: disable=g-import-not-at-top
  # Dropout has no parameters: a run may resume with another rate.
  checkpoint_loader.check_run_model(str(workdir), dataclasses.replace(theirs, hidden_dropout=0.0))
  shutil.rmtree(workdir / "checkpoints" / "20")
  checkpoint_loader.check_run_model(str(workdir), train.bert_config(config))   # no checkpoints: a fresh start
  finetuned = tmp_path / "finetuned"   # a finetuning run's workdir: refused before anything is written there
  finetuned.mkdir()
  (finetuned / "task.json").write_text("{}")
  with pytest.raises(failures.UserError, match="holds a finetuning run \\(task.json\\), not a pretraining run"):
    train.train_and_evaluate(config, str(finetuned))
  assert os.listdir(finetuned) == ["task.json"]


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def train_losses(workdir) -> dict[int, float]:
  return {m["step"]: m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m}


def _tensorboard_tags(workdir) -> set[str]:
  """Tags of the scalar summaries in the run's TensorBoard event files."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tags = set()
  for name in os.listdir(os.path.join(workdir, "tensorboard")):
    for event in tf.compat.v1.train.summary_iterator(os.path.join(workdir, "tensorboard", name)):
      tags |= {v.tag for v in event.summary.value if v.metadata.plugin_data.plugin_name == "scalars"}
  return tags


@pytest.mark.slow
def test_train_and_evaluate_end_to_end_then_resume(data_dir, tmp_path):
  workdir = str(tmp_path / "run")
  config = tiny_config(data_dir, train_steps=12, profile_start_step=3, profile_steps=2)
  results = train.train_and_evaluate(config, workdir)
  traces = [f for _, _, files in os.walk(os.path.join(workdir, "profile")) for f in files]
  assert any(f.endswith(".xplane.pb") for f in traces)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12"]
  assert _tensorboard_tags(workdir) >= {"train/loss", "train/mlm_accuracy", "eval/mlm_accuracy", "perf/steps_per_sec"}
  lines = read_metrics(workdir)
  assert [m["step"] for m in lines if "train/loss" in m] == list(range(1, 13))
  for key in ("train/mlm_accuracy", "train/nsp_accuracy", "train/learning_rate", "perf/steps_per_sec",
              "perf/tokens_per_sec", "perf/eta_s"):
    assert key in lines[0]
  assert 0.0 <= results["eval/mlm_accuracy"] <= 1.0 and "eval/nsp_accuracy" in results
  losses = train_losses(workdir)
  assert np.mean([losses[s] for s in (10, 11, 12)]) < np.mean([losses[s] for s in (1, 2, 3)])

  # A second call with more steps resumes from step 12 (state, schedule and data position).
  config.train_steps = 15
  train.train_and_evaluate(config, workdir)
  assert sorted(train_losses(workdir)) == list(range(1, 16))
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["12", "15"]

  # Another run initialized from it (as phase 2 from phase 1): full state continues at step 15 ...
  phase2 = str(tmp_path / "phase2")
  config.update({"init_from": os.path.join(workdir, "checkpoints"), "train_steps": 17})
  train.train_and_evaluate(config, phase2)
  assert sorted(train_losses(phase2)) == [16, 17]
  lr = {m["step"]: m["train/learning_rate"] for m in read_metrics(phase2)}
  assert lr[16] == pytest.approx(5e-3 * (1 - 15 / 100))   # the schedule continues
  # ... params only start over at step 0 with fresh optimizer moments.
  config.update({"init_from": os.path.join(workdir, "checkpoints", "12"), "init_from_params_only": True,
                 "train_steps": 2})
  train.train_and_evaluate(config, str(tmp_path / "params_only"))
  params_only = train_losses(str(tmp_path / "params_only"))
  assert sorted(params_only) == [1, 2]
  assert params_only[1] < losses[1] - 0.2   # same first batch, trained parameters


@pytest.mark.slow
def test_nonfinite_step_is_skipped_and_counted(data_dir):
  config = tiny_config(data_dir)
  mesh = sharding.create_mesh(config.mesh)
  s = train_setup.setup(config, mesh)
  state = s.init(jax.random.key(0))
  batch = {k: jnp.zeros(v.shape, v.dtype) for k, v in train_setup.abstract_batch(config).items()}
  batch = jax.device_put(batch, s.batch_shardings)
  poisoned = jax.tree.map(lambda p: p, state.params)
  poisoned["mlm"]["output_bias"] = state.params["mlm"]["output_bias"].at[3].set(jnp.nan)
  before = jax.device_get(poisoned)
  opt_before = jax.device_get(state.opt_state)
  new, metrics = s.train_step(state.replace(params=poisoned), batch, jax.random.key(1))
  assert int(new.step) == 1 and int(new.nonfinite_count) == 1 and int(new.nonfinite_streak) == 1
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(new.params), before)   # untouched
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(new.opt_state), opt_before)
  assert not np.isfinite(float(metrics["loss"]))


@pytest.mark.slow
def test_loop_stops_after_k_nonfinite_steps_in_a_row(data_dir, tmp_path, monkeypatch):
  create_iterator = train.create_iterator

  def poisoned_iterator(*args, **kwargs):   # NaN loss weights: every step's loss is NaN
    for batch in create_iterator(*args, **kwargs):
      yield dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"], np.nan))

  monkeypatch.setattr(train, "create_iterator", lambda *a, **k: _Resumable(poisoned_iterator(*a, **k)))
  config = tiny_config(data_dir, train_steps=20, max_nonfinite_steps=3)
  with pytest.raises(FloatingPointError, match="3 steps in a row had a non-finite"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  lines = read_metrics(str(tmp_path / "run"))
  assert [m["train/nonfinite_count"] for m in lines] == [1, 2, 3]


class _Resumable:
  def __init__(self, it):
    self.it = it

  def __next__(self):
    return next(self.it)

  def get_state(self):
    return {}


@pytest.mark.slow
def test_gradient_accumulation_matches_one_big_batch(data_dir):
  no_dropout = {"model.hidden_dropout": 0.0, "model.attention_dropout": 0.0}
  outs = []
  for micro_batches in (1, 4):
    config = tiny_config(data_dir, micro_batches=micro_batches, **no_dropout)
    s = train_setup.setup(config, sharding.create_mesh(config.mesh))
    it = train.create_iterator(config.data, config, split="train")
    batch = sharding.global_batch(next(it), s.mesh)
    state, metrics = s.train_step(s.init(jax.random.key(0)), batch, jax.random.key(1))
    outs.append((jax.device_get(state.params), jax.device_get(metrics)))
  (p1, m1), (p4, m4) = outs
  assert m1["mlm_weight"] == m4["mlm_weight"] > 0
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-5)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-4)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), p4, p1)


def _cli_overrides(config_changes: dict) -> list[str]:
  return [f"--config.{k}={v}" for k, v in config_changes.items()]


@pytest.mark.slow
def test_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache):
  """A trains 2N steps; B is killed by SIGTERM after >= N steps and restarted: B's losses equal A's."""
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=10)


def check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n, **config_changes):
  """Trains A for 2n steps in-process; B by the CLI, SIGTERM after >= n steps, then restarted to 2n."""
  changes = {**TINY, "data.train_files": data_dir, **config_changes}
  a_dir, b_dir = str(tmp_path / "a"), str(tmp_path / "b")
  train.train_and_evaluate(tiny_config(data_dir, train_steps=2 * n, **config_changes), a_dir)
  a = train_losses(a_dir)

  env = dict(os.environ, **compilation_cache_env(compilation_cache))
  command = [sys.executable, "-m", "bert_jax.main", f"--config={REPO}/configs/tiny.py", f"--workdir={b_dir}",
             *_cli_overrides(changes)]
  # First run: far more steps than needed; SIGTERM once it has logged step n.
  proc = subprocess.Popen(command + ["--config.train_steps=100000"], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if os.path.exists(os.path.join(b_dir, "metrics.jsonl")) and max(train_losses(b_dir), default=0) >= n:
      proc.send_signal(signal.SIGTERM)
      break
    time.sleep(0.02)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == failures.STOPPED, out[-3000:]   # saved, not finished
  assert "preempted: saved checkpoint at step" in out
  killed_at = max(train_losses(b_dir))
  assert f"stopped at step {killed_at} of 100000 (the same command resumes)" in out, out[-2000:]
  assert n <= killed_at < 2 * n, killed_at
  assert os.listdir(os.path.join(b_dir, "checkpoints")) == [str(killed_at)]

  done = subprocess.run(command + [f"--config.train_steps={2 * n}"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
  b = train_losses(b_dir)
  assert sorted(b) == list(range(1, 2 * n + 1))
  assert [b[s] for s in range(n + 1, 2 * n + 1)] == [a[s] for s in range(n + 1, 2 * n + 1)]   # bit for bit
  assert b == a


@pytest.mark.slow
def test_sigterm_during_a_finished_runs_report_leaves_it_done(data_dir, tmp_path, compilation_cache):
  """The run has trained and saved its last step; a SIGTERM while its curves are drawn cuts the report short, in one
  line, and the command exits 0 (done), not 143 (stopped: a supervisor would leave the job stopped)."""
  script = ("import os, signal, time\nfrom bert_jax import cli, curves, main\n"
            "def plot(*args, **kwargs):\n  os.kill(os.getpid(), signal.SIGTERM)\n  time.sleep(60)\n"
            "curves.plot_pretraining = plot\ncli.run_module(main.main, 'bert-jax pretrain')\n")
  env = dict(os.environ, **compilation_cache_env(compilation_cache))
  workdir = str(tmp_path / "run")
  run = subprocess.run([sys.executable, "-c", script, f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}",
                        *_cli_overrides({**TINY, "data.train_files": data_dir, "train_steps": 2})],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
  assert run.stderr.splitlines()[-1] == (f"bert-jax pretrain: SIGTERM; the run is done at step 2, its checkpoint and "
                                         f"metrics saved in {workdir}; its report was cut short"), run.stderr[-2000:]
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["2"] and "done at step" not in run.stdout


def test_embedded_corpus_is_prepared_once_into_the_workdir(tmp_path, monkeypatch):
  calls = []

  def fake_prepare(spec, output_dir, **kwargs):
    calls.append((spec, output_dir, kwargs))
    os.makedirs(output_dir, exist_ok=True)

  monkeypatch.setattr(prepare, "prepare_corpus", fake_prepare)
  config = tiny.get_config()
  for _ in range(2):
    data_config = train.prepared_data_config(config, str(tmp_path))
  assert data_config.train_files == str(tmp_path / "data") and not data_config.vocab_file
  assert calls == [("embedded:shakespeare", str(tmp_path / "data"),
                    {"vocab_file": None, "do_lower_case": True, "train_vocab_size": 2048, "eval_fraction": 0.02})]
  assert config.data.train_files == "embedded:shakespeare"   # the config itself is left alone
  # A vocabulary given (a checkpoint's, to continue its pretraining) is the one the corpus is tokenized with.
  config.data.vocab_file = str(tmp_path / "vocab.txt")
  data_config = train.prepared_data_config(config, str(tmp_path / "given"))
  assert calls[-1] == ("embedded:shakespeare", str(tmp_path / "given" / "data"),
                       {"vocab_file": str(tmp_path / "vocab.txt"), "do_lower_case": True, "train_vocab_size": None,
                        "eval_fraction": 0.02})
  assert data_config.vocab_file == str(tmp_path / "vocab.txt")
  # Data prepared with one vocabulary is not read with another.
  with pytest.raises(failures.UserError, match=r"data was prepared from embedded:shakespeare with a vocabulary "
                     r"trained on it, and this run asks for embedded:shakespeare with data.vocab_file .*vocab.txt: "
                     r"give a new --workdir"):
    train.prepared_data_config(config, str(tmp_path))
  assert len(calls) == 2


@pytest.mark.slow
@pytest.mark.parametrize("fmt, packing", [("nsp", True), ("full_sentences", False)])
def test_packed_and_sentence_free_batches_train(data_dir, fmt, packing):
  config = tiny_config(data_dir, **{"data.format": fmt, "data.packing": packing, "data.max_examples_per_row": 4,
                                    "data.short_seq_prob": 0.9})   # short instances: several per packed row
  s = train_setup.setup(config, sharding.create_mesh(config.mesh))
  host_batch = next(train.create_iterator(config.data, config, split="train"))
  assert set(host_batch) == set(train_setup.abstract_batch(config))
  batch = sharding.global_batch(host_batch, s.mesh)
  state, metrics = s.train_step(s.init(jax.random.key(0)), batch, jax.random.key(1))
  metrics = jax.device_get(metrics)
  assert np.isfinite(metrics["loss"]) and int(state.nonfinite_count) == 0
  if packing:   # one NSP prediction per packed example, not per row
    assert metrics["nsp_weight"] == host_batch["next_sentence_weights"].sum() >= config.global_batch_size
  else:
    assert "nsp_loss_sum" not in metrics


def test_tokenizer_larger_than_the_embedding_table_stops_before_compiling(data_dir, tmp_path, monkeypatch):
  compiled = []
  monkeypatch.setattr(train_setup, "setup", lambda *a, **k: compiled.append(1))
  config = tiny_config(data_dir, **{"model.vocab_size": 64})   # the data's vocabulary: about 110 tokens
  with pytest.raises(failures.UserError, match=r"has 1[0-9]{2} tokens but the model's embedding table has 64"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not compiled


def test_an_eval_split_of_one_document_stops_before_compiling(tmp_path, monkeypatch):
  """Next-sentence pairs take their random sentence from another document: an eval split that `prepare`
  held out with one document is the user's to fix (exit 2), not a traceback from the input pipeline."""
  lines = []
  for d in range(12):
    lines += [f"document {d} sentence {i} is here ." for i in range(4)] + [""]
  (tmp_path / "corpus.txt").write_text("\n".join(lines))
  out = str(tmp_path / "prepared")
  prepare.prepare_corpus(str(tmp_path / "corpus.txt"), out, train_vocab_size=64, eval_fraction=0.1,
                         num_shards=1, num_workers=1)
  assert json.load(open(os.path.join(out, "stats.json")))["splits"]["eval"]["documents"] == 1
  compiled = []
  monkeypatch.setattr(train_setup, "setup", lambda *a, **k: compiled.append(1))
  with pytest.raises(failures.UserError, match="needs two documents on each host.*the eval split holds 1"):
    train.train_and_evaluate(tiny_config(out, **{"model.vocab_size": 64}), str(tmp_path / "run"))
  assert not compiled


def test_relative_workdir_and_paths_become_absolute(data_dir, tmp_path, monkeypatch):
  """Orbax rejects relative paths: a relative --workdir and data path must still train and checkpoint."""
  monkeypatch.chdir(tmp_path)
  os.symlink(data_dir, tmp_path / "prepared")
  config = tiny_config("prepared", train_steps=2, checkpoint_every=1, eval_steps=0)
  train.train_and_evaluate(config, "runs/rel")
  assert sorted(os.listdir(tmp_path / "runs" / "rel" / "checkpoints")) == ["1", "2"]


def test_dropout_bits_come_from_the_configured_generator():
  config = tiny.get_config()
  init_rng, dropout_rng = train_setup.rngs(config)
  assert str(jax.random.key_impl(dropout_rng)) == "threefry2x32"
  # The default keeps the keys runs have always had: both halves of split(key(seed)).
  expected = jax.random.split(jax.random.key(config.seed))
  assert (jax.random.key_data(dropout_rng) == jax.random.key_data(expected[1])).all()
  config.dropout_rng = "rbg"
  init_rbg, dropout_rbg = train_setup.rngs(config)
  assert str(jax.random.key_impl(dropout_rbg)) == "rbg"
  assert (jax.random.key_data(init_rbg) == jax.random.key_data(init_rng)).all()   # parameters do not change
  keep = lambda k: jax.random.bernoulli(jax.random.fold_in(k, 3), 0.9, (64, 64))   # noqa: E731
  assert (keep(dropout_rbg) == keep(train_setup.rngs(config)[1])).all()   # the same key, the same mask
  assert 0.85 < float(keep(dropout_rbg).mean()) < 0.95 and (keep(dropout_rbg) != keep(dropout_rng)).any()
  config.dropout_rng = "philox"
  with pytest.raises(Exception, match="dropout_rng 'philox' is not one of"):
    train.validate(config)


@pytest.mark.slow
@pytest.mark.parametrize("change", [{"dropout_rng": "rbg"},
                                    pytest.param({"model.dropout_bits": "hash"}, marks=pytest.mark.exhaustive),
                                    {"dropout_rng": "hash", "model.dropout_bits": "hash"}])
def test_exact_resume_with_other_dropout_bits(data_dir, tmp_path, compilation_cache, change):
  """With dropout_rng "rbg" (XLA's RngBitGenerator), the counter hash's bits (models/dropout.py) or those
  bits from the hash's own keys (models/dropout_key.py) too, a resumed run replays the same dropout. The hash
  bits from threefry keys are `exhaustive`: the bits resume with the hash keys here, the keys in every other
  resume test."""
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=4, **change)


@pytest.mark.slow
def test_flash_kernel_keeps_the_steps_loss(data_dir):
  """`attention_kernel` "flash_interpret" (the TPU kernel, interpreted) on the same batch: without attention
  dropout the step's loss and gradient norm are the explicit path's; with it, those of "flash" on this CPU
  (the kernel's bits drawn by XLA ops), which differ from the explicit path's (nn.Dropout's bits)."""
  def step(kernel, rate):
    config = tiny_config(data_dir, **{"model.attention_kernel": kernel, "model.attention_dropout": rate})
    s = train_setup.setup(config, sharding.create_mesh(config.mesh))
    batch = sharding.global_batch(next(train.create_iterator(config.data, config, split="train")), s.mesh)
    _, metrics = s.train_step(s.init(jax.random.key(0)), batch, jax.random.key(1))
    return jax.device_get(metrics)

  plain, kernel = step("xla", 0.0), step("flash_interpret", 0.0)
  np.testing.assert_allclose(kernel["loss"], plain["loss"], rtol=1e-5)
  np.testing.assert_allclose(kernel["grad_norm"], plain["grad_norm"], rtol=1e-4)
  dropped, interpreted, explicit = step("flash", 0.1), step("flash_interpret", 0.1), step("xla", 0.1)
  np.testing.assert_allclose(interpreted["loss"], dropped["loss"], rtol=1e-5)
  np.testing.assert_allclose(interpreted["grad_norm"], dropped["grad_norm"], rtol=1e-4)
  assert dropped["loss"] != explicit["loss"] and dropped["loss"] != plain["loss"]


@pytest.mark.slow
def test_exact_resume_with_the_flash_kernels_dropout_bits(data_dir, tmp_path, compilation_cache):
  """With `attention_kernel` "flash" (on this CPU its dropout bits by XLA ops) a resumed run replays them."""
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=4,
                                   **{"model.attention_kernel": "flash"})


@pytest.mark.slow
def test_exact_resume_with_bfloat16_compute_and_scores(data_dir, tmp_path, compilation_cache):
  """In bfloat16 compute, where the configs' `attention_scores` "compute" writes bfloat16 scores, a
  resumed run replays the uninterrupted one."""
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=4, dtype="bfloat16")


@pytest.mark.slow
def test_exact_resume_with_each_weight_gathered_once(data_dir, tmp_path, compilation_cache):
  """On an fsdp mesh of the 8 CPU devices, with each weight gathered once (`model.reshard_after_forward`
  False) and kept through remat, a resumed run replays the uninterrupted one."""
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=4,
                                   **{"mesh.fsdp": 4, "model.reshard_after_forward": False,
                                      "model.remat_policy": "minimal"})


@pytest.mark.slow
@pytest.mark.exhaustive
def test_exact_resume_with_the_embedding_lookup_on_shards(data_dir, tmp_path, compilation_cache):
  """On an fsdp mesh of the 8 CPU devices, with the word-embedding lookup on each device's shard
  (`model.embedding_lookup_on_shards`, an all-to-all), a resumed run replays the uninterrupted one.
  Exhaustive: v5e:8x8's phase 1 resumes with the lookup on shards in CI."""
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=4,
                                   **{"mesh.fsdp": 4, "model.embedding_lookup_on_shards": True})


@pytest.mark.slow
@pytest.mark.parametrize("model, split_tensor", shipped_steps_in_ci())
def test_exact_resume_with_each_shipped_bert_large_step(data_dir, tmp_path, compilation_cache, model,
                                                         split_tensor):
  """How a shipped TPU step computes, all at once (`shipped_bert_large_steps`: the decoder and the
  word-embedding lookup on each device's shard, remat, scanned layers, the LayerNorm kernel in Pallas'
  interpreter, ...), on its tiny mesh of the 8 CPU devices: a resumed run replays the uninterrupted one."""
  mesh = {"mesh.fsdp": 4, "mesh.tensor": 2 if split_tensor else 1}
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=4, **mesh,
                                   **{"model.num_layers": 2}, **{f"model.{k}": v for k, v in model.items()})
