"""ModernBERT (Warner et al. 2024) as switches of the encoder: the reference checkpoint of
../shared/data/families/modernbert (transformers' outputs on fixed inputs), its export, the published sizes, and
the switches' properties (sliding window, RoPE, each switch on its own) on tiny random models."""

import dataclasses
import functools
import json
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import checkpoint_loader
from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from bert_jax.models import heads
from bert_jax.models import modernbert_keys
from bert_jax.models import rotary
from conftest import shared_path
import test_embed
import test_families

TOLERANCE = 1e-4


@functools.cache
def _load(scan_layers=False):
  path = shared_path("families", "modernbert")
  cfg, params = checkpoints_hf.load_hf(path, scan_layers=scan_layers)
  return path, cfg, params


def _errors(cfg, params, path):
  """Max |ours - transformers'| over the real positions of every reference example (the padded batch
  included): per hidden-state entry (embeddings, layers 1..N) and for the MLM logits."""
  inputs, ref, real = test_families._examples(path, 0)
  hidden, out = test_families._run(cfg, params, inputs)
  err = np.abs(np.asarray(hidden) - ref["hidden_states"]).transpose(0, 2, 1, 3)[real]   # [tokens, N + 1, H]
  errors = {f"hidden_states[{i}]": err[:, i].max() for i in range(err.shape[1])}
  errors["logits"] = np.abs(np.asarray(out["mlm_logits"]) - ref["logits"])[real].max()
  return errors


def test_import_matches_transformers_outputs():
  # The longest example (77 tokens) is far past the 16-token window: layers 1 and 2 attend locally.
  path, cfg, params = _load()
  assert (cfg.model_type, cfg.local_attention, cfg.global_attn_every_n_layers) == ("modernbert", 16, 3)
  assert [local for local, _ in model.layer_kinds(cfg)] == [False, True, True, False]
  errors = _errors(cfg, params, path)
  print("modernbert max abs err vs transformers:", errors)  # measured <= 4.8e-7 (hidden), 2.1e-7 (logits)
  assert len(errors) == cfg.num_layers + 2 and max(errors.values()) <= TOLERANCE, errors
  # Every layer global instead misses the reference (measured 9.4e-3): the window is exercised.
  every_layer_global = dataclasses.replace(cfg, global_attn_every_n_layers=1, local_attention=None,
                                           local_rope_theta=None)
  assert max(_errors(every_layer_global, params, path).values()) > 1e-3


def test_scanned_layers_match_the_reference():
  # Under nn.scan each layer's kind (global or sliding-window; layer 0 without its attention norm) is a
  # scanned input.
  path, cfg, params = _load(scan_layers=True)
  assert jax.tree.leaves(params["bert"]["encoder"]["layers"])[0].shape[0] == cfg.num_layers
  errors = _errors(cfg, params, path)
  assert max(errors.values()) <= TOLERANCE, errors


def test_export_writes_the_same_directory_and_reimports_identically(tmp_path):
  path, cfg, params = _load()
  checkpoints_hf.save_hf(tmp_path, cfg, params)
  config = json.loads((tmp_path / "config.json").read_text())
  original = json.loads((path / "config.json").read_text())
  for key in ("model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
              "global_attn_every_n_layers", "local_attention", "global_rope_theta", "local_rope_theta",
              "norm_eps", "norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "hidden_activation",
              "max_position_embeddings", "pad_token_id", "vocab_size"):
    assert config[key] == original[key], key
  # The very tensors transformers saved (no decoder.weight: tied; no pooler), and the same params back.
  test_families.assert_same_tensors_and_reimport(tmp_path, path, cfg, params)
  cfg2, params2 = checkpoints_hf.load_hf(tmp_path)
  assert max(_errors(cfg2, params2, path).values()) <= TOLERANCE


def test_export_takes_the_special_token_ids_of_the_tokenizer_written_beside_it(tmp_path):
  """Not ModernBERT's 50k vocabulary's ids (or 0 to 2), which a smaller vocabulary of ours holds elsewhere."""
  _, cfg, params = _load()
  tokenizer = types.SimpleNamespace(pad_id=0, cls_id=2, sep_id=3)   # ours: [PAD] [UNK] [CLS] [SEP] [MASK] ...
  checkpoints_hf.save_hf(tmp_path, cfg, params, tokenizer=tokenizer)
  config = json.loads((tmp_path / "config.json").read_text())
  assert {k: config[k] for k in ("pad_token_id", "cls_token_id", "bos_token_id", "sep_token_id", "eos_token_id")} == {
      "pad_token_id": 0, "cls_token_id": 2, "bos_token_id": 2, "sep_token_id": 3, "eos_token_id": 3}


def test_encoder_without_head_exports_as_modernbert_model(tmp_path):
  _, cfg, params = _load()
  checkpoints_hf.save_hf(tmp_path, cfg, {"bert": params["bert"]})
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["ModernBertModel"]
  names = checkpoints_hf.read_safetensors(tmp_path)
  assert "embeddings.tok_embeddings.weight" in names and not any("pooler" in n or "head" in n for n in names)
  _, back = checkpoints_hf.load_hf(tmp_path)
  jax.tree.map(np.testing.assert_array_equal, back["bert"], params["bert"])


def test_wrong_tensors_are_named():
  path, cfg, _ = _load()
  state = dict(checkpoints_hf.read_safetensors(path))
  del state["model.layers.1.attn_norm.weight"]
  state["model.layers.0.attn_norm.weight"] = np.ones(cfg.hidden_size, np.float32)
  state["model.layers.2.attn.Wqkv.weight"] = np.zeros((3, 4), np.float32)
  with pytest.raises(ValueError) as e:
    checkpoints_hf.from_state_dict(cfg, state)
  message = str(e.value)
  for name in ("missing tensor layers.1.attn_norm.weight", "unexpected tensor layers.0.attn_norm.weight",
               "misshapen tensor layers.2.attn.Wqkv.weight"):
    assert name in message, message


# The released ModernBERT-base and -large (Warner et al. 2024): layers, hidden, heads, intermediate.
SIZES = {"base": (22, 768, 12, 1152), "large": (28, 1024, 16, 2624)}


@pytest.mark.parametrize("size,masked_lm,expected", [
    ("base", True, 149_655_232), ("large", True, 395_881_664), ("base", False, 149_014_272),
    ("large", False, 394_781_696),
], ids=["base_mlm", "large_mlm", "base_model", "large_model"])
def test_parameter_counts_of_the_published_sizes(size, masked_lm, expected):
  # transformers' ModernBertForMaskedLM / ModernBertModel (vocabulary 50368): no pooler.
  layers, hidden, heads_, intermediate = SIZES[size]
  cfg = model.BertConfig.from_hf_dict({"model_type": "modernbert", "num_hidden_layers": layers,
                                       "hidden_size": hidden, "num_attention_heads": heads_,
                                       "intermediate_size": intermediate})
  assert (cfg.global_attn_every_n_layers, cfg.local_attention, cfg.max_position_embeddings, cfg.vocab_size) == (
      3, 128, 8192, 50368)
  ids = jnp.zeros((1, 4), jnp.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": ids}
  if masked_lm:
    init = functools.partial(heads.BertForPreTraining(cfg, use_nsp=False, mlm_all_positions=True, pool=False).init,
                             jax.random.key(0), batch)
  else:
    init = functools.partial(model.BertEncoder(cfg).init, jax.random.key(0), ids, pool=False)
  shapes = jax.eval_shape(init)["params"]
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == expected


def _tiny(**overrides):
  fields = dict(vocab_size=40, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=24,
                max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
  return model.BertConfig(**{**fields, **overrides})


def _modern(**overrides):
  return _tiny(**{**modernbert_keys.SWITCHES, "rope_theta": 160000.0, "local_rope_theta": 10000.0,
                  "norm_bias": False, "dense_bias": False, "global_attn_every_n_layers": 3,
                  "local_attention": 4, "layer_norm_eps": 1e-5, **overrides})


def _init(cfg, length=12):
  ids = jnp.arange(length, dtype=jnp.int32)[None] % cfg.vocab_size
  params = model.BertEncoder(cfg).init(jax.random.key(1), ids)["params"]
  # Random norms and biases (not ones and zeros), so that a dropped or misplaced one shows.
  noisy = lambda p, k: p + 0.3 * jax.random.normal(k, p.shape)
  leaves, tree = jax.tree.flatten(nn.unbox(params))
  keys = jax.random.split(jax.random.key(2), len(leaves))
  return ids, jax.tree.unflatten(tree, [noisy(p, k) for p, k in zip(leaves, keys)])


def _layer_jacobian(cfg, params, kind, mask, example_ids=None):
  """d layer output[q] / d layer input[j], summed over features: [L (query), L (key)]."""
  length = mask.shape[1]
  positions = jnp.arange(length)[None]
  context = model.layer_context(cfg, mask, example_ids, positions)
  x = jax.random.normal(jax.random.key(3), (1, length, cfg.hidden_size))
  layer = lambda x: model.BertLayer(cfg).apply({"params": params["encoder"]["layer_1"]}, x, context, True, False,
                                               kind)[0][0]
  jac = jax.jacrev(layer)(x)  # [L, H, 1, L, H]
  return np.abs(np.asarray(jac)).sum(axis=(1, 2, 4))


@pytest.mark.slow
def test_tokens_outside_the_window_of_a_local_layer_have_zero_gradient():
  # Window 4: query q sees keys q-2..q+2 of its own example, real tokens only; a global layer sees all.
  cfg = _modern()
  _, params = _init(cfg)
  mask = jnp.ones((1, 12), jnp.int32).at[0, 10:].set(0)            # two padding tokens
  example_ids = jnp.array([[1] * 7 + [2] * 5])                      # packed: 0..6, then 7..11
  local = _layer_jacobian(cfg, params, (True, False), mask, example_ids)
  q, k = np.meshgrid(np.arange(12), np.arange(12), indexing="ij")
  visible = (np.abs(q - k) <= 2) & (example_ids[0][:, None] == example_ids[0][None, :]) & (np.asarray(mask[0])[None] == 1)
  visible |= q == k   # the residual and the feed-forward
  assert np.all(local[~visible] == 0.0)                              # exactly zero, not small
  assert np.all(local[visible & (q < 10)] > 0)
  glob = _layer_jacobian(cfg, params, (False, False), jnp.ones((1, 12), jnp.int32))
  assert np.all(glob > 0)


@pytest.mark.slow
def test_packed_examples_equal_each_alone():
  # Two examples packed in one row (example_ids, positions restarting at 0) give each one's outputs alone,
  # through global and sliding-window layers alike; the row's padding changes nothing.
  cfg = _modern(num_layers=4)
  ids, params = _init(cfg, length=14)
  lengths = (7, 5)
  example_ids = jnp.array([[1] * 7 + [2] * 5 + [0] * 2])
  positions = jnp.array([list(range(7)) + list(range(5)) + [0, 0]])
  run = lambda *args, **kw: model.BertEncoder(cfg).apply({"params": params}, *args, pool=False,
                                                         output_hidden_states=True, **kw)["hidden_states"]
  packed = run(ids, (example_ids > 0).astype(jnp.int32), example_ids=example_ids, position_ids=positions)
  start = 0
  for n in lengths:
    alone = run(ids[:, start:start + n])
    np.testing.assert_allclose(packed[:, :, start:start + n], alone, rtol=1e-5, atol=1e-4)
    start += n


@pytest.mark.slow
def test_rope_scores_depend_only_on_relative_positions():
  q_BLNK, k_BLNK = jax.random.normal(jax.random.key(0), (2, 1, 9, 2, 8))
  scores = lambda start: jnp.einsum("bqnk,bsnk->bnqs", *(rotary.apply_rotary(
      x, rotary.rotary_tables(jnp.arange(start, start + 9)[None], 8, 10000.0)) for x in (q_BLNK, k_BLNK)))
  np.testing.assert_allclose(scores(0), scores(37), atol=1e-4)
  assert np.abs(scores(0) - jnp.einsum("bqnk,bsnk->bnqs", q_BLNK, k_BLNK)).max() > 1e-2   # it does rotate
  # And through the whole encoder: shifting every position id leaves the outputs unchanged.
  cfg = _modern()
  ids, params = _init(cfg)
  run = lambda start: model.BertEncoder(cfg).apply({"params": params}, ids, position_ids=jnp.arange(12)[None] + start,
                                                   pool=False)["sequence_output"]
  np.testing.assert_allclose(run(0), run(5), atol=1e-4)


def _param_names(cfg):
  ids = jnp.zeros((1, 4), jnp.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": ids}
  shapes = jax.eval_shape(heads.BertForPreTraining(cfg, use_nsp=False, mlm_all_positions=True).init,
                          jax.random.key(0), batch)
  flat = jax.tree_util.tree_flatten_with_path(nn.unbox(shapes["params"]))[0]
  return {"/".join(k.key for k in path): tuple(x.shape) for path, x in flat}


def test_default_config_is_bert():
  cfg = model.BertConfig()
  assert cfg.model_type == "bert"
  assert (cfg.rope_theta, cfg.local_rope_theta, cfg.geglu, cfg.pre_norm, cfg.final_norm, cfg.norm_bias,
          cfg.dense_bias, cfg.global_attn_every_n_layers, cfg.local_attention) == (
              None, None, False, False, False, True, True, 1, None)
  names = _param_names(_tiny())
  assert "bert/embeddings/position_embeddings/embedding" in names and "bert/final_layer_norm/scale" not in names
  assert all(f"bert/encoder/layer_{i}/attention_layer_norm/bias" in names for i in range(3))


@pytest.mark.parametrize("switch,changes", [
    (dict(rope_theta=10000.0), {"-bert/embeddings/position_embeddings/embedding"}),
    (dict(geglu=True), {f"bert/encoder/layer_{i}/intermediate/{name}: {shape}" for i in range(3)
                        for name, shape in (("kernel", (16, 48)), ("bias", (48,)))}),
    (dict(pre_norm=True), {"-bert/encoder/layer_0/attention_layer_norm/scale",
                           "-bert/encoder/layer_0/attention_layer_norm/bias"}),
    (dict(final_norm=True), {"+bert/final_layer_norm/scale", "+bert/final_layer_norm/bias"}),
    (dict(norm_bias=False), {"-bias of every LayerNorm"}),
    (dict(dense_bias=False), {"-bias of every attention, feed-forward and MLM transform projection"}),
    (dict(global_attn_every_n_layers=3, local_attention=4), set()),
], ids=["rope", "geglu", "pre_norm", "final_norm", "norm_bias", "dense_bias", "local_attention"])
def test_each_switch_alone_changes_its_params_and_the_outputs(switch, changes):
  bert, cfg = _tiny(), _tiny(**switch)
  before, after = _param_names(bert), _param_names(cfg)
  got = {f"-{n}" for n in before.keys() - after.keys()} | {f"+{n}" for n in after.keys() - before.keys()}
  got |= {f"{n}: {after[n]}" for n in before.keys() & after.keys() if before[n] != after[n]}
  norm_biases = {f"-{n}" for n in before if n.endswith("bias") and "layer_norm" in n}
  dense_biases = {f"-{n}" for n in before if n.endswith("/bias") and "norm" not in n and "pooler" not in n}
  if "norm_bias" in switch:
    assert got == norm_biases and len(norm_biases) == 1 + 2 * 3 + 1   # embeddings, 2 per layer, mlm
  elif "dense_bias" in switch:
    # q, k, v, out, intermediate, output per layer; the MLM transform (the decoder's bias stays)
    assert got == dense_biases and len(dense_biases) == 3 * 6 + 1
  else:
    assert got == changes
  # With BERT's values for every param they share, the outputs differ (a window of 4 matters at 12 tokens).
  ids, bert_params = _init(bert)
  _, params = _init(cfg)
  shared = {path: x for path, x in jax.tree_util.tree_flatten_with_path(bert_params)[0]}
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: shared[path] if path in shared and shared[path].shape == x.shape else x, params)
  out = lambda c, p: model.BertEncoder(c).apply({"params": p}, ids)["sequence_output"]
  assert np.abs(out(cfg, params) - out(bert, bert_params)).max() > 1e-3


def test_hf_dict_round_trip_and_errors():
  cfg = _modern()
  d = cfg.to_hf_dict()
  assert d["model_type"] == "modernbert" and model.BertConfig.from_hf_dict(d) == cfg
  with pytest.raises(ValueError, match="cannot express"):
    _tiny(rope_theta=10000.0).to_hf_dict()   # a BERT with RoPE is no Hugging Face family
  with pytest.raises(ValueError, match="attention_bias, mlp_bias"):
    model.BertConfig.from_hf_dict({**d, "mlp_bias": True})
  with pytest.raises(ValueError, match="layer_types"):
    model.BertConfig.from_hf_dict({**d, "layer_types": ["full_attention"] * 3})
  newer = {**d, "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
           "rope_parameters": {"full_attention": {"rope_theta": 5000.0, "rope_type": "default"},
                               "sliding_attention": {"rope_theta": 500.0, "rope_type": "default"}}}
  # transformers 5's keys
  assert model.BertConfig.from_hf_dict(newer) == dataclasses.replace(cfg, rope_theta=5000.0, local_rope_theta=500.0)
  with pytest.raises(ValueError, match="go together"):
    _tiny(global_attn_every_n_layers=3)
  # Every layer global: no window, whatever local_attention says.
  assert model.BertConfig.from_hf_dict({**d, "global_attn_every_n_layers": 1}).local_attention is None


@pytest.mark.slow
def test_scan_equals_unscanned_with_every_switch():
  cfg = _modern(num_layers=4, remat_policy="full")
  ids, params = _init(cfg)
  mask = jnp.ones_like(ids).at[0, 9:].set(0)
  run = lambda c, p: model.BertEncoder(c).apply({"params": p}, ids, mask, output_hidden_states=True, pool=False)
  scanned = dataclasses.replace(cfg, scan_layers=True)
  a, b = run(cfg, params), run(scanned, model.scan_params(params))
  # float32 rounding of the differently fused programs: hidden states reach ~6 without the final norm.
  np.testing.assert_allclose(a["hidden_states"], b["hidden_states"], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(a["sequence_output"], b["sequence_output"], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_embed_command_on_a_modernbert_directory(tmp_path):
  # ids with their attention mask, as for BERT (no token types); every layer's hidden states are
  # transformers' at the real positions; no pooler output (ModernBERT has none).
  ckpt = shared_path("families", "modernbert")
  ref = np.load(ckpt / "reference.npz")
  rows = [(name, row) for name in sorted({k.split("/")[0] for k in ref.files})
          for row in range(len(ref[f"{name}/input_ids"]))]
  lines = [json.dumps({k: ref[f"{name}/{k}"][row].tolist() for k in ("input_ids", "attention_mask")})
           for name, row in rows]
  (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
  test_embed.run_cli(f"--checkpoint={ckpt}", f"--input={tmp_path / 'in.jsonl'}",
                     f"--output={tmp_path / 'out.npz'}", "--batch_size=4")
  out = np.load(tmp_path / "out.npz")
  assert not any(k.startswith(("pooler_output", "token_type_ids")) for k in out.files)
  errors = []
  for i, (name, row) in enumerate(rows):
    real = ref[f"{name}/attention_mask"][row].astype(bool)
    assert out[f"hidden_states_{i}"].shape[0] == 5
    errors.append(np.abs(out[f"hidden_states_{i}"][:, real] - ref[f"{name}/hidden_states"][row][:, real]).max())
  assert len(errors) == 6 and max(errors) <= TOLERANCE, errors
  print(f"modernbert: max |hidden_states - transformers| = {max(errors):.2e} over {len(errors)} examples")


def test_a_bert_config_is_not_initialised_from_a_modernbert_directory():
  path, cfg, _ = _load()
  bert = dataclasses.replace(cfg, **{f: getattr(model.BertConfig(), f) for f in modernbert_keys.SWITCHES},
                             rope_theta=None, local_rope_theta=None, norm_bias=True, dense_bias=True,
                             global_attn_every_n_layers=1, local_attention=None)
  problem = checkpoint_loader.family_problem(path, bert)
  assert "modernbert encoder" in problem and "RoPE base 160000.0" in problem and "geglu, pre_norm" in problem
  assert checkpoint_loader.family_problem(path, cfg) is None


def test_bfloat16_and_dropout_paths_with_every_switch():
  # bfloat16 compute stays near float32 (RoPE angles are float32 in both); with attention dropout the
  # non-fused path applies the same sliding-window mask.
  cfg = _modern(num_layers=3)
  ids, params = _init(cfg)
  run = lambda c, **kw: model.BertEncoder(c).apply({"params": params}, ids, pool=False, **kw)["sequence_output"]
  f32, bf16 = run(cfg), run(dataclasses.replace(cfg, dtype=jnp.bfloat16))
  assert bf16.dtype == jnp.bfloat16 and np.abs(np.asarray(bf16, np.float32) - f32).max() < 0.1
  dropped = dataclasses.replace(cfg, attention_dropout=0.5)
  out = run(dropped, deterministic=False, rngs={"dropout": jax.random.key(0)})
  assert np.isfinite(np.asarray(out)).all() and np.abs(out - f32).max() > 1e-3
  # At a rate of 1e-9 (nothing dropped) the non-fused path, taken whenever dropout is on, equals the fused one.
  x = jax.random.normal(jax.random.key(4), (1, 12, cfg.hidden_size))
  context = model.layer_context(cfg, jnp.ones((1, 12), jnp.int32), None, jnp.arange(12)[None])
  p = {"params": params["encoder"]["layer_1"]["attention"]}
  fused = model.SelfAttention(cfg).apply(p, x, context["local_mask"], context["local_rope"], True)
  explicit = model.SelfAttention(dataclasses.replace(cfg, attention_dropout=1e-9)).apply(
      p, x, context["local_mask"], context["local_rope"], False, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_allclose(fused, explicit, atol=1e-5)
