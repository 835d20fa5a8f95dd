"""The finetuning loop on tiny models (8 fake devices): learning, stacked trials, layer-wise decay,
frozen encoder with scalar mix, two-stage initialisation; and the real MiniLM on rotten_tomatoes."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax import failures
from bert_jax.finetune import init as finetune_init
from bert_jax.finetune import scalar_mix
from bert_jax.finetune import trainer
from bert_jax.finetune import task_model
from bert_jax.models import encoder as model_lib
from bert_jax.models import heads
from bert_jax.models.config import COMPUTE_FIELDS
from configs.finetune import sst2
from conftest import shared_path

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "movie", "was", "a", "plot", "and"]


def write_vocab(directory) -> None:
  """vocab.txt of the special tokens and WORDS in `directory` (created)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "vocab.txt"), "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")


def make_sentiment_data(directory, n_train=256, n_dev=64, seed=0) -> str:
  """train.tsv/dev.tsv (SST-2 format) whose label is told by one word; and a vocab.txt. Returns the dir."""
  write_vocab(directory)
  rng = np.random.default_rng(seed)
  for split, n in (("train", n_train), ("dev", n_dev)):
    with open(os.path.join(directory, f"{split}.tsv"), "w") as f:
      f.write("sentence\tlabel\n")
      for _ in range(n):
        y = int(rng.integers(2))
        word = rng.choice(WORDS[:3] if y else WORDS[3:6])
        filler = " ".join(rng.choice(WORDS[6:], 4))
        f.write(f"{word} movie {filler}\t{y}\n")
  with open(os.path.join(directory, "test.tsv"), "w") as f:  # GLUE test files: an index, no label
    f.write("index\tsentence\n0\tgreat movie\n1\tawful plot\n")
  return str(directory)


def tiny_config(data_dir: str, config=None, vocab_file: str | None = None):
  """`config` (default SST-2's) on a tiny model that trains in seconds; the vocabulary in `data_dir`."""
  c = config or sst2.get_config()
  c.data_dir = data_dir
  c.vocab_file = vocab_file or os.path.join(data_dir, "vocab.txt")
  c.model.preset = "tiny"
  c.model.vocab_size = 32
  c.model.max_position_embeddings = 32
  c.max_seq_length = 16
  c.batch_size = 16
  c.learning_rate = 1e-3
  c.num_epochs = 3
  c.log_every_steps = 4
  return c


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def _best_params(workdir):
  return checkpointing.restore_params(os.path.join(workdir, "best"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return make_sentiment_data(tmp_path_factory.mktemp("sentiment"))


def test_layerwise_decay_factors_agree_for_scanned_and_unscanned():
  u = {"bert": {"embeddings": {"w": np.ones(3)}, "encoder": {f"layer_{i}": {"k": np.ones((2, 2))} for i in range(3)},
                "pooler": {"kernel": np.ones(2)}}, "classifier": {"kernel": np.ones(2)}}
  tx = task_model.scale_by_layer(0.5, num_layers=3)
  out, _ = tx.update(u, tx.init(u))
  assert [float(out["bert"]["encoder"][f"layer_{i}"]["k"][0, 0]) for i in range(3)] == [0.125, 0.25, 0.5]
  assert float(out["bert"]["embeddings"]["w"][0]) == 0.0625
  assert float(out["classifier"]["kernel"][0]) == float(out["bert"]["pooler"]["kernel"][0]) == 1.0
  scanned = {"bert": {"encoder": {"layers": {"k": np.ones((3, 2, 2))}}}}
  out_s, _ = tx.update(scanned, tx.init(scanned))
  np.testing.assert_allclose(out_s["bert"]["encoder"]["layers"]["k"][:, 0, 0], [0.125, 0.25, 0.5])


def test_stable_adamw_with_weight_decay_is_refused_in_finetuning():
  """Its decay is divided by the peak rate, which finetuning sets to 1 and multiplies by each trial's."""
  from configs.finetune import sst2  # pylint: disable=g-import-not-at-top
  config = sst2.get_config()
  config.optimizer.name, config.optimizer.weight_decay = "stable_adamw", 0.01
  with pytest.raises(ValueError, match="StableAdamW's fully decoupled weight decay"):
    task_model.build_optimizer(config, 100, num_layers=2)
  config.optimizer.weight_decay = 0.0
  task_model.build_optimizer(config, 100, num_layers=2)


@pytest.mark.slow
def test_finetune_learns_then_two_stage_feature_based(data_dir, tmp_path):
  config = tiny_config(data_dir)
  config.layerwise_lr_decay = 0.9
  config.predict_split = "test"
  results = trainer.finetune(config, str(tmp_path / "first"))
  assert results["finished"] and results["best"] >= 0.95, results
  log = _read_jsonl(tmp_path / "first" / "metrics.jsonl")
  assert [r["step"] for r in log if "eval/accuracy" in r] == [16, 32, 48]  # every epoch of 256 // 16
  losses = [r["train/loss"] for r in log if "train/loss" in r]
  assert losses[-1] < 0.5 * losses[0]
  preds = (tmp_path / "first" / "predictions_dev.tsv").read_text().splitlines()
  assert preds[0] == "index\tprediction" and len(preds) == 65
  # Test split from the best checkpoint: the submission file.
  assert (tmp_path / "first" / "predictions_test.tsv").read_text().splitlines() == [
      "index\tprediction", "0\t1", "1\t0"]

  # Second stage from the first's best/: its encoder, frozen, under a new scalar mix and classifier.
  second = tiny_config(data_dir)
  second.init_checkpoint, second.vocab_file = str(tmp_path / "first" / "best"), ""
  assert finetune_init.detect_format(second.init_checkpoint) == "bert_jax"
  assert finetune_init.load_tokenizer(second).encode("good movie") == [5, 12]  # the copy in the workdir
  second.scalar_mix = second.freeze_encoder = True
  second.num_epochs, second.learning_rate = 1, 1e-2
  results = trainer.finetune(second, str(tmp_path / "second"))
  before, after = _best_params(tmp_path / "first"), _best_params(tmp_path / "second")
  assert set(after) == {"bert", "scalar_mix", "classifier"}
  jax.tree.map(np.testing.assert_array_equal, before["bert"], after["bert"])  # no gradient, no decay
  assert not np.allclose(after["scalar_mix"]["weights"], 0.0)
  assert results["best"] >= 0.8, results


def test_a_trial_whose_loss_stops_being_finite_stops_and_its_group_goes_on(data_dir, tmp_path):
  """A learning rate of 1e30 sends the parameters to inf and the loss to NaN within the first log interval: that
  trial stops there, writes no predictions (it was never evaluated) and its results say where it diverged; the
  trial trained beside it is untouched. The command's exit is `raise_if_diverged`'s."""
  good, bad = tiny_config(data_dir), tiny_config(data_dir)
  good.predict_split = bad.predict_split = "test"
  bad.learning_rate = 1e30
  ours, theirs = trainer.finetune_trials([good, bad], [str(tmp_path / "good"), str(tmp_path / "bad")])
  assert ours["diverged_step"] is None and ours["best"] >= 0.9, ours
  assert theirs["diverged_step"] == 4 and theirs["step"] == 4 and theirs["best"] is None, theirs
  assert theirs["finished"] and theirs["stopped_early"]
  log = _read_jsonl(tmp_path / "bad" / "metrics.jsonl")
  assert [r["step"] for r in log] == [4, 4] and log[1]["event"] == "diverged" and not np.isfinite(log[0]["train/loss"])
  assert not (tmp_path / "bad" / "best").exists() and not (tmp_path / "bad" / "predictions_test.tsv").exists()
  assert (tmp_path / "good" / "predictions_test.tsv").read_text().splitlines()[1:] == ["0\t1", "1\t0"]
  trainer.raise_if_diverged(ours, "good")
  with pytest.raises(failures.Diverged, match="not finite at step 4 .*learning rate 1e\\+30.*no evaluation"):
    trainer.raise_if_diverged(theirs, "bad")
  # Parameters gone non-finite after the last logged loss are caught at the evaluation, per trial.
  params = {"a": np.ones((3, 2, 2), np.float32), "b": np.ones((3, 4), np.float32)}
  params["b"][1, 2] = np.nan
  params["a"][2, 0, 1] = np.inf
  finite = trainer._finite_per_trial(params)  # pylint: disable=protected-access
  np.testing.assert_array_equal(finite, [True, False, False])


def test_a_mesh_that_splits_the_encoder_unevenly_stops_before_training(data_dir, tmp_path):
  config = tiny_config(data_dir)
  config.model.vocab_size = 33
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 4, 2
  with pytest.raises(ValueError, match=r"vocab 33 over tensor \(2\) unevenly"):
    trainer.finetune(config, str(tmp_path / "run"))


@pytest.mark.slow
def test_stacked_trials_one_per_device_group_match_separate_runs(data_dir, tmp_path):
  a, b = tiny_config(data_dir), tiny_config(data_dir)
  a.num_epochs = b.num_epochs = 1
  b.learning_rate, b.seed = 3e-3, 7
  for c in (a, b):  # 2 groups of 4 devices, one trial each, its batch and parameters split 4 ways
    c.trials_over_devices, c.mesh.data, c.mesh.fsdp = True, 2, 4
  together = trainer.finetune_trials([a, b], [str(tmp_path / "a"), str(tmp_path / "b")])
  alone_config = tiny_config(data_dir)  # every device, data parallel
  alone_config.num_epochs, alone_config.learning_rate, alone_config.seed = 1, 3e-3, 7
  alone = trainer.finetune(alone_config, str(tmp_path / "b_alone"))
  assert together[1]["best"] == alone["best"]
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-5),
               _best_params(tmp_path / "b"), _best_params(tmp_path / "b_alone"))
  # Different learning rates and seeds did give different models.
  pa, pb = _best_params(tmp_path / "a"), _best_params(tmp_path / "b")
  assert not np.allclose(pa["classifier"]["kernel"], pb["classifier"]["kernel"])


@pytest.mark.slow
def test_minilm_rotten_tomatoes_short_run(minilm_rotten_tomatoes):
  """The real checkpoint on real data, shortened: 960 training sentences (30 steps) of at most 40 tokens
  (conftest.py runs it once for the tests that need it), evaluated on every dev sentence.

  The full-size run (4000 sentences, all 1000 dev sentences: 0.807) is in configs/finetune/sst2.py.
  """
  _, results = minilm_rotten_tomatoes
  assert results["best"] >= 0.65, results


def test_a_data_dir_that_names_one_file_says_dev_is_the_training_data(tmp_path, caplog):
  """The file itself is every split's: the dev metrics and the best checkpoint are then the training data's."""
  data = make_sentiment_data(tmp_path)
  c = tiny_config(data)
  task = trainer.tasks_lib.get_task(c.task, **c.task_opts)
  tokenizer = finetune_init.load_tokenizer(c)
  trainer._read_data(task, c, tokenizer)   # pylint: disable=protected-access
  assert "is both the training file" not in caplog.text
  c.data_dir = os.path.join(data, "train.tsv")
  _, train, (dev,), _ = trainer._read_data(task, c, tokenizer)   # pylint: disable=protected-access
  assert len(train.examples) == len(dev.examples) == 256
  assert f"{c.data_dir} is both the training file and the dev file" in caplog.text


def test_tracker_keeps_the_best_and_stops_after_patience(tmp_path):
  tracker = trainer._Tracker(str(tmp_path), "accuracy", patience=2)
  saved = []
  for step, acc in enumerate([0.5, 0.7, 0.6, 0.7, 0.65]):
    if tracker.stopped:
      break
    tracker.evaluated(step, {"accuracy": acc}, on_best=lambda step=step: saved.append(step))
  assert saved == [0, 1] and tracker.best == 0.7 and tracker.best_step == 1
  assert tracker.stopped and step == 4  # 0.6 and 0.7 (not better than 0.7) used up the patience
  tracker.save()
  assert trainer._Tracker(str(tmp_path), "accuracy", patience=2).best is None   # a new run: nothing kept
  (tmp_path / "last").mkdir()   # a run continued from its last/ state keeps its tracker
  resumed = trainer._Tracker(str(tmp_path), "accuracy", patience=2)
  assert (resumed.best, resumed.best_step, resumed.stopped, resumed.stopped_step) == (0.7, 1, True, 3)
  assert len(_read_jsonl(tmp_path / "metrics.jsonl")) == 4


def test_loss_sums_of_every_task_kind():
  ln = lambda x: float(np.log(x))
  cls = task_model.loss_sums("classification", np.zeros((2, 2), np.float32), {"label": np.array([1, -1])})
  assert float(cls["weight"]) == 1 and float(cls["loss_sum"]) == pytest.approx(ln(2))  # -1: unlabelled
  reg = task_model.loss_sums("regression", np.array([[1.0], [3.0]], np.float32),
                          {"label": np.array([0.0, np.nan], np.float32)})
  assert (float(reg["loss_sum"]), float(reg["weight"])) == (1.0, 1.0)
  tag = task_model.loss_sums("tagging", np.zeros((1, 2, 3), np.float32),
                          {"label_ids": np.array([[0, 2]]), "label_weights": np.array([[1.0, 0.0]], np.float32)})
  assert float(tag["weight"]) == 1 and float(tag["loss_sum"]) == pytest.approx(ln(3))  # first sub-token only
  span = task_model.loss_sums("span", {"start_logits": np.zeros((1, 4), np.float32),
                                    "end_logits": np.array([[0.0, 0.0, 50.0, 0.0]], np.float32)},
                           {"start_positions": np.array([1]), "end_positions": np.array([2])})
  assert float(span["weight"]) == 1 and float(span["loss_sum"]) == pytest.approx(0.5 * ln(4), abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("task, sample, metric", [("squad_v1", "squad.json", "f1"),
                                                  ("conll2003", "conll2003.txt", "f1")])
def test_span_and_tagging_tasks_train_end_to_end(tmp_path, task, sample, metric):
  """SQuAD and CoNLL through the whole loop on the real format samples: train, evaluate, predict."""
  from configs.finetune import conll2003, squad_v1  # pylint: disable=import-outside-toplevel
  c = {"squad_v1": squad_v1, "conll2003": conll2003}[task].get_config()
  # One file serves as train and dev; the samples are repeated so that a batch spans the 8 devices.
  text = shared_path("tasks", "format_samples", sample).read_text(encoding="utf-8")
  if task == "squad_v1":
    squad = json.loads(text)
    squad["data"] = [dict(article, title=f"{article['title']}_{i}") for i in range(4) for article in squad["data"]]
    text = json.dumps(squad)
  else:
    text = "\n".join([text.rstrip("\n")] * 4) + "\n"
  (tmp_path / sample).write_text(text, encoding="utf-8")
  c.data_dir = str(tmp_path / sample)
  c.vocab_file = str(shared_path("minilm", "vocab.txt"))
  c.do_lower_case = True   # an uncased vocabulary (conll2003.py's cased tokenization refuses it)
  c.model.preset = "tiny"
  c.model.max_position_embeddings = 128
  c.max_seq_length = 128
  if task == "squad_v1":
    c.task_opts.doc_stride = 64
  c.batch_size = 8
  c.learning_rate = 1e-3
  c.num_epochs = 2
  c.log_every_steps = 1
  workdir = tmp_path / "run"
  results = trainer.finetune(c, str(workdir))
  assert results["finished"] and results["step"] > 0
  assert 0.0 <= results["best_metrics"][metric] <= 1.0
  assert any(name.startswith("predictions") for name in os.listdir(workdir))
  losses = [r["train/loss"] for r in _read_jsonl(workdir / "metrics.jsonl") if "train/loss" in r]
  assert losses and all(np.isfinite(losses))


def _tiny_run(tmp_path, cfg):
  """A finetuning config whose init_checkpoint is a pretraining run of `cfg` (a 1-layer tiny encoder), and ids."""
  ids = np.arange(5, 13, dtype=np.int32)[None]
  shapes = jax.eval_shape(model_lib.BertEncoder(cfg).init, jax.random.key(0), ids)["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0.0, 0.2, s.shape).astype(np.float32), nn.unbox(shapes))
  run = tmp_path / "run"
  ckpt = checkpointing.Checkpointer(str(run / "checkpoints"), keep=1, async_save=False)
  ckpt.save(10, {"params": {"bert": params}})
  ckpt.close()
  write_vocab(tmp_path / "vocab")
  checkpoint_loader.write_run_record(str(run), cfg, str(tmp_path / "vocab" / "vocab.txt"), do_lower_case=True)
  config = tiny_config(str(tmp_path / "vocab"))
  config.init_checkpoint = str(run / "checkpoints")
  return config, ids


def test_a_checkpoint_computes_as_the_finetuning_config_says(tmp_path):
  # The checkpoint gives the architecture; config.model's dropout rates and compute fields apply on top.
  cfg = model_lib.BertConfig.from_preset("tiny", vocab_size=32, max_position_embeddings=32, num_layers=1)
  config, _ = _tiny_run(tmp_path, cfg)
  chosen = dict(remat_policy="full", reshard_after_forward=False, constrain_attention_matrices=False,
                fused_qkv=True, recompute_gelu=True, embedding_lookup_on_shards=True, decoder_on_shards=True,
                attention_kernel="flash", flash_bits="hardware", dropout_bits="hash",
                attention_residuals="bfloat16", attention_scores="compute", layer_norm_kernel="pallas",
                matmuls="library", scan_unroll=2, hidden_dropout=0.2)
  assert set(chosen) >= set(COMPUTE_FIELDS)
  for k, v in chosen.items():
    assert getattr(cfg, k) != v   # each differs from what the checkpoint's record would give
    config.model[k] = v
  loaded_cfg, _ = finetune_init.load_encoder(config)
  assert {k: getattr(loaded_cfg, k) for k in chosen} == chosen
  assert (loaded_cfg.num_layers, loaded_cfg.hidden_size) == (1, cfg.hidden_size)


def test_finetuning_from_a_left_to_right_run_keeps_the_causal_mask(tmp_path):
  # An LTR pretraining run (objective "ltr") records causal=True; finetuning reads the encoder config there.
  cfg = model_lib.BertConfig.from_preset("tiny", vocab_size=32, max_position_embeddings=32, num_layers=1,
                                         causal=True)
  config, ids = _tiny_run(tmp_path, cfg)
  loaded_cfg, loaded = finetune_init.load_encoder(config)
  # (Its float32 scores are the finetuning config's "compute" in float32.)
  assert loaded_cfg.causal and dataclasses.replace(loaded_cfg, dtype=cfg.dtype, scan_layers=False,
                                                   attention_scores=cfg.attention_scores) == cfg
  # The encoder finetuning builds from it masks the future: later tokens leave earlier outputs unchanged.
  later = ids.copy()
  later[0, 4:] = 7
  encode = lambda x: model_lib.BertEncoder(loaded_cfg).apply({"params": loaded}, x)["sequence_output"]
  np.testing.assert_allclose(encode(ids)[0, :4], encode(later)[0, :4], atol=1e-6)
  assert not np.allclose(encode(ids)[0, 4:], encode(later)[0, 4:])


def test_a_left_to_right_classifier_reads_the_last_token(tmp_path):
  """Under a causal mask [CLS] sees only itself: pooled there, every input gets the same logits."""
  cfg = model_lib.BertConfig.from_preset("tiny", vocab_size=32, max_position_embeddings=32, num_layers=1,
                                         causal=True)
  config = sst2.get_config()
  assert finetune_init.classifier_pooling(config, cfg) == "last"
  for first_token in ("pooler", "cls"):
    config.task_opts.classifier_pooling = first_token
    with pytest.raises(failures.UserError, match=f"classifier_pooling '{first_token}' reads the first token"):
      finetune_init.classifier_pooling(config, cfg)
  config.task_opts.classifier_pooling = "mean"
  assert finetune_init.classifier_pooling(config, cfg) == "mean"
  ids = np.array([[2, 5, 9, 3, 0, 0], [2, 11, 7, 8, 3, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  x = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
  np.testing.assert_array_equal(heads.pool_sequence(x, mask, "last"), x[[0, 1], [3, 4]])
  logits = {}
  for pooling in ("cls", "last"):
    module = heads.BertForSequenceClassification(cfg, 2, pooling=pooling)
    params = module.init(jax.random.key(0), ids, mask, np.zeros_like(ids))
    logits[pooling] = np.asarray(module.apply(params, ids, mask, np.zeros_like(ids)))
  np.testing.assert_allclose(logits["cls"][0], logits["cls"][1], atol=1e-6)   # the defect "last" avoids
  assert np.abs(logits["last"][0] - logits["last"][1]).max() > 1e-3
  mixed = scalar_mix.ScalarMixModel(cfg, "classification", 2)   # its mix of the layers, read there too
  params = mixed.init(jax.random.key(0), ids, mask, np.zeros_like(ids))
  logits = np.asarray(mixed.apply(params, ids, mask, np.zeros_like(ids)))
  assert np.abs(logits[0] - logits[1]).max() > 1e-3


@pytest.mark.slow
def test_a_continued_run_and_its_trials_report_their_own_numbers(data_dir, tmp_path):
  """A run continued from last/ (successive halving's budgets) logs the mean loss of the steps it ran
  since its last log; an early-stopped trial of a group reports its own step; a new run in a finished
  run's workdir keeps none of its best."""
  every_step = tiny_config(data_dir)
  every_step.log_every_steps, every_step.num_epochs, every_step.write_predictions = 1, 2, False
  trainer.finetune(every_step, str(tmp_path / "ref"))
  losses = {r["step"]: r["train/loss"] for r in _read_jsonl(tmp_path / "ref" / "metrics.jsonl") if "train/loss" in r}
  c = tiny_config(data_dir)
  c.log_every_steps, c.num_epochs, c.write_predictions = 5, 2, False
  trainer.finetune(c, str(tmp_path / "cont"), max_epochs=1)   # 16 steps, then on to 32
  trainer.finetune(c, str(tmp_path / "cont"))
  logged = {r["step"]: r["train/loss"] for r in _read_jsonl(tmp_path / "cont" / "metrics.jsonl") if "train/loss" in r}
  assert logged[20] == pytest.approx(np.mean([losses[s] for s in range(17, 21)]), rel=1e-5)

  fast, frozen = tiny_config(data_dir), tiny_config(data_dir)
  frozen.learning_rate = 1e-7
  for t in (fast, frozen):
    t.num_epochs, t.early_stopping_patience, t.write_predictions = 4, 1, False
  results = trainer.finetune_trials([fast, frozen], [str(tmp_path / "fast"), str(tmp_path / "frozen")])
  assert results[1]["stopped_early"] and results[1]["step"] < results[0]["step"]
  assert results[1]["epochs"] == results[1]["step"] / 16
  frozen_log = _read_jsonl(tmp_path / "frozen" / "metrics.jsonl")   # its slot trained on: not its curve
  assert max(r["step"] for r in frozen_log if "train/loss" in r) <= results[1]["step"]

  frozen.early_stopping_patience = 0
  trainer.finetune(frozen, str(tmp_path / "fast"))   # the same workdir, another learning rate
  again = json.loads((tmp_path / "fast" / trainer.RESULTS_FILE).read_text())
  assert again["best"] < results[0]["best"] and again["learning_rate"] == 1e-7
  assert os.listdir(tmp_path / "fast" / "best") == [str(again["best_step"])]


@pytest.mark.slow
def test_mnli_evaluates_dev_mismatched_beside_dev_matched(tmp_path):
  """Both of MNLI's dev sets are evaluated (GLUE reports MNLI-m and -mm); matched picks the best checkpoint."""
  from configs.finetune import mnli  # pylint: disable=g-import-not-at-top
  make_sentiment_data(tmp_path)
  header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
            "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
  labels = ("entailment", "neutral", "contradiction")
  for split, n in (("train", 96), ("dev_matched", 12), ("dev_mismatched", 9)):
    rows = [f"{i}\t0\t0n\tfiction\tx\ty\tx\ty\tgreat movie\tawful plot\t{labels[i % 3]}\t{labels[i % 3]}"
            for i in range(n)]
    (tmp_path / f"{split}.tsv").write_text("\n".join([header] + rows) + "\n")
  config = tiny_config(str(tmp_path), mnli.get_config())
  config.num_epochs = 1
  results = trainer.finetune(config, str(tmp_path / "run"))
  assert set(results["best_metrics"]) == {"accuracy", "dev_mismatched/accuracy"}
  assert results["best"] == results["best_metrics"]["accuracy"]
  logged = [r for r in _read_jsonl(tmp_path / "run" / "metrics.jsonl") if "eval/dev_mismatched/accuracy" in r]
  assert logged and all("eval/accuracy" in r for r in logged)
  assert sum(1 for _ in open(tmp_path / "run" / "predictions_dev_mismatched.tsv")) == 9 + 1


@pytest.mark.slow
def test_a_run_stopped_at_an_epoch_budget_and_continued_evaluates_as_one_run(data_dir, tmp_path):
  """At a budget between evaluations (successive halving's rung) the evaluation only scores the rung: it
  neither uses up patience nor becomes the best checkpoint, so the continued run is the uninterrupted one."""
  def config():
    c = tiny_config(data_dir)
    c.num_epochs, c.eval_every_steps, c.early_stopping_patience, c.write_predictions = 2, 5, 3, False
    return c

  evals = lambda name: [r["step"] for r in _read_jsonl(tmp_path / name / "metrics.jsonl") if "eval/accuracy" in r]
  full = trainer.finetune(config(), str(tmp_path / "full"))
  rung = trainer.finetune(config(), str(tmp_path / "cont"), max_epochs=1)   # 16 steps: between 15 and 20
  assert rung["score"] is not None and rung["score"] >= (rung["best"] or 0.0)
  assert any("budget_eval/accuracy" in r for r in _read_jsonl(tmp_path / "cont" / "metrics.jsonl"))
  cont = trainer.finetune(config(), str(tmp_path / "cont"))
  assert evals("cont") == evals("full")
  for key in ("best", "best_step", "stopped_early", "step"):
    assert cont[key] == full[key], key
