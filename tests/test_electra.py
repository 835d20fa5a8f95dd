"""ELECTRA (Clark et al. 2020): the Hugging Face generator and discriminator of ../shared/data/families/electra
read as our encoder and heads (transformers' outputs on fixed inputs), and written back."""

import functools
import json
import math
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import failures
from bert_jax import sharding
from bert_jax import train
from bert_jax import train_setup
from bert_jax.data import input_pipeline
from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from bert_jax.models import heads
from bert_jax.objectives import electra
from configs import electra_base, electra_large, electra_small
from conftest import REPO_ROOT, shared_path
from test_objectives import objective_config
from test_train import data_dir  # noqa: F401


@functools.cache
def _load(kind):
  path = shared_path("families", "electra", kind)
  return (path, *checkpoints_hf.load_hf(path))


def _examples(path):
  """Every example of reference.npz right-padded into one batch: (inputs, hidden states, logits, real)."""
  ref = np.load(path / "reference.npz")
  names = sorted({k.split("/")[0] for k in ref.files})
  length = max(ref[f"{n}/input_ids"].shape[1] for n in names)

  def stacked(key, seq_axis):
    pad = lambda x: np.pad(x, [(0, length - x.shape[a] if a == seq_axis else 0) for a in range(x.ndim)])
    return np.concatenate([pad(ref[f"{n}/{key}"]) for n in names])

  inputs = {ours: stacked(theirs, 1).astype(np.int32) for ours, theirs in
            (("input_ids", "input_ids"), ("input_mask", "attention_mask"), ("segment_ids", "token_type_ids"))}
  return inputs, stacked("hidden_states", 2), stacked("logits", 1), inputs["input_mask"] == 1


@functools.cache
def _run(kind):
  """Max abs errors against transformers at real positions: {"hidden_states", "logits"}."""
  path, cfg, params = _load(kind)
  inputs, ref_hidden, ref_logits, real = _examples(path)

  @jax.jit
  def fn(params, inputs):
    enc = model.BertEncoder(cfg).apply({"params": params["bert"]}, inputs["input_ids"], inputs["input_mask"],
                                       inputs["segment_ids"], output_hidden_states=True)
    if kind == "generator":
      logits = heads.BertForPreTraining(cfg, use_nsp=False, mlm_all_positions=True).apply(
          {"params": params}, inputs)["mlm_logits"]
    else:
      logits = electra.DiscriminatorHead(cfg).apply({"params": params["discriminator"]}, enc["sequence_output"])
    return jnp.moveaxis(enc["hidden_states"], 0, 1), logits

  hidden, logits = fn(params, inputs)
  err_hidden = np.abs(np.asarray(hidden) - ref_hidden).transpose(0, 2, 1, 3)[real].max()
  return {"hidden_states": float(err_hidden), "logits": float(np.abs(np.asarray(logits) - ref_logits)[real].max())}


@pytest.mark.parametrize("kind", ["discriminator", "generator"])
def test_import_matches_transformers_outputs(kind):
  errors = _run(kind)
  print(kind, "max abs err vs transformers:", errors)
  assert max(errors.values()) <= 1e-4, errors


def test_configs_read_as_the_encoder_switches():
  _, disc, disc_params = _load("discriminator")
  _, gen, gen_params = _load("generator")
  # Embedding size 32: projected to the discriminator's 64, not to the generator's 32 (no embeddings_project).
  assert (disc.embedding_size, disc.hidden_size, disc.share_layers, disc.hidden_act) == (32, 64, False, "gelu")
  assert (gen.embedding_size, gen.hidden_size, gen.num_heads) == (None, 32, 2)
  assert set(disc_params) == {"bert", "discriminator"} and set(gen_params) == {"bert", "mlm"}
  assert "projection" in disc_params["bert"]["embeddings"] and "projection" not in gen_params["bert"]["embeddings"]
  assert gen_params["mlm"]["transform"]["kernel"].shape == (32, 32)  # generator_predictions.dense: H -> E


@pytest.mark.parametrize("kind", ["discriminator", "generator"])
def test_export_writes_the_same_directory_and_reimports_identically(kind, tmp_path):
  path, cfg, params = _load(kind)
  checkpoints_hf.save_hf(tmp_path, cfg, params, model_type="electra")
  keys = ("model_type", "architectures", "embedding_size", "hidden_size", "num_hidden_layers", "intermediate_size",
          "vocab_size", "type_vocab_size", "max_position_embeddings", "hidden_act")
  written, original = ({k: json.loads((p / "config.json").read_text()).get(k) for k in keys} for p in (tmp_path, path))
  assert written == original
  # The very tensors transformers saved, names and values (no pooler, no tied decoder), and back again.
  jax.tree.map(np.testing.assert_array_equal, checkpoints_hf.read_safetensors(tmp_path),
               checkpoints_hf.read_safetensors(path))
  assert checkpoints_hf.load_hf(tmp_path)[0] == cfg
  jax.tree.map(np.testing.assert_array_equal, checkpoints_hf.load_hf(tmp_path)[1], params)
  if kind == "discriminator":   # its head says what it is: written the same without naming the family
    checkpoints_hf.save_hf(tmp_path / "unnamed", cfg, params)
    assert (tmp_path / "unnamed" / "config.json").read_text() == (tmp_path / "config.json").read_text()
    jax.tree.map(np.testing.assert_array_equal, checkpoints_hf.read_safetensors(tmp_path / "unnamed"),
                 checkpoints_hf.read_safetensors(path))


def test_electra_config_errors_name_what_transformers_lacks():
  cfg = model.BertConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
  assert checkpoints_hf.electra_config(checkpoints_hf.electra_hf_dict(cfg)) == cfg
  with pytest.raises(ValueError, match="ELECTRA shares no layers"):
    checkpoints_hf.electra_hf_dict(model.BertConfig(embedding_size=8, share_layers=True))
  with pytest.raises(ValueError, match="embedding projection transformers' ElectraModel leaves out"):
    checkpoints_hf.electra_hf_dict(model.BertConfig(hidden_size=16, num_heads=2, embedding_size=16))
  bad = {"electra.embeddings.word_embeddings.weight": np.zeros((3, 16), np.float32)}
  with pytest.raises(ValueError, match="does not match the electra config"):
    checkpoints_hf.from_state_dict(cfg, bad, model_type="electra")


# --- The objective on a tiny model -------------------------------------------------------------------------

TINY = model.BertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                        max_position_embeddings=16, embedding_size=8)


def _tiny_batch():
  ids = np.array([[2, 11, 3, 13, 14, 4, 0, 0], [2, 21, 22, 3, 24, 25, 26, 4]], np.int32)   # 3: [MASK]
  return {"input_ids": ids, "input_mask": (ids > 0).astype(np.int32), "segment_ids": np.zeros_like(ids),
          "masked_lm_positions": np.array([[2, 0], [3, 5]], np.int32),
          "masked_lm_ids": np.array([[12, 0], [23, 25]], np.int32),
          "masked_lm_weights": np.array([[1, 0], [1, 0]], np.float32)}  # [1, 5]: an unused slot


@functools.cache
def _tiny_params():
  m = electra.ElectraForPreTraining(TINY, 0.25)
  return m, nn.unbox(jax.jit(m.init)(jax.random.key(0), _tiny_batch())["params"])


@pytest.mark.slow
def test_params_hold_the_discriminator_as_bert_and_a_generator_reading_its_embeddings():
  _, params = _tiny_params()
  assert set(params) == {"bert", "discriminator", "generator"}
  assert set(params["generator"]) == {"projection", "encoder", "mlm"}
  assert params["generator"]["projection"]["kernel"].shape == (8, 4)   # E -> a quarter of H
  assert params["generator"]["mlm"]["transform"]["kernel"].shape == (4, 8)   # back to E for the tied decoder
  assert "embeddings" not in params["generator"]


@pytest.mark.parametrize("token, replaced", [(None, None), (30, [[0, 0, 1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0, 0]])])
def test_samples_equal_to_the_original_count_as_original(token, replaced):
  m, params = _tiny_params()
  batch = _tiny_batch()
  # A generator sure of one token: the original ones (12 and 23 differ, so force each row's own) or token 30.
  bias = np.full((2, TINY.vocab_size), -1e4, np.float32)
  for row, original in enumerate((12, 23)):
    bias[row, token if token is not None else original] = 0.0
  out, apply = [], jax.jit(functools.partial(m.apply, deterministic=False))
  for row in range(2):
    p = jax.tree.map(lambda x: x, params)
    p["generator"]["mlm"]["output_bias"] = bias[row]
    one = {k: v[row:row + 1] for k, v in batch.items()}
    out.append(np.asarray(apply({"params": p}, one, rngs={"dropout": jax.random.key(row)})["replaced"])[0])
  expected = np.zeros((2, 8), np.int32) if replaced is None else np.array(replaced)
  np.testing.assert_array_equal(np.stack(out), expected)   # never at padding or the unused slot's position 0


@pytest.mark.slow
def test_no_gradient_flows_through_sampling():
  m, params = _tiny_params()
  batch = _tiny_batch()

  def term(name, p):
    outputs = m.apply({"params": p}, batch, deterministic=False, rngs={"dropout": jax.random.key(1)})
    sums = electra.loss_sums(outputs, batch)
    return sums[f"{name}_loss_sum"] / sums[f"{name}_weight"]

  disc = jax.jit(jax.grad(functools.partial(term, "disc")))(params)
  assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(disc["generator"]))   # exactly zero
  assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(disc["bert"]))
  mlm = jax.jit(jax.grad(functools.partial(term, "mlm")))(params)
  assert np.any(np.asarray(mlm["bert"]["embeddings"]["word_embeddings"]["embedding"]) != 0)   # shared tables
  assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(mlm["discriminator"]))


@pytest.mark.slow
def test_objective_params_export_as_transformers_generator_and_discriminator(tmp_path):
  m, params = _tiny_params()
  batch = _tiny_batch()
  for kind, (cfg, ours) in electra.hf_models(TINY, params, 0.25).items():
    checkpoints_hf.save_hf(tmp_path / kind, cfg, ours, model_type="electra")
    cfg2, theirs = checkpoints_hf.load_hf(tmp_path / kind)
    assert cfg2 == cfg and json.loads((tmp_path / kind / "config.json").read_text())["embedding_size"] == 8
    without_pooler = lambda p: {**p, "bert": {k: v for k, v in p["bert"].items() if k != "pooler"}}
    jax.tree.map(np.testing.assert_array_equal, without_pooler(theirs), without_pooler(ours))   # ELECTRA saves none
  # The exported generator predicts the masked tokens as the objective's generator does.
  gen_cfg, gen_params = checkpoints_hf.load_hf(tmp_path / "generator")
  assert (gen_cfg.hidden_size, gen_cfg.embedding_size) == (4, 8)
  logits = heads.BertForPreTraining(gen_cfg, use_nsp=False).apply({"params": gen_params}, batch)["mlm_logits"]
  np.testing.assert_allclose(logits, m.apply({"params": params}, batch)["mlm_logits"], atol=1e-5)


def test_evaluation_samples_with_a_fixed_key():
  m, params = _tiny_params()
  apply = jax.jit(m.apply)
  a, b = (apply({"params": params}, _tiny_batch()) for _ in range(2))
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_loss_is_mlm_plus_fifty_times_the_discriminator_loss():
  sums = {"mlm_loss_sum": 6.0, "mlm_weight": 3.0, "disc_loss_sum": 2.0, "disc_weight": 40.0}
  assert float(electra.loss(sums)) == pytest.approx(2.0 + 50 * 0.05)


def _disc_outputs_and_batch():
  """Two rows, the second with three real tokens; at padding a positive logit and a replaced label that
  must not count. Real tokens: predicted replaced (logit > 0) / replaced:
  row 0: 0/0 1/1 0/1 1/0 1/0 -> TP 1, predicted 3, actual 2, correct 2 of 5;
  row 1: 1/1 1/0 0/1       -> TP 1, predicted 2, actual 2, correct 1 of 3."""
  logits = np.array([[-1, 2, -3, 4, 5, 6], [3, 2, -1, 1, 1, 1]], np.float32)
  replaced = np.array([[0, 1, 1, 0, 0, 0], [1, 0, 1, 0, 0, 1]], np.int32)
  mask = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], np.int32)
  return {"disc_logits": logits, "replaced": replaced}, {"input_mask": mask}


def test_replaced_token_precision_recall_f1_are_counts_that_add_up():
  outputs, batch = _disc_outputs_and_batch()
  sums = electra.disc_sums(outputs, batch)
  counts = {k: float(sums[f"disc_{k}"]) for k in ("true_positives", "predicted_positives", "actual_positives",
                                                  "correct", "weight")}
  assert counts == {"true_positives": 2, "predicted_positives": 5, "actual_positives": 4, "correct": 3, "weight": 8}
  # Summed over the rows one at a time (micro-batches, shards, hosts): the same counts.
  rows = [electra.disc_sums({k: v[i:i + 1] for k, v in outputs.items()}, {"input_mask": batch["input_mask"][i:i + 1]})
          for i in range(2)]
  jax.tree.map(lambda a, b, whole: np.testing.assert_array_equal(a + b, whole), *rows, sums)
  scalars = electra.summarize("eval", sums)
  assert scalars["eval/disc_accuracy"] == pytest.approx(3 / 8)
  assert scalars["eval/disc_precision"] == pytest.approx(2 / 5) and scalars["eval/disc_recall"] == pytest.approx(2 / 4)
  assert scalars["eval/disc_f1"] == pytest.approx(2 * 0.4 * 0.5 / (0.4 + 0.5))


def test_replaced_token_metrics_without_positives_are_zero():
  outputs, batch = _disc_outputs_and_batch()
  sums = electra.disc_sums({"disc_logits": -np.abs(outputs["disc_logits"]), "replaced": 0 * outputs["replaced"]}, batch)
  scalars = electra.summarize("train", sums)
  assert (scalars["train/disc_accuracy"], scalars["train/disc_precision"], scalars["train/disc_recall"],
          scalars["train/disc_f1"]) == (1.0, 0.0, 0.0, 0.0)


# transformers' ElectraForPreTraining ("electra" + "discriminator_predictions") at vocabulary 30522.
TRANSFORMERS_DISCRIMINATOR_PARAMS = {electra_small: 13_549_057, electra_base: 109_483_009, electra_large: 335_142_913}


@pytest.mark.parametrize("module", list(TRANSFORMERS_DISCRIMINATOR_PARAMS), ids=lambda m: m.__name__)
def test_discriminator_has_transformers_parameter_count(module):
  config = module.get_config()
  batch = train_setup.abstract_batch(config, 1)
  params = nn.unbox(jax.eval_shape(lambda b: electra.build_model(config).init(jax.random.key(0), b), batch)["params"])
  count = lambda tree: sum(math.prod(x.shape) for x in jax.tree.leaves(tree))
  assert "pooler" not in params["bert"]
  assert count({"bert": params["bert"], "discriminator": params["discriminator"]}) == \
      TRANSFORMERS_DISCRIMINATOR_PARAMS[module]


@pytest.mark.parametrize("fraction, message", [
    (1.5, r"generator_hidden_fraction 1.5 must be in \(0, 1\]: the generator may not be larger"),
    (0.3, "generator_hidden_fraction 0.3: the generator's sizes do not fit .*hidden_size 230 is not a multiple"),
])
def test_a_generator_that_cannot_be_built_is_named_before_compiling(fraction, message):
  config = electra_base.get_config()
  config.generator_hidden_fraction = fraction
  with pytest.raises(failures.UserError, match=message):
    train.validate(config, num_devices=8)


def test_the_cli_names_a_generator_larger_than_the_discriminator(tmp_path):
  done = subprocess.run(
      [sys.executable, "-m", "bert_jax.main", f"--config={REPO_ROOT}/configs/electra_small.py", f"--workdir={tmp_path}",
       f"--config.data.train_files={tmp_path}", "--config.generator_hidden_fraction=1.5"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == failures.USER_ERROR, done.stderr
  assert "generator_hidden_fraction 1.5 must be in (0, 1]" in done.stderr and "Traceback" not in done.stderr


def _train_metrics(config, steps):
  """Step metrics of the config on one device, batches from the real input pipeline."""
  mesh = sharding.create_mesh(config.mesh, devices=jax.devices()[:1])
  s, rngs = train_setup.setup(config, mesh), jax.random.split(jax.random.key(0))
  state, out = s.init(rngs[0]), []
  batches = input_pipeline.create_pretrain_iterator(config.data, global_batch_size=config.global_batch_size,
                                                    process_index=0, process_count=1, objective="electra")
  for _, host_batch in zip(range(steps), batches):
    state, metrics = s.train_step(state, sharding.global_batch(host_batch, mesh), rngs[1])
    out.append(jax.device_get(metrics))
  return out


@pytest.mark.slow
def test_trains_and_its_loss_falls(data_dir):  # noqa: F811
  config = objective_config(data_dir, "electra", **{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1})
  metrics = _train_metrics(config, steps=12)
  losses = [float(m["loss"]) for m in metrics]
  assert np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3]), losses
  scalars = electra.summarize("train", jax.tree.map(lambda *x: sum(x), *metrics))
  for name in ("disc_accuracy", "disc_precision", "disc_recall", "disc_f1", "mlm_accuracy"):
    assert math.isfinite(scalars[f"train/{name}"]), scalars


@pytest.mark.slow
def test_generator_attends_as_the_discriminator_does():
  """The generator's layers take the discriminator's attention context. With RoPE (and no position table)
  it sees the tokens' order; with a bare mask, as before, it gave the same logits for permuted tokens. And
  sliding windows (`local_attention`) change what it attends to, where before they were ignored."""
  rope = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
              max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0, rope_theta=1e4)
  b, length = 1, 16
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, 64, (b, length)), jnp.int32)
  positions = jnp.asarray([[1, 5, 9, 13]])

  def batch(ids, positions):
    return {"input_ids": ids, "input_mask": jnp.ones((b, length), jnp.int32),
            "segment_ids": jnp.zeros((b, length), jnp.int32), "masked_lm_positions": positions,
            "masked_lm_weights": jnp.ones(positions.shape, jnp.float32), "masked_lm_ids": jnp.zeros_like(positions)}

  def generator_logits(cfg, ids, positions, params=None):
    module = electra.ElectraForPreTraining(cfg)
    if params is None:
      params = jax.tree.map(lambda p: p * 30.0, module.init(jax.random.key(0), batch(ids, positions)))
    return module.apply(params, batch(ids, positions))["mlm_logits"], params

  logits, params = generator_logits(model.BertConfig(**rope), ids, positions)
  perm = rng.permutation(length)
  permuted, _ = generator_logits(model.BertConfig(**rope), ids[:, perm], jnp.asarray(np.argsort(perm))[positions],
                                 params)
  assert float(jnp.abs(logits - permuted).max()) > 1.0
  windowed = model.BertConfig(**rope, local_attention=4, global_attn_every_n_layers=2)   # layer 1 is local
  local_logits, _ = generator_logits(windowed, ids, positions, params)
  assert float(jnp.abs(logits - local_logits).max()) > 1.0


def test_a_pre_norm_generator_normalizes_its_output_as_the_discriminator():
  """With pre-norm layers and `final_norm`, the generator's stack output goes through its own final
  LayerNorm before the MLM head, as the discriminator's does before its head."""
  cfg = model.BertConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                         max_position_embeddings=64, pre_norm=True, final_norm=True)
  ids = jnp.ones((1, 8), jnp.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": jnp.zeros_like(ids),
           "masked_lm_positions": jnp.asarray([[1, 2]]), "masked_lm_weights": jnp.ones((1, 2), jnp.float32),
           "masked_lm_ids": jnp.ones((1, 2), jnp.int32)}
  params = electra.ElectraForPreTraining(cfg).init(jax.random.key(0), batch)["params"]
  assert "final_layer_norm" in params["generator"] and "final_layer_norm" in params["bert"]
