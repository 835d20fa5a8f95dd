"""Checkpoint interop: parity with Hugging Face outputs on real MiniLM weights, HF and TF round trips."""

import dataclasses
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_jax.interop import checkpoints_hf
from bert_jax.interop import checkpoints_tf
from bert_jax.models import heads
from bert_jax.models import encoder as model
from tests.conftest import shared_path

TOLERANCE = 1e-4  # float32 max abs error against transformers' outputs


@pytest.fixture(scope="module")
def minilm():
  path = shared_path("minilm")
  return path, np.load(path / "hf_reference.npz")


@functools.cache
def encoder_fn(cfg):
  """The jitted encoder of `cfg`, shared by the tests (equal configs and shapes compile once)."""
  # Params as an argument, not a closure: constants would be folded into every compilation.
  return jax.jit(lambda p, *inputs: model.BertEncoder(cfg).apply({"params": p}, *inputs, output_hidden_states=True))


def reference_errors(cfg, bert_params, ref, per_example=True) -> dict:
  """Max abs errors against hf_reference.npz: per stored example, and the padded batch at real positions."""
  run = lambda *inputs: encoder_fn(cfg)(bert_params, *inputs)
  errors = {}
  i = 0
  while per_example and f"input_ids_{i}" in ref:
    ids, seg = (ref[f"{k}_{i}"][None].astype(np.int32) for k in ("input_ids", "token_type_ids"))
    out = run(ids, np.ones_like(ids), seg)
    errors[f"hidden_states_{i}"] = np.abs(out["hidden_states"][:, 0] - ref[f"hidden_states_{i}"]).max()
    errors[f"last_hidden_state_{i}"] = np.abs(out["sequence_output"][0] - ref[f"last_hidden_state_{i}"]).max()
    errors[f"pooler_output_{i}"] = np.abs(out["pooled_output"][0] - ref[f"pooler_output_{i}"]).max()
    i += 1
  assert i == (8 if per_example else 0)
  mask = ref["batch_attention_mask"].astype(np.int32)
  out = run(ref["batch_input_ids"].astype(np.int32), mask, ref["batch_token_type_ids"].astype(np.int32))
  diff = np.abs(out["sequence_output"] - ref["batch_last_hidden_state"]).max(-1)
  errors["batch_real_positions"] = diff[mask == 1].max()
  return errors


def assert_parity(cfg, bert_params, ref, per_example=True):
  errors = reference_errors(cfg, bert_params, ref, per_example)
  worst = max(errors, key=errors.get)
  assert errors[worst] <= TOLERANCE, (worst, errors[worst])
  return errors[worst]


@pytest.mark.slow
def test_hf_import_matches_reference_outputs(minilm):
  path, ref = minilm
  cfg, params = checkpoints_hf.load_hf(path)
  assert set(params) == {"bert"}  # a BertModel checkpoint: no heads
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (6, 384, 12)
  print("max abs err, HF import:", assert_parity(cfg, params["bert"], ref))


def test_export_reimport_is_exact_and_matches_reference(minilm, tmp_path):
  path, ref = minilm
  cfg, params = checkpoints_hf.load_hf(path, scan_layers=True)
  assert params["bert"]["encoder"]["layers"]["output"]["kernel"].shape == (6, 1536, 384)
  checkpoints_hf.save_hf(tmp_path / "out", cfg, params, vocab_file=path / "vocab.txt")
  assert (tmp_path / "out" / "vocab.txt").read_bytes() == (path / "vocab.txt").read_bytes()
  original = load_file(str(path / "model.safetensors"))
  exported = load_file(str(tmp_path / "out" / "model.safetensors"))
  assert set(original) - set(exported) == {"embeddings.position_ids"}
  for name, value in exported.items():
    np.testing.assert_array_equal(value, original[name], err_msg=name)
  cfg2, params2 = checkpoints_hf.load_hf(tmp_path / "out")
  assert cfg2 == dataclasses.replace(cfg, scan_layers=False)
  jax.tree.map(np.testing.assert_array_equal, model.scan_params(params2), params)
  # Identical tensors, so one run on the padded batch (all eight sentences) is the output check.
  print("max abs err, HF export -> import:", assert_parity(cfg2, params2["bert"], ref, per_example=False))


@pytest.mark.slow
def test_google_tf_checkpoint_route_matches_reference(minilm, tmp_path):
  tf = pytest.importorskip("tensorflow")
  path, ref = minilm
  cfg, params = checkpoints_hf.load_hf(path)
  # Written with the tf.compat.v1 Saver of google-research/bert (by variable name, optimizer slots and
  # global step included). Eager variables: a graph would hold every weight twice as a constant (16 s).
  state = checkpoints_hf.to_state_dict(cfg, params)
  variables = {"global_step": tf.Variable(0, dtype=tf.int64)}
  for hf_name, value in state.items():
    tf_name, transpose = checkpoints_tf.hf_to_tf_name(hf_name)
    variables[tf_name] = tf.Variable(np.ascontiguousarray(value.T if transpose else value))
    variables[tf_name + "/adam_m"] = tf.Variable(np.zeros_like(value))
  tf.compat.v1.train.Saver(variables).save(None, str(tmp_path / "bert_model.ckpt"))
  names = set(tf.train.load_checkpoint(str(tmp_path / "bert_model.ckpt")).get_variable_to_shape_map())
  assert {"bert/encoder/layer_0/attention/self/query/kernel", "bert/embeddings/LayerNorm/gamma",
          "bert/encoder/layer_5/output/dense/kernel", "bert/pooler/dense/bias"} <= names
  (tmp_path / "bert_config.json").write_text(json.dumps(cfg.to_hf_dict()))
  cfg_tf, params_tf = checkpoints_tf.load_tf(tmp_path)  # the directory: finds the latest checkpoint
  assert cfg_tf == cfg and set(params_tf) == {"bert"}
  jax.tree.map(np.testing.assert_array_equal, params_tf, params)
  print("max abs err, TF checkpoint:", assert_parity(cfg_tf, params_tf["bert"], ref, per_example=False))


@functools.cache
def _tiny_pretraining_params():
  # Compiling the initialisers costs seconds: done once for the module.
  cfg = model.BertConfig.from_preset("tiny", vocab_size=50, max_position_embeddings=16)
  ids = np.ones((1, 4), np.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": ids, "masked_lm_positions": ids}
  params = jax.jit(heads.BertForPreTraining(cfg).init)(jax.random.key(0), batch)["params"]
  return cfg, jax.tree.map(np.asarray, nn.unbox(params))


def tiny_pretraining_params(scan_layers=False):
  """(config, numpy params) of a tiny BertForPreTraining, in the scanned or unscanned layout."""
  cfg, params = _tiny_pretraining_params()
  if scan_layers:
    return dataclasses.replace(cfg, scan_layers=True), model.scan_params(params)
  return cfg, jax.tree.map(lambda x: x, params)  # fresh dicts


def test_heads_round_trip_through_hf_and_tf(tmp_path):
  pytest.importorskip("tensorflow")
  cfg, params = tiny_pretraining_params(scan_layers=True)
  checkpoints_hf.save_hf(tmp_path / "hf", cfg, params)
  state = load_file(str(tmp_path / "hf" / "model.safetensors"))
  assert "bert.encoder.layer.1.attention.self.query.weight" in state
  assert {"cls.predictions.bias", "cls.seq_relationship.weight"} <= set(state)
  cfg_hf, params_hf = checkpoints_hf.load_hf(tmp_path / "hf", scan_layers=True)
  jax.tree.map(np.testing.assert_array_equal, params_hf, params)

  checkpoints_tf.save_tf(tmp_path / "tf" / "model.ckpt", cfg, params)
  cfg_tf, params_tf = checkpoints_tf.load_tf(tmp_path / "tf" / "model.ckpt", scan_layers=True)
  assert cfg_tf == cfg_hf == cfg
  jax.tree.map(np.testing.assert_array_equal, params_tf, params)
  # Google's code knows one GELU, "gelu" (its tanh form): the tanh GELU is written so and read back as ours.
  tanh = dataclasses.replace(cfg, hidden_act="gelu_new")
  checkpoints_tf.save_tf(tmp_path / "tanh" / "model.ckpt", tanh, params)
  assert json.loads((tmp_path / "tanh" / "bert_config.json").read_text())["hidden_act"] == "gelu"
  assert checkpoints_tf.load_tf(tmp_path / "tanh" / "model.ckpt", scan_layers=True)[0] == tanh
  from bert_jax import checkpoint_loader  # pylint: disable=g-import-not-at-top
  assert checkpoint_loader.family_problem(tmp_path / "tanh" / "model.ckpt", tanh) is None   # init_from's check too
  assert checkpoint_loader.family_problem(tmp_path / "tanh" / "model.ckpt", cfg).endswith("differ in hidden_act")

  # Errors name TF variables: a 2-layer checkpoint read with a 1-layer config.
  (tmp_path / "tf" / "bert_config.json").write_text(json.dumps({**cfg.to_hf_dict(), "num_hidden_layers": 1}))
  with pytest.raises(ValueError, match="unexpected tensor bert/encoder/layer_1/intermediate/dense/kernel"):
    checkpoints_tf.load_tf(tmp_path / "tf")


def test_name_translation_round_trips():
  cfg, params = tiny_pretraining_params()
  for hf_name in checkpoints_hf.to_state_dict(cfg, params):
    hf_name = hf_name.removeprefix("bert.")
    tf_name, transpose = checkpoints_tf.hf_to_tf_name(hf_name)
    assert checkpoints_tf.tf_to_hf_name(tf_name) == (hf_name, transpose)
  assert checkpoints_tf.hf_to_tf_name("cls.seq_relationship.weight") == ("cls/seq_relationship/output_weights",
                                                                         False)


def test_bad_checkpoints_are_errors_naming_the_tensor(tmp_path):
  cfg, params = tiny_pretraining_params()
  state = checkpoints_hf.to_state_dict(cfg, params)

  def error(bad_state):
    with pytest.raises(ValueError) as info:
      checkpoints_hf.from_state_dict(cfg, bad_state)
    return str(info.value)

  missing = {k: v for k, v in state.items() if k != "bert.encoder.layer.1.intermediate.dense.bias"}
  assert "missing tensor encoder.layer.1.intermediate.dense.bias" in error(missing)
  assert "unexpected tensor classifier.weight" in error({**state, "classifier.weight": np.zeros((2, 128))})
  bad = {**state, "bert.pooler.dense.weight": np.zeros((128, 64), np.float32)}
  assert "misshapen tensor pooler.dense.weight" in error(bad)
  bad = {**state, "bert.encoder.layer.0.attention.self.key.weight": np.zeros((100, 128), np.float32)}
  assert "misshapen tensor encoder.layer.0.attention.self.key.weight" in error(bad)
  untied = {**state, "cls.predictions.decoder.weight": np.zeros((50, 128), np.float32)}
  assert "not tied" in error(untied)
  # Documented buffers and tied copies are accepted; old gamma/beta LayerNorm names too.
  ok = {**state, "bert.embeddings.position_ids": np.arange(16)[None],
        "cls.predictions.decoder.weight": state["bert.embeddings.word_embeddings.weight"]}
  ok["bert.embeddings.LayerNorm.gamma"] = ok.pop("bert.embeddings.LayerNorm.weight")
  jax.tree.map(np.testing.assert_array_equal, checkpoints_hf.from_state_dict(cfg, ok), params)
  # Without heads, an encoder-only (BertModel) checkpoint without prefix.
  bare = {k.removeprefix("bert."): v for k, v in state.items() if not k.startswith("cls.")}
  save_file(bare, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
  _, loaded = checkpoints_hf.load_hf(tmp_path)
  assert set(loaded) == {"bert"}


def test_bfloat16_and_float16_safetensors(tmp_path):
  safetensors_flax = pytest.importorskip("safetensors.flax")
  cfg, params = tiny_pretraining_params()
  state = checkpoints_hf.to_state_dict(cfg, params)
  for dtype in (jnp.bfloat16, jnp.float16):
    stored = {k: jnp.asarray(v, dtype) for k, v in state.items()}
    safetensors_flax.save_file(stored, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    _, loaded = checkpoints_hf.load_hf(tmp_path)
    rounded = jax.tree.map(lambda x: np.asarray(x, dtype).astype(np.float32), params)
    jax.tree.map(np.testing.assert_array_equal, loaded, rounded)
    assert loaded["bert"]["pooler"]["kernel"].dtype == np.float32


def test_sharded_safetensors_directory(tmp_path):
  cfg, params = tiny_pretraining_params()
  state = checkpoints_hf.to_state_dict(cfg, params)
  names = sorted(state)
  shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
  for shard, shard_names in shards.items():
    save_file({n: state[n] for n in shard_names}, str(tmp_path / shard))
  weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
  _, loaded = checkpoints_hf.load_hf(tmp_path)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)


def test_bfloat16_compute_close_to_reference(minilm):
  # bf16 activations (8-bit mantissa) with float32 params, softmax and LayerNorm statistics: measured
  # max 0.031, mean 0.0028 on outputs of mean magnitude 0.29.
  path, ref = minilm
  cfg, params = checkpoints_hf.load_hf(path, dtype="bfloat16")
  mask = ref["batch_attention_mask"].astype(np.int32)
  out = encoder_fn(cfg)(params["bert"], ref["batch_input_ids"].astype(np.int32), mask,
                        ref["batch_token_type_ids"].astype(np.int32))
  assert out["sequence_output"].dtype == np.dtype("bfloat16")
  err = np.abs(np.asarray(out["sequence_output"], np.float32) - ref["batch_last_hidden_state"])[mask == 1]
  assert err.max() < 0.08 and err.mean() < 0.008, (err.max(), err.mean())
