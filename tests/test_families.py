"""ALBERT and RoBERTa as switches of the encoder: the reference checkpoints of ../shared/data/families
(transformers' outputs on fixed inputs), their export, sizes of the released models, and the switches'
properties (causal mask, shared layers, RoBERTa positions) on tiny random models."""

import dataclasses
import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from bert_jax.models import heads
from conftest import shared_path
import test_model

# family -> {our output: its name in reference.npz}
HEAD_OUTPUTS = {"albert": {"mlm_logits": "prediction_logits", "nsp_logits": "sop_logits"},
                "roberta": {"mlm_logits": "logits"}}


@functools.cache
def _load(family):
  path = shared_path("families", family)
  cfg, params = checkpoints_hf.load_hf(path)
  return path, cfg, params


def _examples(path, pad_id):
  """Every example of reference.npz right-padded into one batch: (inputs, {output: [N, ...]}, real [N, L])."""
  ref = np.load(path / "reference.npz")
  names = sorted({k.split("/")[0] for k in ref.files if "/" in k})
  length = max(ref[f"{n}/input_ids"].shape[1] for n in names)

  def stacked(key, seq_axis, value=0):
    arrays = [ref[f"{n}/{key}"] for n in names]
    if seq_axis is not None:  # [B, ...] per example, the sequence along seq_axis
      widths = lambda x: [(0, length - x.shape[a] if a == seq_axis else 0) for a in range(x.ndim)]
      arrays = [np.pad(x, widths(x), constant_values=value) for x in arrays]
    return np.concatenate(arrays)

  inputs = {"input_ids": stacked("input_ids", 1, pad_id), "input_mask": stacked("attention_mask", 1)}
  has_types = f"{names[0]}/token_type_ids" in ref.files
  inputs["segment_ids"] = stacked("token_type_ids", 1) if has_types else np.zeros_like(inputs["input_ids"])
  inputs = {k: v.astype(np.int32) for k, v in inputs.items()}
  outputs = {"hidden_states": stacked("hidden_states", 2)}  # [N, layers + 1, L, H]
  for key in {k.split("/")[1] for k in ref.files if "logits" in k}:
    outputs[key] = stacked(key, 1 if ref[f"{names[0]}/{key}"].ndim == 3 else None)
  return inputs, outputs, inputs["input_mask"] == 1


def _run(cfg, params, inputs):
  """(hidden states [B, layers + 1, L, H], head outputs) of our model, jitted once."""
  def fn(params, inputs):
    m = heads.BertForPreTraining(cfg, use_nsp="nsp" in params, mlm_all_positions=True)
    out = m.apply({"params": params}, inputs)
    enc = model.BertEncoder(cfg).apply({"params": params["bert"]}, inputs["input_ids"], inputs["input_mask"],
                                       inputs["segment_ids"], output_hidden_states=True)
    return jnp.moveaxis(enc["hidden_states"], 0, 1), out
  return jax.jit(fn)(params, inputs)


@pytest.mark.parametrize("family", ["albert", "roberta"])
def test_import_matches_transformers_outputs(family):
  path, cfg, params = _load(family)
  assert cfg.model_type == family
  inputs, ref, real = _examples(path, cfg.position_pad_id or 0)
  hidden, out = _run(cfg, params, inputs)
  errors = {"hidden_states": np.abs(np.asarray(hidden) - ref["hidden_states"]).transpose(0, 2, 1, 3)[real].max()}
  for ours, theirs in HEAD_OUTPUTS[family].items():
    err = np.abs(np.asarray(out[ours]) - ref[theirs])
    errors[theirs] = (err[real] if err.ndim == 3 else err).max()
  print(family, "max abs err vs transformers:", errors)  # measured <= 1.2e-6 (albert), 9.6e-7 (roberta)
  assert set(errors) == {"hidden_states", *HEAD_OUTPUTS[family].values()}
  assert max(errors.values()) <= 1e-4, errors


def test_family_configs_read_as_their_switches():
  _, albert, _ = _load("albert")
  assert (albert.embedding_size, albert.share_layers, albert.hidden_act, albert.position_pad_id) == (32, True,
                                                                                                    "gelu_new", None)
  _, roberta, _ = _load("roberta")
  assert (roberta.embedding_size, roberta.share_layers, roberta.position_pad_id, roberta.type_vocab_size) == (
      None, False, 1, 1)


@pytest.mark.parametrize("family", ["albert", "roberta"])
def test_export_writes_the_same_directory_and_reimports_identically(family, tmp_path):
  path, cfg, params = _load(family)
  checkpoints_hf.save_hf(tmp_path, cfg, params)
  config = json.loads((tmp_path / "config.json").read_text())
  original = json.loads((path / "config.json").read_text())
  for key in ("model_type", "architectures", "embedding_size", "num_hidden_groups", "inner_group_num",
              "pad_token_id", "type_vocab_size", "max_position_embeddings", "hidden_act"):
    assert config.get(key) == original.get(key), key
  # The very tensors transformers saved: names, shapes and values (RobertaForMaskedLM: no pooler).
  assert_same_tensors_and_reimport(tmp_path, path, cfg, params)


def assert_same_tensors_and_reimport(written, original, cfg, params):
  """The directory `written` holds exactly the tensors of `original` (names, shapes, values) and reads back
  as (cfg, params)."""
  ours, theirs = checkpoints_hf.read_safetensors(written), checkpoints_hf.read_safetensors(original)
  assert set(ours) == set(theirs)
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  cfg2, params2 = checkpoints_hf.load_hf(written)
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_albert_scanned_equals_unscanned_with_one_layer_set():
  path, cfg, params = _load("albert")
  cfg_scan, params_scan = checkpoints_hf.load_hf(path, scan_layers=True)
  assert set(params["bert"]["encoder"]) == set(params_scan["bert"]["encoder"]) == {"shared_layer"}
  jax.tree.map(np.testing.assert_array_equal, params_scan, params)  # no leading layer axis
  shapes = jax.eval_shape(heads.BertForPreTraining(cfg_scan).init, jax.random.key(0),
                          {k: jnp.zeros((1, 4), jnp.int32) for k in ("input_ids", "input_mask", "segment_ids",
                                                                    "masked_lm_positions")})
  assert jax.tree.structure(nn.unbox(shapes["params"])) == jax.tree.structure(params)
  inputs, _, real = _examples(path, 0)
  inputs = {k: v[:4] for k, v in inputs.items()}
  a, b = _run(cfg, params, inputs), _run(cfg_scan, params_scan, inputs)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), a, b)


def tiny(**overrides):
  fields = dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                max_position_embeddings=16)
  return model.BertConfig(**{**fields, **overrides})


@pytest.mark.parametrize("scan", [False, True])
def test_shared_layers_hold_one_layer_set(scan):
  cfg = tiny(num_layers=3, share_layers=True, scan_layers=scan)
  params = nn.unbox(jax.eval_shape(model.BertEncoder(cfg).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32)))
  unshared = nn.unbox(jax.eval_shape(model.BertEncoder(tiny()).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32)))
  assert set(params["params"]["encoder"]) == {"shared_layer"}
  same_shapes = lambda x, y: x.shape == y.shape
  assert jax.tree.all(jax.tree.map(same_shapes, params["params"]["encoder"]["shared_layer"],
                                   unshared["params"]["encoder"]["layer_0"]))


@pytest.mark.slow
def test_shared_layers_apply_one_set_num_layers_times():
  cfg = tiny(num_layers=3, share_layers=True, hidden_dropout=0.0, attention_dropout=0.0)
  ids = np.array([[3, 7, 9, 11, 5]], np.int32)
  params = model.BertEncoder(cfg).init(jax.random.key(0), ids)["params"]
  out = model.BertEncoder(cfg).apply({"params": params}, ids, output_hidden_states=True)
  layer = model.BertLayer(cfg)
  x, mask = out["hidden_states"][0], model.attention_mask(np.ones_like(ids))
  for i in range(3):
    x, _ = layer.apply({"params": params["encoder"]["shared_layer"]}, x, mask, True, False)
    np.testing.assert_allclose(out["hidden_states"][i + 1], x, atol=1e-6)


@pytest.mark.parametrize("sublayer,shared_names,own_names", [
    ("attention", {"shared_attention"}, {"attention_layer_norm", "intermediate", "output", "output_layer_norm"}),
    ("ffn", {"shared_intermediate", "shared_output"}, {"attention", "attention_layer_norm", "output_layer_norm"})])
def test_one_shared_sublayer_is_one_set_applied_by_every_layer(sublayer, shared_names, own_names):
  """ALBERT's Table 4 variants: the shared sublayer's params exist once, the rest per layer, and the encoder
  equals one with that sublayer's params copied into every layer."""
  cfg = tiny(num_layers=3, shared_sublayer=sublayer, hidden_dropout=0.0, attention_dropout=0.0)
  ids = np.array([[3, 7, 9, 11, 5]], np.int32)
  params = model.BertEncoder(cfg).init(jax.random.key(0), ids)["params"]
  layers = params["encoder"]
  assert set(layers) == shared_names | {"layer_0", "layer_1", "layer_2"}
  assert all(set(layers[f"layer_{i}"]) == own_names for i in range(3))
  plain = tiny(num_layers=3, hidden_dropout=0.0, attention_dropout=0.0)
  if sublayer == "attention":
    copy = lambda own: {**own, "attention": layers["shared_attention"]}
  else:
    copy = lambda own: {**own, "intermediate": layers["shared_intermediate"], "output": layers["shared_output"]}
  unshared = {**params, "encoder": {f"layer_{i}": copy(layers[f"layer_{i}"]) for i in range(3)}}
  np.testing.assert_allclose(model.BertEncoder(cfg).apply({"params": params}, ids)["sequence_output"],
                             model.BertEncoder(plain).apply({"params": unshared}, ids)["sequence_output"], atol=1e-6)
  with pytest.raises(ValueError, match="shared_sublayer"):
    tiny(shared_sublayer="ffn", share_layers=True)
  with pytest.raises(ValueError, match="shared_sublayer"):
    tiny(shared_sublayer="ffn", scan_layers=True)
  with pytest.raises(ValueError, match="no Hugging Face family"):
    checkpoints_hf.tensor_table(cfg)
  assert model.BertConfig.from_hf_dict(cfg.to_hf_dict()) == cfg   # a run record reads back as written


def _position_jacobian(cfg, params, ids, mask, **kwargs):
  """d output[i] / d input embedding[j] for every i, j: [L, H, L, H] (the position embedding of token j
  adds to its input embedding only)."""
  def f(table):
    p = {**params, "embeddings": {**params["embeddings"], "position_embeddings": {"embedding": table}}}
    return model.BertEncoder(cfg).apply({"params": p}, ids, mask, **kwargs)["sequence_output"][0]
  params = nn.unbox(params)
  table = params["embeddings"]["position_embeddings"]["embedding"]
  return np.asarray(jax.jit(jax.jacrev(f))(table))[:, :, :ids.shape[1]]


@pytest.mark.parametrize("dropout_path", [False, True])
@pytest.mark.slow
def test_causal_output_has_exactly_zero_gradient_from_later_tokens(dropout_path):
  cfg = tiny(causal=True, hidden_dropout=0.0, attention_dropout=0.3 if dropout_path else 0.0)
  ids = np.array([[3, 7, 9, 11, 5, 6, 0, 0]], np.int32)
  mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0]], np.int32)
  params = model.BertEncoder(cfg).init(jax.random.key(0), ids)["params"]
  kwargs = {"deterministic": False, "rngs": {"dropout": jax.random.key(1)}} if dropout_path else {}
  jac = np.abs(_position_jacobian(cfg, params, ids, mask, **kwargs)).max(axis=(1, 3))  # [i, j]
  later = np.triu(np.ones((8, 8), bool), k=1)
  assert np.all(jac[later] == 0.0)  # exactly zero, not merely small
  assert np.all(jac[:6, 6:] == 0.0)  # padding stays masked
  if not dropout_path:
    assert np.all(jac[:6, :6][~later[:6, :6]] > 0)
    # A prefix gives the same outputs as the whole sequence at its positions.
    whole = model.BertEncoder(cfg).apply({"params": params}, ids, mask)["sequence_output"]
    prefix = model.BertEncoder(cfg).apply({"params": params}, ids[:, :4])["sequence_output"]
    np.testing.assert_allclose(whole[:, :4], prefix, atol=1e-5)


def test_bidirectional_by_default():
  cfg = tiny(hidden_dropout=0.0, attention_dropout=0.0)
  ids = np.array([[3, 7, 9, 11]], np.int32)
  params = model.BertEncoder(cfg).init(jax.random.key(0), ids)["params"]
  jac = np.abs(_position_jacobian(cfg, params, ids, np.ones_like(ids))).max(axis=(1, 3))
  assert np.all(jac > 0)


def test_roberta_position_ids_skip_padding():
  cfg = tiny(position_pad_id=1, type_vocab_size=1)
  ids = np.array([[0, 5, 6, 2, 1, 1], [0, 7, 2, 1, 1, 1]], np.int32)
  np.testing.assert_array_equal(model.default_position_ids(cfg, ids), [[2, 3, 4, 5, 1, 1], [2, 3, 4, 1, 1, 1]])
  np.testing.assert_array_equal(model.default_position_ids(tiny(), ids[:1]), [[0, 1, 2, 3, 4, 5]])
  with pytest.raises(ValueError, match="sequence length 15 exceeds max_position_embeddings 16 less the 2"):
    model.default_position_ids(cfg, np.zeros((1, 15), np.int32))
  model.default_position_ids(cfg, np.zeros((1, 14), np.int32))  # the longest: ids up to 15


@pytest.mark.parametrize("cfg", [
    tiny(embedding_size=8, share_layers=True, hidden_act="gelu_new"),
    tiny(embedding_size=8),                                # ALBERT with a group per layer
    tiny(position_pad_id=1, type_vocab_size=1),
    tiny(causal=True),
    tiny(position_pad_id=1, causal=True),
    tiny(type_vocab_size=0),
], ids=["albert", "albert_unshared", "roberta", "bert_causal", "roberta_causal", "distilbert"])
def test_hf_dict_round_trip(cfg):
  d = cfg.to_hf_dict()
  assert d["model_type"] == cfg.model_type
  assert model.BertConfig.from_hf_dict(d) == cfg


def test_hf_dicts_the_families_cannot_hold_are_errors():
  with pytest.raises(ValueError, match="both ALBERT"):
    tiny(embedding_size=8, position_pad_id=1).to_hf_dict()
  with pytest.raises(ValueError, match="model_type 'deberta'"):   # ELECTRA's, DistilBERT's, ModernBERT's read
    model.BertConfig.from_hf_dict({**tiny().to_hf_dict(), "model_type": "deberta"})
  with pytest.raises(ValueError, match="num_hidden_groups 2"):
    model.BertConfig.from_hf_dict({**tiny(embedding_size=8).to_hf_dict(), "num_hidden_layers": 4,
                                   "num_hidden_groups": 2})
  # BERT's dict has the keys it had before the switches.
  assert set(tiny().to_hf_dict()) == set(model._HF_KEYS.values()) | {"model_type", "architectures", "pad_token_id",
                                                                      "position_embedding_type"}


def test_unshared_albert_round_trips_through_hf_names(tmp_path):
  cfg = tiny(embedding_size=8)
  batch = {k: jnp.ones((1, 4), jnp.int32) for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}
  params = jax.tree.map(np.asarray, nn.unbox(heads.BertForPreTraining(cfg).init(jax.random.key(0), batch)["params"]))
  assert params["mlm"]["transform"]["kernel"].shape == (16, 8)  # H -> E
  checkpoints_hf.save_hf(tmp_path, cfg, params)
  names = set(checkpoints_hf.read_safetensors(tmp_path))
  assert {"albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.weight", "sop_classifier.classifier.weight",
          "albert.encoder.embedding_hidden_mapping_in.weight", "predictions.dense.weight"} <= names
  assert json.loads((tmp_path / "config.json").read_text())["num_hidden_groups"] == 2
  cfg2, params2 = checkpoints_hf.load_hf(tmp_path, scan_layers=True)
  assert cfg2 == dataclasses.replace(cfg, scan_layers=True)
  jax.tree.map(np.testing.assert_array_equal, params2, model.scan_params(params))


def n_params(cfg):
  shapes = jax.eval_shape(model.BertEncoder(cfg).init, jax.random.key(0), jnp.ones((1, 8), jnp.int32))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes)))


# HF AlbertModel / RobertaModel with pooler. ALBERT (Lan et al. 2020, Table 1; heads as the released
# albert-*-v2 config.json): vocabulary 30000, E 128, 512 positions, 2 types. RoBERTa: vocabulary 50265, 514
# positions (2 more: ids start after the padding id), 1 type.
ALBERT = dict(vocab_size=30000, embedding_size=128, share_layers=True, hidden_act="gelu_new")
ROBERTA = dict(vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, position_pad_id=1)


@pytest.mark.parametrize("cfg,expected", [
    (model.BertConfig(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072, **ALBERT), 11_683_584),
    (model.BertConfig(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096, **ALBERT), 17_683_968),
    (model.BertConfig(num_layers=24, hidden_size=2048, num_heads=16, intermediate_size=8192, **ALBERT), 58_724_864),
    (model.BertConfig(num_layers=12, hidden_size=4096, num_heads=64, intermediate_size=16384, scan_layers=True,
                      **ALBERT), 222_595_584),
    (model.BertConfig.from_preset("base", **ROBERTA), 124_645_632),
    (model.BertConfig.from_preset("large", **ROBERTA), 355_359_744),
], ids=["albert_base", "albert_large", "albert_xlarge", "albert_xxlarge", "roberta_base", "roberta_large"])
def test_param_counts_match_transformers(cfg, expected):
  assert n_params(cfg) == expected


def test_shared_scanned_layer_is_sharded_by_its_logical_names():
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  rules = test_model.RULES
  cfg = tiny(embedding_size=8, share_layers=True, scan_layers=True)
  ids = jnp.ones((8, 8), jnp.int32)
  init_fn = lambda key: model.BertEncoder(cfg).init(key, ids)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(init_fn, jax.random.key(0))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, rules)
    params = nn.unbox(jax.jit(init_fn, out_shardings=shardings)(jax.random.key(0))["params"])
  P = jax.sharding.PartitionSpec
  assert params["encoder"]["shared_layer"]["intermediate"]["kernel"].sharding.spec == P("fsdp", "tensor")
  assert params["embeddings"]["projection"]["kernel"].sharding.spec == P(None, "fsdp")
  assert params["embeddings"]["word_embeddings"]["embedding"].shape == (40, 8)
