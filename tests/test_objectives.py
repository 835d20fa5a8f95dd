"""Every pretraining objective on the same loop: schema = pipeline batches, loss falls, the 8-device mesh
gives one device's losses, property tests (LTR sees no future, SBO targets masked span tokens), bad input."""

import jax
import numpy as np
import pytest

from bert_jax import failures
from bert_jax import objectives
from bert_jax import sharding
from bert_jax import train
from bert_jax import train_setup
from bert_jax.data import input_pipeline
from test_train import check_exact_resume_after_sigterm, compilation_cache, data_dir, tiny_config  # noqa: F401

# What each objective needs of the tiny config beyond the BERT defaults.
CHANGES = {
    "bert": {},
    "roberta": {"data.format": "full_sentences", "model.type_vocab_size": 1},
    "spanbert": {"data.format": "doc_sentences", "data.span_masking": True},
    "ltr": {"data.format": "full_sentences", "model.causal": True},
    "electra": {"data.format": "doc_segments", "model.num_heads": 8},   # the generator's 2 heads: tensor 2
    "albert": {"data.format": "sop", "data.ngram_masking": True, "model.share_layers": True,
               "model.embedding_size": 16},
    # Layer 0 global, layers 1-2 attend within 4 tokens either side of 32; packed documents; its optimizer.
    "modernbert": {"data.format": "doc_sentences", "data.packing": True, "data.masked_lm_prob": 0.3,
                   "data.max_predictions_per_seq": 10, "model.num_layers": 3, "model.type_vocab_size": 0,
                   "model.rope_theta": 160000.0, "model.local_rope_theta": 10000.0, "model.geglu": True,
                   "model.pre_norm": True, "model.final_norm": True, "model.norm_bias": False,
                   "model.dense_bias": False, "model.global_attn_every_n_layers": 3, "model.local_attention": 8,
                   "model.layer_norm_eps": 1e-5, "optimizer.name": "stable_adamw", "optimizer.schedule": "wsd",
                   "optimizer.decay_steps": 50, "optimizer.final_lr_fraction": 0.001},
}


def objective_changes(data_dir, name) -> dict:  # noqa: F811
  """CHANGES[name]; for distilbert, a student of a tiny teacher saved beside the data."""
  if name == "distilbert":
    from test_distillation import tiny_teacher  # pylint: disable=g-import-not-at-top
    return {"data.format": "full_sentences", "model.type_vocab_size": 0, "distill.teacher": tiny_teacher(data_dir)}
  return CHANGES[name]


def objective_config(data_dir, name, **changes):  # noqa: F811
  return tiny_config(data_dir, objective=name, **{**objective_changes(data_dir, name), **changes})


@pytest.mark.parametrize("name", objectives.NAMES)
def test_pipeline_batches_follow_the_schema(data_dir, name):  # noqa: F811
  config = objective_config(data_dir, name)
  it = input_pipeline.create_pretrain_iterator(config.data, global_batch_size=8, process_index=0, process_count=1,
                                               objective=name)
  batch = next(iter(it))
  schema = objectives.get(name).batch_schema(config.data, 8)
  assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {k: (np.dtype(f.dtype), f.shape) for k, f in schema.items()}
  for key, field in schema.items():
    high = train.bert_config(config).vocab_size if field.high == "vocab" else field.high
    assert 0 <= batch[key].min() and batch[key].max() < max(high, 1) + (key.endswith("weights")), key


def _losses(config, devices, steps):
  """Train-step losses of the config's objective on `devices`, batches from the real input pipeline."""
  mesh = sharding.create_mesh(config.mesh, devices=devices)
  s = train_setup.load_frozen(train_setup.setup(config, mesh))
  it = input_pipeline.create_pretrain_iterator(config.data, global_batch_size=config.global_batch_size,
                                               process_index=0, process_count=1, objective=config.objective)
  init_rng, dropout_rng = jax.random.split(jax.random.key(0))
  state, losses = s.init(init_rng), []
  for _, host_batch in zip(range(steps), it):
    state, metrics = s.train_step(state, sharding.global_batch(host_batch, mesh), dropout_rng)
    losses.append(float(metrics["loss"]))
  return losses


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in objectives.NAMES if n != "bert"])   # bert: test_train, test_mesh
def test_trains_sharded_with_one_devices_losses_and_its_loss_falls(data_dir, name):  # noqa: F811
  one = _losses(objective_config(data_dir, name, **{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1}),
                jax.devices()[:1], steps=30)
  eight = _losses(objective_config(data_dir, name, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2}),
                  jax.devices(), steps=2)
  np.testing.assert_allclose(eight, one[:2], rtol=2e-5)   # the second loss is after one update
  assert np.mean(one[-5:]) < 0.8 * np.mean(one[:5]), one


# `exhaustive`: their data format (full_sentences) resumes in the slow run and CI with distilbert's, and their
# state is saved and restored as every objective's is, one pytree. SpanBERT (span masking, the SBO head) stays.
_RESUMED_ELSEWHERE = ("roberta", "ltr")


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.exhaustive) if n in _RESUMED_ELSEWHERE else n
                                  for n in objectives.NAMES if n != "bert"])   # bert: test_train
def test_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, name):  # noqa: F811
  check_exact_resume_after_sigterm(data_dir, tmp_path, compilation_cache, n=4, objective=name, **objective_changes(data_dir, name))


@pytest.mark.slow
def test_modernbert_with_the_splash_kernel_ends_with_its_preview(data_dir, tmp_path, capsys):  # noqa: F811
  """The end-of-run fill-mask preview runs on the host at its lines' lengths, which splash cannot take:
  it computes as a loaded checkpoint does (configs/modernbert_base.py's runs ended in a traceback)."""
  config = objective_config(data_dir, "modernbert", **{
      "model.attention_kernel": "splash", "data.seq_length": 128, "model.max_position_embeddings": 128,
      "data.max_predictions_per_seq": 20, "train_steps": 2, "fill_mask_examples": 2,
      "mesh.fsdp": 1, "mesh.tensor": 1})
  train.train_and_evaluate(config, str(tmp_path / "run"))
  assert "masked: " in capsys.readouterr().out


def test_unknown_objective_is_a_user_error(data_dir):  # noqa: F811
  with pytest.raises(failures.UserError, match="'electrum' is not one of"):
    train.validate(tiny_config(data_dir, objective="electrum"))


@pytest.mark.parametrize("name, fmt", [("albert", "nsp"), ("spanbert", "nsp"), ("ltr", "sop"),
                                       ("roberta", "nsp"), ("modernbert", "nsp")])
def test_a_format_the_objective_cannot_use_names_both(data_dir, name, fmt):  # noqa: F811
  with pytest.raises(failures.UserError, match=f"data.format '{fmt}' cannot be used by objective '{name}'"):
    train.validate(objective_config(data_dir, name, **{"data.format": fmt}))


def test_span_boundary_targets_are_masked_span_tokens(data_dir):  # noqa: F811
  config = objective_config(data_dir, "spanbert")
  it = input_pipeline.create_pretrain_iterator(config.data, global_batch_size=16, process_index=0,
                                               process_count=1, objective="spanbert")
  batch = next(iter(it))
  real = batch["masked_lm_weights"] > 0
  assert real.sum() > 0
  rows = np.nonzero(real)[0]
  pos = batch["masked_lm_positions"][real]
  left, right = batch["masked_lm_span_left"][real], batch["masked_lm_span_right"][real]
  masked = np.zeros(batch["input_ids"].shape, bool)
  masked[rows, pos] = True
  assert (left < pos).all() and (pos < right).all()
  assert not masked[rows, left].any() and not masked[rows, right].any()   # boundaries are not targets
  assert all(masked[r, l + 1:h].all() for r, l, h in zip(rows, left, right))   # the span between them is
  np.testing.assert_array_equal(batch["masked_lm_span_offset"][real], pos - left - 1)
  # As the release's `--endpoints external`: no boundary targets for a span beside [CLS] or [SEP].
  ids = batch["input_ids"]
  cls, sep = ids[0, 0], ids[0, batch["input_mask"][0].sum() - 1]
  beside = np.isin(ids[rows, left], (cls, sep)) | np.isin(ids[rows, right], (cls, sep))
  np.testing.assert_array_equal(batch["masked_lm_span_weights"][real], ~beside)
  assert 0 < beside.sum() < len(beside)
  # ... and only a span's first `sbo_max_targets` tokens; the SBO mean is over those.
  spanbert = objectives.get(config)
  with config.unlocked():
    config.sbo_max_targets = 2
  targets = batch["masked_lm_span_weights"] * (batch["masked_lm_span_offset"] < 2)
  assert 0 < targets.sum() < batch["masked_lm_span_weights"].sum()
  weights = spanbert.loss_weights(batch, config)
  assert float(weights["sbo"]) == targets.sum() and float(weights["mlm"]) == real.sum()
  params = jax.eval_shape(spanbert.build_model(config).init, jax.random.key(0), batch)["params"]
  assert params["sbo"]["position_embeddings"]["embedding"].value.shape == (2, spanbert.SBO_POSITION_SIZE)


def test_the_boundary_head_initialises_on_a_tensor_split_its_width_does_not_divide(data_dir):  # noqa: F811
  """The head's input is 2H + sbo_position_size wide (odd here), which a tensor split need not divide: that axis
  is not split (it was, over `tensor`, and the state's init raised on this mesh)."""
  config = objective_config(data_dir, "spanbert", **{"mesh.data": 1, "mesh.fsdp": 4, "mesh.tensor": 2,
                                                     "model.num_heads": 2})
  with config.unlocked():
    config.sbo_position_size = 201
  s = train_setup.setup(config, sharding.create_mesh(config.mesh))
  state = s.init(train_setup.rngs(config)[0])
  h = train.bert_config(config).hidden_size
  assert state.params["sbo"]["dense"]["kernel"].shape == (2 * h + 201, h)


@pytest.mark.parametrize("changes, match", [
    ({"model.rope_theta": None, "model.geglu": None, "model.pre_norm": None, "model.final_norm": None,
      "model.norm_bias": None, "model.dense_bias": None, "model.global_attn_every_n_layers": None,
      "model.local_attention": None, "model.local_rope_theta": None}, "needs ModernBERT's encoder switches"),
    ({"model.type_vocab_size": 2}, "no token types")], ids=["bert_encoder", "token_types"])
def test_modernbert_needs_its_encoder(data_dir, changes, match):  # noqa: F811
  with pytest.raises(failures.UserError, match=match):
    train.validate(objective_config(data_dir, "modernbert", **changes))


def test_modernbert_model_is_hugging_faces_masked_lm(data_dir):  # noqa: F811
  """No pooler, no token types, no NSP head: the parameter tree of ModernBertForMaskedLM's modules."""
  config = objective_config(data_dir, "modernbert")
  s = train_setup.setup(config, sharding.create_mesh(config.mesh))
  params = s.abstract_state.params
  assert set(params) == {"bert", "mlm"} and "pooler" not in params["bert"]
  assert "token_type_embeddings" not in params["bert"]["embeddings"]
  per_row = objectives.get("modernbert").forward_flops_per_row(config)
  assert per_row["pooler"] == per_row["nsp"] == 0.0
  cfg = objectives.encoder_config(config)   # GeGLU: three h x i matrices a layer, counted once
  assert cfg.geglu and per_row["mlp"] == (cfg.num_layers * config.data.seq_length
                                          * 2 * 3 * cfg.hidden_size * cfg.intermediate_size)


def test_cross_entropy_sums_are_log_softmaxs_and_argmaxs():
  # -log p(label) as logsumexp minus the label's logit (its gradient is one elementwise pass): the values
  # and the gradient of log_softmax read at the label; a tie counts as argmax does (the first index).
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import base  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 50)).astype(np.float32) * 4
  labels = rng.integers(0, 50, (2, 3)).astype(np.int32)
  logits[0, 0, [7, 9]] = logits[0, 1, [7, 9]] = 30.0   # ties for the max: argmax is 7
  labels[0, 0], labels[0, 1], labels[1, 2] = 7, 9, int(np.argmax(logits[1, 2]))
  weights = np.array([[1.0, 1.0, 0.5], [2.0, 0.0, 1.0]], np.float32)

  def reference(logits):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0] * weights)

  loss_sum, correct = base.cross_entropy_sums(jnp.asarray(logits), labels, weights)
  np.testing.assert_allclose(loss_sum, reference(logits), rtol=1e-6)
  assert float(correct) == np.sum((np.argmax(logits, -1) == labels) * weights) == 2.0
  grad = jax.grad(lambda x: base.cross_entropy_sums(x, labels, weights)[0])(jnp.asarray(logits))
  np.testing.assert_allclose(grad, jax.grad(reference)(jnp.asarray(logits)), rtol=1e-5, atol=1e-7)


def _matmul_flops(jaxpr, trips=1) -> int:
  """2 x output elements x contracted size of every dot_general in `jaxpr`, scans' bodies per trip."""
  import math  # pylint: disable=g-import-not-at-top
  from jax.extend import core  # pylint: disable=g-import-not-at-top
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contracted, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += trips * 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[i] for i in contracted)
    inner = trips * (eqn.params["length"] if eqn.primitive.name == "scan" else 1)
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(sub, (core.ClosedJaxpr, core.Jaxpr)):
          total += _matmul_flops(getattr(sub, "jaxpr", sub), inner)
  return total


def test_spanbert_flops_are_its_matmuls_with_factorized_embeddings(data_dir):  # noqa: F811
  """The SBO head's second layer projects to the embedding width E, and its decoder is E x V (tied to the
  E-wide table): the count is the model's traced matmuls, also where E is not the hidden size."""
  from bert_jax.tools import bench_train  # pylint: disable=g-import-not-at-top
  config = objective_config(data_dir, "spanbert", **{"model.embedding_size": 16, "model.vocab_size": 1536})
  objective = objectives.get(config)
  batch = bench_train.synthetic_batch(config)
  model = objective.build_model(config)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), batch))
  traced = _matmul_flops(jax.make_jaxpr(lambda p: model.apply(p, batch))(params).jaxpr)
  assert sum(objective.forward_flops_per_row(config).values()) * config.global_batch_size == traced
