"""DistilBERT (Sanh et al. 2019) as the encoder without token types or pooler: the Hugging Face checkpoint of
../shared/data/families/distilbert read as our encoder and MLM head (transformers' outputs on fixed inputs),
written back, its config, its size, and finetuning from a checkpoint without a pooler."""

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.finetune import trial_state
from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from bert_jax.models import heads
from conftest import shared_path
from test_families import _examples
from test_families import assert_same_tensors_and_reimport

# DistilBertModel's default size (transformers' DistilBertConfig defaults; distilbert-base-uncased).
DISTILBERT_BASE = dict(vocab_size=30522, hidden_size=768, num_layers=6, num_heads=12, intermediate_size=3072,
                       max_position_embeddings=512, type_vocab_size=0)


@functools.cache
def _load(path=None):
  path = path or shared_path("families", "distilbert")
  return (path, *checkpoints_hf.load_hf(path))


def _errors(cfg, params, path):
  """Max abs errors against transformers at real positions: {"hidden_states", "logits"}."""
  inputs, ref, real = _examples(path, pad_id=0)   # no token types: segment_ids zeros, read by nothing
  ref_hidden, ref_logits = ref["hidden_states"], ref["logits"]

  @jax.jit
  def fn(params, inputs):
    enc = model.BertEncoder(cfg).apply({"params": params["bert"]}, inputs["input_ids"], inputs["input_mask"],
                                       output_hidden_states=True, pool=False)
    logits = heads.BertForPreTraining(cfg, use_nsp=False, mlm_all_positions=True).apply(
        {"params": params}, inputs)["mlm_logits"]
    return jnp.moveaxis(enc["hidden_states"], 0, 1), logits

  hidden, logits = fn(params, inputs)
  err_hidden = np.abs(np.asarray(hidden) - ref_hidden).transpose(0, 2, 1, 3)[real].max()
  return {"hidden_states": float(err_hidden), "logits": float(np.abs(np.asarray(logits) - ref_logits)[real].max())}


def test_import_matches_transformers_outputs():
  path, cfg, params = _load()
  errors = _errors(cfg, params, path)
  print("distilbert max abs err vs transformers:", errors)   # measured 7.2e-7 (hidden states), 3.0e-7 (logits)
  assert max(errors.values()) <= 1e-4, errors


def test_config_reads_as_the_encoder_without_token_types():
  _, cfg, params = _load()
  assert (cfg.model_type, cfg.type_vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads,
          cfg.intermediate_size, cfg.embedding_size, cfg.hidden_act) == ("distilbert", 0, 64, 2, 4, 128, None, "gelu")
  assert set(params) == {"bert", "mlm"}
  assert "token_type_embeddings" not in params["bert"]["embeddings"]
  assert not checkpoints_hf.saved_pooler(shared_path("families", "distilbert"))


def test_export_writes_the_same_directory_and_reimports_identically(tmp_path):
  path, cfg, params = _load()
  checkpoints_hf.save_hf(tmp_path, cfg, params)
  written, original = (json.loads((p / "config.json").read_text()) for p in (tmp_path, path))
  for key in ("model_type", "architectures", "dim", "n_layers", "n_heads", "hidden_dim", "activation", "vocab_size",
              "max_position_embeddings", "dropout", "attention_dropout", "initializer_range", "pad_token_id",
              "sinusoidal_pos_embds"):
    assert written[key] == original[key], key
  # The very tensors transformers saved, names and values: no pooler (the one made up on import is not
  # written), no token types, no tied decoder weight.
  assert_same_tensors_and_reimport(tmp_path, path, cfg, params)
  errors = _errors(*checkpoints_hf.load_hf(tmp_path), path)
  assert max(errors.values()) <= 1e-4, errors


def test_encoder_exports_as_distilbert_model_without_a_pooler(tmp_path):
  path, cfg, params = _load()
  checkpoints_hf.save_hf(tmp_path, cfg, {"bert": params["bert"]})
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["DistilBertModel"]
  ours = checkpoints_hf.read_safetensors(tmp_path)
  encoder = {n.removeprefix("distilbert."): v for n, v in checkpoints_hf.read_safetensors(path).items()
             if n.startswith("distilbert.")}
  assert set(ours) == set(encoder) and not any("pooler" in n for n in ours)
  _, back = checkpoints_hf.load_hf(tmp_path)
  jax.tree.map(np.testing.assert_array_equal, back["bert"], params["bert"])


def tiny(**overrides):
  fields = dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                max_position_embeddings=16, type_vocab_size=0)
  return model.BertConfig(**{**fields, **overrides})


def test_hf_dict_round_trip_and_what_distilbert_cannot_hold():
  cfg = tiny(hidden_act="gelu_new", hidden_dropout=0.2)
  d = cfg.to_hf_dict()
  assert (d["model_type"], d["architectures"], d["dim"], d["hidden_dim"], d["activation"], d["dropout"]) == (
      "distilbert", ["DistilBertForMaskedLM"], 16, 32, "gelu_new", 0.2)
  assert model.BertConfig.from_hf_dict(d) == cfg
  with pytest.raises(ValueError, match="sinusoidal_pos_embds"):
    model.BertConfig.from_hf_dict({**d, "sinusoidal_pos_embds": True})
  with pytest.raises(ValueError, match="DistilBERT activation 'relu'"):
    model.BertConfig.from_hf_dict({**d, "activation": "relu"})
  with pytest.raises(ValueError, match="no causal mask"):
    tiny(causal=True).to_hf_dict()
  # transformers' defaults where a key is absent: DistilBertModel's size.
  assert model.BertConfig.from_hf_dict({"model_type": "distilbert"}) == model.BertConfig(**DISTILBERT_BASE)


def test_electra_config_reads_directly():
  disc = json.loads(shared_path("families", "electra", "discriminator", "config.json").read_text())
  cfg = model.BertConfig.from_hf_dict(disc)
  assert (cfg.embedding_size, cfg.hidden_size, cfg.type_vocab_size) == (32, 64, 2)
  assert model.BertConfig.from_hf_dict({**disc, "hidden_size": 32, "num_attention_heads": 2}).embedding_size is None


def test_param_count_matches_transformers_distilbert_model():
  # DistilBertModel: word and position embeddings, LayerNorm, 6 layers; no token types, no pooler.
  cfg = model.BertConfig(**DISTILBERT_BASE)
  init = lambda key: model.BertEncoder(cfg).init(key, jnp.ones((1, 8), jnp.int32), pool=False)
  shapes = nn.unbox(jax.eval_shape(init, jax.random.key(0)))
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == 66_362_880


def test_finetuning_init_gives_an_encoder_without_a_pooler_a_fresh_one():
  cfg = tiny(num_layers=1)
  model_ = heads.BertForSequenceClassification(cfg, 2)
  ids = jnp.ones((1, 8), jnp.int32)
  expected = nn.unbox(jax.eval_shape(model_.init, jax.random.key(0), ids, ids, ids))["params"]["bert"]
  rng = np.random.default_rng(0)
  encoder = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), expected)
  del encoder["pooler"]   # as a bert_jax DistilBERT or ELECTRA run saves its encoder
  mesh = jax.make_mesh((8, 1, 1), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  rules = [("activation_batch", ("data", "fsdp"))]
  configs = [ml_collections.ConfigDict({"seed": 0, "learning_rate": 1e-3})]
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state, _ = trial_state.init_state(model_, optax.sgd(1e-3), configs, encoder, mesh, rules, seq_len=8)
  params = jax.tree.map(lambda x: np.asarray(x)[0], state["params"])   # the one trial
  jax.tree.map(np.testing.assert_array_equal, {k: v for k, v in params["bert"].items() if k != "pooler"}, encoder)
  assert params["bert"]["pooler"]["kernel"].shape == (16, 16) and np.any(params["bert"]["pooler"]["kernel"] != 0)
  without_layer = {**encoder, "encoder": {}}
  with pytest.raises(ValueError, match="checkpoint encoder does not match the model"):
    trial_state.check_encoder_shapes(expected, without_layer)
