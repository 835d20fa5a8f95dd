"""DistilBERT (Sanh et al. 2019): a frozen teacher outside the train state, the student started from its
layers, the 5/2/1 loss, bad teachers stopped before compiling. On the loop (loss falls, 8 devices = 1,
exact resume) it is one of tests/test_objectives.py's objectives."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import checkpointing
from bert_jax import failures
from bert_jax import sharding
from bert_jax import train
from bert_jax import train_setup
from bert_jax.data import input_pipeline
from bert_jax.interop import checkpoints_hf
from bert_jax.models import heads
from bert_jax.objectives import distilbert
from test_train import compilation_cache, data_dir, read_metrics, tiny_config  # noqa: F401

TEACHER_LAYERS = 3


def tiny_teacher(data_dir, name="teacher", **changes):  # noqa: F811
  """A randomly initialised BERT with an MLM head, the student's width, TEACHER_LAYERS layers and the
  data's vocabulary, saved as a Hugging Face directory beside the prepared data (made once per name)."""
  path = os.path.join(os.path.dirname(data_dir), name)
  if not os.path.exists(os.path.join(path, "config.json")):
    student = train.bert_config(tiny_config(data_dir))
    cfg = dataclasses.replace(student, num_layers=TEACHER_LAYERS, **changes)
    ids = jnp.zeros((1, 8), jnp.int32)
    batch = {"input_ids": ids, "input_mask": ids, "segment_ids": ids, "masked_lm_positions": ids}
    params = jax.device_get(heads.BertForPreTraining(cfg, use_nsp=False).init(jax.random.key(7), batch)["params"])
    # A peaked MLM distribution, as a trained teacher's (a random one is near uniform: nothing to learn).
    params["mlm"]["output_bias"] = np.random.default_rng(7).normal(0, 8, cfg.vocab_size).astype(np.float32)
    checkpoints_hf.save_hf(path, cfg, params, vocab_file=os.path.join(data_dir, "vocab.txt"))
  return path


def distill_config(data_dir, **changes):  # noqa: F811
  """The tiny test config as a DistilBERT student of `tiny_teacher`."""
  from test_objectives import objective_config  # pylint: disable=g-import-not-at-top
  return objective_config(data_dir, "distilbert", **changes)


def _setup(config, devices=None):
  mesh = sharding.create_mesh(config.mesh, devices=devices or jax.devices()[:1])
  return train_setup.load_frozen(train_setup.setup(config, mesh)), mesh


def _batch(config, mesh):
  it = input_pipeline.create_pretrain_iterator(config.data, global_batch_size=config.global_batch_size,
                                               process_index=0, process_count=1, objective=config.objective)
  return sharding.global_batch(next(iter(it)), mesh)


@pytest.mark.parametrize("soft_positions", ["all", "masked"])
@pytest.mark.slow
def test_teacher_is_frozen_and_outside_the_state(data_dir, soft_positions):  # noqa: F811
  config = distill_config(data_dir, **{"mesh.fsdp": 1, "mesh.tensor": 1, "distill.soft_positions": soft_positions})
  s, mesh = _setup(config)
  teacher_before = jax.device_get(s.frozen)
  state = s.init(jax.random.key(0))
  assert set(state.params) == {"bert", "mlm"}   # the student only: no teacher, no pooler, no token types
  assert "pooler" not in state.params["bert"] and "token_type_embeddings" not in state.params["bert"]["embeddings"]
  n_params = len(jax.tree.leaves(state.params))
  assert len([x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]) == 2 * n_params   # Adam's mu, nu
  batch = _batch(config, mesh)

  # No gradient reaches the teacher: d loss / d teacher is exactly zero.
  def loss_of(frozen):
    outputs = s.model.apply({"params": state.params, "frozen": frozen}, batch, deterministic=True)
    return distilbert.loss(distilbert.loss_sums(outputs, batch, config), distilbert.loss_weights(batch, config))
  grads = jax.jit(jax.grad(loss_of))(s.frozen)
  assert all(float(jnp.max(jnp.abs(g))) == 0.0 for g in jax.tree.leaves(grads))

  new, metrics = s.train_step(state, batch, jax.random.key(1))
  assert np.isfinite(float(metrics["loss"]))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(s.frozen), teacher_before)   # untouched


@pytest.mark.slow
def test_the_student_checkpoint_holds_no_teacher(data_dir, tmp_path):  # noqa: F811
  config = distill_config(data_dir, train_steps=2, checkpoint_every=2, **{"mesh.fsdp": 1, "mesh.tensor": 1})
  train.train_and_evaluate(config, str(tmp_path))
  checkpoints = tmp_path / "checkpoints"
  # Every name and every metadata file of the checkpoint: the student's params and optimizer state only.
  for path in checkpoints.rglob("*"):
    assert "teacher" not in path.name and "frozen" not in path.name, path
    if path.is_file() and path.stat().st_size < 1_000_000:
      text = path.read_bytes().decode("utf-8", "ignore")
      assert "teacher" not in text and "frozen" not in text, path
  step = checkpointing.Checkpointer(str(checkpoints), keep=1).latest_step()
  s, _ = _setup(config)
  restored = checkpointing.restore_params(str(checkpoints / str(step)), s.abstract_state.params)
  assert set(restored) == {"bert", "mlm"}
  scalars = read_metrics(str(tmp_path))
  assert any("train/soft_loss" in m and "train/cos_loss" in m and "train/mlm_loss" in m for m in scalars)


@pytest.mark.slow
def test_student_starts_from_the_teachers_layers(data_dir):  # noqa: F811
  config = distill_config(data_dir, **{"mesh.fsdp": 1, "mesh.tensor": 1, "model.num_layers": 2})
  s, _ = _setup(config)
  assert distilbert.student_layers(config, distilbert.teacher_config(config)) == (0, 2)   # round(linspace(0, 2, 2))
  state, origin = train.restore_or_init(s, config, _NoCheckpoints(), None, jax.random.key(0))
  assert origin == "initialized from the frozen variables"
  student, teacher = jax.device_get(state.params), jax.device_get(s.frozen)["teacher"]
  for name in ("word_embeddings", "position_embeddings", "layer_norm"):
    jax.tree.map(np.testing.assert_array_equal, student["bert"]["embeddings"][name],
                 teacher["bert"]["embeddings"][name])
  for i, j in enumerate((0, 2)):
    jax.tree.map(np.testing.assert_array_equal, student["bert"]["encoder"][f"layer_{i}"],
                 teacher["bert"]["encoder"][f"layer_{j}"])
  jax.tree.map(np.testing.assert_array_equal, student["mlm"], teacher["mlm"])


class _NoCheckpoints:
  directory = "none"

  def restore_latest(self, abstract):
    return None, None, None


def test_released_layer_choice_for_twelve_to_six():
  from configs import distilbert_base  # pylint: disable=g-import-not-at-top
  c = distilbert_base.get_config()
  teacher = distilbert.teacher_config(c)   # no checkpoint: the preset (BERT-base)
  assert distilbert.student_layers(c, teacher) == (0, 2, 4, 7, 9, 11)   # scripts/extract_distilbert.py


def test_loss_is_five_soft_two_mlm_one_cosine():
  rng = np.random.default_rng(0)
  b, l, v, h, t = 2, 4, 7, 3, 2.0
  outputs = {"mlm_logits": rng.normal(size=(b, l, v)), "teacher_mlm_logits": rng.normal(size=(b, l, v)),
             "sequence_output": rng.normal(size=(b, l, h)), "teacher_sequence_output": rng.normal(size=(b, l, h))}
  batch = {"input_mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]]), "masked_lm_positions": np.array([[1, 2], [0, 0]]),
           "masked_lm_ids": np.array([[3, 4], [5, 0]]), "masked_lm_weights": np.array([[1.0, 1.0], [1.0, 0.0]])}
  outputs = {k: jnp.asarray(x, jnp.float32) for k, x in outputs.items()}
  sums = distilbert.loss_sums(outputs, batch)

  def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
  real = batch["input_mask"] == 1
  s, te = (np.asarray(outputs[k], np.float64) for k in ("mlm_logits", "teacher_mlm_logits"))
  p = np.exp(log_softmax(te / t))
  soft = (-(p * log_softmax(s / t)).sum(-1) * t * t)[real].mean()
  so, to = (np.asarray(outputs[k], np.float64) for k in ("sequence_output", "teacher_sequence_output"))
  cos = (1 - (so * to).sum(-1) / np.linalg.norm(so, axis=-1) / np.linalg.norm(to, axis=-1))[real].mean()
  logp = log_softmax(s)
  nll = [-logp[0, 1, 3], -logp[0, 2, 4], -logp[1, 0, 5]]
  expected = 5.0 * soft + 2.0 * np.mean(nll) + 1.0 * cos
  np.testing.assert_allclose(float(distilbert.loss(sums)), expected, rtol=1e-5)
  kl = soft - (-(p * np.log(p)).sum(-1) * t * t)[real].mean()
  np.testing.assert_allclose(distilbert.summarize("x", jax.device_get(sums))["x/distill_kl"], kl, rtol=1e-4)


@pytest.mark.parametrize("problem, changes, teacher_changes", [
    ("vocabulary", {}, {"vocab_size": 160}),
    ("hidden size", {}, {"hidden_size": 64, "num_heads": 2, "intermediate_size": 64}),
])
@pytest.mark.slow
def test_a_teacher_unlike_the_student_stops_before_compiling(data_dir, problem, changes, teacher_changes):  # noqa: F811
  config = distill_config(data_dir, **{"distill.teacher": tiny_teacher(data_dir, f"bad_{problem}", **teacher_changes),
                                       **changes})
  with pytest.raises(failures.UserError, match=f"teacher's {problem}"):
    train.check_inputs(config)


def test_an_unreadable_teacher_or_another_vocabulary_stops_before_compiling(data_dir, tmp_path):  # noqa: F811
  config = distill_config(data_dir, **{"distill.teacher": str(tmp_path / "nowhere")})
  with pytest.raises(failures.UserError, match="distill.teacher .* cannot be read"):
    train.check_inputs(config)
  other = tmp_path / "other_vocab"
  teacher = tiny_teacher(data_dir)
  other.mkdir()
  for name in os.listdir(teacher):
    data = open(os.path.join(teacher, name), "rb").read()
    if name == "vocab.txt":
      lines = data.decode().splitlines()
      data = "\n".join(lines[:-2] + lines[-1:] + lines[-2:-1]).encode() + b"\n"   # two ids swapped
    (other / name).write_bytes(data)
  config = distill_config(data_dir, **{"distill.teacher": str(other)})
  with pytest.raises(failures.UserError, match="data's vocabulary .* is not the teacher's"):
    train.check_inputs(config)


def test_student_layers_the_teacher_does_not_have_stop_before_compiling(data_dir):  # noqa: F811
  """Scanned, the teacher's stacked layers indexed past the last would start a student layer from the last
  one; unrolled, a KeyError: both the teacher checkpoint and a preset teacher name them first."""
  config = distill_config(data_dir, **{"distill.teacher": tiny_teacher(data_dir), "distill.student_layers": (7,)})
  with pytest.raises(failures.UserError, match=rf"teacher layers \[7\] of a teacher of {TEACHER_LAYERS} layers"):
    train.check_inputs(config)
  preset = distill_config(data_dir, **{"distill.teacher": "", "distill.teacher_preset": "L-5_H-128_A-2",
                                       "distill.student_layers": (5,)})
  assert distilbert.validate(preset) == ["distill.student_layers names teacher layers [5] of a teacher of 5 layers "
                                         "(0 to 4)"]
  preset.distill.student_layers = (-1,)
  assert distilbert.validate(preset) == ["distill.student_layers (-1,): teacher layers are numbered from 0"]


@pytest.mark.slow
def test_pretraining_starts_from_a_hugging_face_checkpoint(data_dir):  # noqa: F811
  """A teacher without an MLM head is first given one by MLM training from its weights: `init_from` reads
  a Hugging Face directory (params only); what it lacks stays newly initialised."""
  teacher = tiny_teacher(data_dir)
  changes = {"model.num_layers": TEACHER_LAYERS, "mesh.fsdp": 1, "mesh.tensor": 1, "init_from": teacher}
  with pytest.raises(failures.UserError, match="init_from_params_only=True"):
    train.check_inputs(tiny_config(data_dir, **changes))
  config = tiny_config(data_dir, init_from_params_only=True, **{**changes, "data.format": "full_sentences"})
  train.check_inputs(config)
  s = train_setup.setup(config, sharding.create_mesh(config.mesh, devices=jax.devices()[:1]))
  state, origin = train.restore_or_init(s, config, _NoCheckpoints(), None, jax.random.key(0))
  assert origin.startswith(f"initialized from {teacher}")
  _, saved = checkpoints_hf.load_hf(teacher)
  got = jax.device_get(state.params)
  assert set(got) == {"bert", "mlm"}
  jax.tree.map(np.testing.assert_array_equal, got["bert"], saved["bert"])
  jax.tree.map(np.testing.assert_array_equal, got["mlm"], saved["mlm"])


def test_soft_targets_at_the_masked_positions_only():
  """`distill.soft_positions = "masked"`: logits [B, P, V], the soft term over the masked positions."""
  from configs import distilbert_minilm  # pylint: disable=g-import-not-at-top
  config = distilbert_minilm.get_config()
  assert distilbert.soft_at_masked(config)
  rng = np.random.default_rng(1)
  b, l, p, v, h, t = 2, 5, 2, 6, 3, 2.0
  outputs = {"mlm_logits": rng.normal(size=(b, p, v)), "teacher_mlm_logits": rng.normal(size=(b, p, v)),
             "sequence_output": rng.normal(size=(b, l, h)), "teacher_sequence_output": rng.normal(size=(b, l, h))}
  outputs = {k: jnp.asarray(x, jnp.float32) for k, x in outputs.items()}
  batch = {"input_mask": np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]), "masked_lm_positions": np.array([[1, 3], [2, 0]]),
           "masked_lm_ids": np.array([[3, 4], [5, 0]]), "masked_lm_weights": np.array([[1.0, 1.0], [1.0, 0.0]])}
  sums = distilbert.loss_sums(outputs, batch, config)
  weights = distilbert.loss_weights(batch, config)
  assert float(weights["soft"]) == 3.0 and float(weights["cos"]) == 7.0 and float(sums["soft_weight"]) == 3.0
  s_logp = jax.nn.log_softmax(outputs["mlm_logits"] / t)
  t_p = jax.nn.softmax(outputs["teacher_mlm_logits"] / t)
  per_slot = -(t_p * s_logp).sum(-1) * t * t
  np.testing.assert_allclose(float(sums["soft_loss_sum"]), float(per_slot[0, 0] + per_slot[0, 1] + per_slot[1, 0]),
                             rtol=1e-5)
