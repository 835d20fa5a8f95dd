"""`bert-jax analyze prune` (Michel et al. 2019): head importance against finite differences, the pruning
order, the exported pruned workdir against the masked model, and the command on a tiny finetuned workdir."""

import csv
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax.analysis import prune
from bert_jax.finetune import init as finetune_init
from bert_jax.finetune import tasks
from bert_jax.finetune import trainer
from bert_jax.finetune import task_model
from bert_jax.models import encoder as model_lib
from bert_jax.models import heads
from bert_jax.tools import predict
from test_finetune_train import make_sentiment_data, tiny_config
from conftest import assert_one_line_errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS, HEADS = 2, 4


def _random_params(model, length: int, std: float, seed: int = 0):
  """Normal(0, std) for every parameter of `model`: shapes by `jax.eval_shape`, no initialiser to compile."""
  ids = np.zeros((1, length), np.int32)
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), ids, ids + 1, ids)["params"])
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0.0, std, s.shape).astype(s.dtype), shapes)


def _tiny_classifier():
  cfg = model_lib.BertConfig(vocab_size=20, hidden_size=16, num_layers=LAYERS, num_heads=HEADS, intermediate_size=32,
                             max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
  model = heads.BertForSequenceClassification(cfg, 3)
  rng = np.random.default_rng(0)
  n, length = 6, 8
  ids = rng.integers(5, 20, (n, length)).astype(np.int32)
  mask = np.ones((n, length), np.int32)
  mask[::2, 5:] = 0   # some padding
  features = {"input_ids": ids * mask, "input_mask": mask, "segment_ids": np.zeros_like(ids),
              "label": rng.integers(0, 3, n).astype(np.int32)}
  params = _random_params(model, length, std=0.3)   # gradients well above float32's noise
  return model, params, features


@pytest.mark.slow
def test_importance_is_the_mean_of_finite_difference_abs_gradients():
  model, params, features = _tiny_classifier()
  got = prune.head_importance(model, params, features, "classification", np.ones((LAYERS, HEADS)), batch_size=4)

  @jax.jit
  def losses(head_mask):   # [n]: each example's loss (the rows of a batch do not mix)
    logits = model.apply({"params": params}, features["input_ids"], features["input_mask"], features["segment_ids"],
                         head_mask=head_mask)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), features["label"][:, None], axis=1)[:, 0]

  eps = 1e-2   # central differences: O(eps^2) truncation, float32 rounding / eps
  fd = np.zeros((len(features["label"]), LAYERS, HEADS))
  for l in range(LAYERS):
    for h in range(HEADS):
      step = np.zeros((LAYERS, HEADS), np.float32)
      step[l, h] = eps
      fd[:, l, h] = (np.float64(losses(1 + step)) - np.float64(losses(1 - step))) / (2 * eps)
  np.testing.assert_allclose(got, np.abs(fd).mean(0), rtol=2e-2, atol=1e-6)
  # The expectation of |gradient| per example, not |gradient| of the mean loss (they differ here).
  assert not np.allclose(got, np.abs(fd.mean(0)), rtol=2e-2)
  normalised = prune.normalise_by_layer(got)
  np.testing.assert_allclose(np.linalg.norm(normalised, axis=1), 1.0, rtol=1e-6)


def test_pruning_order_and_fractions():
  scores = np.array([[0.5, 0.1, 0.9], [0.1, 0.7, 0.2]])
  assert prune.pruning_order(scores) == [(0, 1), (1, 0), (1, 2), (0, 0), (1, 1), (0, 2)]   # tie: layer 0 first
  assert [prune.num_pruned(f, 72) for f in prune.FRACTIONS] == [0, 7, 14, 22, 29, 36, 43, 50, 58, 65]
  assert prune.num_pruned(0.5, 6) == 3 and prune.num_pruned(0.25, 6) == 2
  with pytest.raises(ValueError, match=r"\[0, 1\)"):
    prune.num_pruned(1.0, 72)
  mask = prune.mask_without((2, 3), [(0, 1), (1, 2)])
  np.testing.assert_array_equal(mask, [[1, 0, 1], [1, 1, 0]])
  assert prune.by_layer([(1, 2), (0, 1), (1, 0)]) == {0: [1], 1: [0, 2]}


@pytest.mark.slow
def test_the_curve_masks_a_growing_prefix_of_the_order(tiny_run):
  workdir, data = tiny_run
  predictor = predict.Predictor.load(workdir)
  dev = prune.read_dev(predictor, os.path.join(data, "dev.tsv"))
  model = task_model.build_model(predictor.model_config, predictor.task)
  rows, scores, raw = prune.curve(model, predictor.params, predictor.task, dev, [0.5, 0.0, 0.25], batch_size=16)
  order = prune.pruning_order(scores)
  assert [r["fraction"] for r in rows] == [0.0, 0.25, 0.5] and [r["heads_pruned"] for r in rows] == [0, 2, 4]
  assert rows[2]["heads"] == " ".join(f"{l}:{h}" for l, h in sorted(order[:4]))
  unmasked = predictor.score(dev.examples, predictor.predict(dev.examples))   # `bert-jax predict`'s numbers
  assert rows[0]["accuracy"] == pytest.approx(unmasked["accuracy"])
  assert np.all(raw > 0) and scores.shape == (LAYERS, HEADS)
  iterative, _, _ = prune.curve(model, predictor.params, predictor.task, dev, [0.0, 0.25, 0.5], iterative=True,
                                batch_size=16)
  assert [r["heads_pruned"] for r in iterative] == [0, 2, 4]


def test_a_question_answering_workdir_is_refused():
  predictor = predict.Predictor(tasks.get_task("squad_v1"), None, None, None, 64)
  with pytest.raises(ValueError, match="classification, regression, tagging.*'span'"):
    prune.read_dev(predictor, "dev.json")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """(workdir, data_dir): a finetuned workdir as `bert-jax finetune` writes one (run record, task.json, best/),
  of an untrained SST-2 classifier of 2 layers with 4 heads: nothing to train, nothing to wait for."""
  tmp = tmp_path_factory.mktemp("prune")
  data = make_sentiment_data(tmp / "data", n_train=16, n_dev=32)
  c = tiny_config(data)
  c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 32, HEADS, 64
  cfg, _ = finetune_init.load_encoder(c)
  task = tasks.get_task("sst2")
  model = task_model.build_model(cfg, task)
  params = _random_params(model, c.max_seq_length, std=0.1)
  workdir = tmp / "run"
  tokenizer = finetune_init.load_tokenizer(c)
  checkpoint_loader.write_run_record(str(workdir), cfg, tokenizer.source_file, tokenizer.do_lower_case)
  trainer.write_task_record(str(workdir), task, c)
  best = checkpointing.Checkpointer(str(workdir / "best"), keep=1, async_save=False)
  best.save(1, {"params": params})
  best.close()
  return workdir, data


@pytest.mark.slow
def test_export_reloads_with_fewer_params_and_the_masked_logits(tiny_run, tmp_path):
  workdir, data = tiny_run
  summary = prune.run(str(workdir), data, str(tmp_path / "out"), [0.0, 0.5], export_fraction=0.5,
                      export_dir=str(tmp_path / "pruned"), batch_size=16, timing_repeats=2)
  report = summary["export"]
  assert report["heads_removed"] == 4 and report["max_abs_error"] <= 1e-5
  assert report["params_pruned"] < report["params_unpruned"]
  # A finetuned workdir `bert-jax predict` loads: the same head, its labels, the pruned config.
  pruned = predict.Predictor.load(str(tmp_path / "pruned"))
  assert pruned.model_config.pruned_heads and pruned.task.label_names == ("0", "1")
  dev = pruned.read(os.path.join(data, "dev.tsv"))
  scores = pruned.score(dev, pruned.predict(dev))
  assert scores["accuracy"] == pytest.approx(report["accuracy"])
  assert scores["accuracy"] == pytest.approx(summary["curve"][-1]["accuracy"])   # masked 50% = removed 50%


@pytest.mark.slow
def test_the_command_end_to_end(tiny_run, tmp_path):
  workdir, data = tiny_run
  # A dev file of the user's own, its text column named otherwise than the training files' (`--text_a`).
  with open(f"{data}/dev.tsv") as f:
    (tmp_path / "dev.tsv").write_text(f.read().replace("sentence\tlabel", "review\tlabel", 1))
  argv = [sys.executable, "-m", "bert_jax.cli", "analyze", "prune", f"--checkpoint={workdir}",
          f"--input={tmp_path}/dev.tsv", "--text_a=review", f"--output_dir={tmp_path}/out",
          "--fractions=0,0.25,0.5,0.75", "--batch_size=16"]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  summary = json.loads(run.stdout[run.stdout.index("{"):])
  assert [r["heads_pruned"] for r in summary["curve"]] == [0, 2, 4, 6] and summary["metric"] == "accuracy"
  with open(tmp_path / "out" / "prune.csv") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["heads_pruned"]) for r in rows] == [0, 2, 4, 6]
  with open(tmp_path / "out" / "importance.csv") as f:
    assert len(list(csv.DictReader(f))) == LAYERS * HEADS
  assert (tmp_path / "out" / "prune.png").stat().st_size > 1000
  assert (tmp_path / "out" / "importance.png").stat().st_size > 1000
  # A fraction of 1 is one line on stderr and exit code 2.
  bad = subprocess.run(argv[:-2] + ["--fractions=0,1"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
  assert bad.returncode == 2 and "fraction 1.0: in [0, 1)" in bad.stderr and "Traceback" not in bad.stderr


def test_a_layer_that_loses_every_head_is_exported_with_one_silenced(tmp_path):
  """A checkpoint holds no empty array: the layer keeps its first head with zero output weights, which
  computes what the masked model computes; the export saves and restores (it failed with zero-size arrays)."""
  model, params, features = _tiny_classifier()
  cfg = model.config
  heads_out = [(0, h) for h in range(HEADS)] + [(1, 2)]
  pruned_cfg, pruned, silenced = prune.without_heads(cfg, params, heads_out)
  assert silenced == {0: 0} and pruned_cfg.kept_heads(0) == (0,) and pruned_cfg.kept_heads(1) == (0, 1, 3)
  assert all(np.size(x) for x in jax.tree.leaves(pruned))
  mask = jnp.asarray(prune.mask_without((LAYERS, HEADS), heads_out))
  masked = prune.masked_outputs(prune._masked_forward(model), params, features, mask, 6)
  pruned_model = heads.BertForSequenceClassification(pruned_cfg, 3)
  out = pruned_model.apply({"params": pruned}, features["input_ids"], features["input_mask"], features["segment_ids"])
  np.testing.assert_allclose(np.asarray(out), np.asarray(jax.tree.leaves(masked)[0]), atol=1e-5)
  saver = checkpointing.Checkpointer(str(tmp_path / "best"), keep=1, async_save=False)
  saver.save(0, {"params": jax.tree.map(np.asarray, pruned)})
  saver.close()


@pytest.mark.slow
def test_command_mistakes_are_one_line_and_exit_2(tmp_path):
  """A flag out of its range, an --output_dir that is a file: no traceback, before anything is read."""
  (tmp_path / "README.md").write_text("a file\n")
  cases = {("--checkpoint=nowhere", "--input=dev.tsv", "--output_dir=out", "--timing_repeats=0"):
               "bert-jax analyze prune: flag --timing_repeats=0: 0 is not a positive integer",
           ("--checkpoint=nowhere", "--input=dev.tsv", "--output_dir=README.md"):
               f"bert-jax analyze prune: cannot write {tmp_path}/README.md/prune.csv: its folder cannot be made",
           # An export over an earlier one would mix their weights and configs: refused, as a file there is.
           ("--checkpoint=nowhere", "--input=dev.tsv", "--output_dir=out", "--export_dir=earlier"):
               "bert-jax analyze prune: --export_dir=earlier already holds files (an earlier export?)",
           ("--checkpoint=nowhere", "--input=dev.tsv", "--output_dir=out", "--export_dir=README.md"):
               "bert-jax analyze prune: --export_dir=README.md: it is a file",
           ("--checkpoint=nowhere", "--input=dev.tsv", "--output_dir=out", "--export_dir=README.md/pruned"):
               "bert-jax analyze prune: --export_dir=README.md/pruned: README.md is a file"}
  (tmp_path / "earlier").mkdir()
  (tmp_path / "earlier" / "bert_config.json").write_text("{}")
  assert_one_line_errors(["analyze", "prune"], cases, tmp_path)
