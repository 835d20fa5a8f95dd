"""Encoder properties on tiny random models: sizes, layouts, masking, precision, remat, sharding."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from bert_jax.models import encoder as model
from bert_jax.models import projections

VOCAB = 64


def tiny(**overrides):
  return model.BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=32, **overrides)


@functools.cache
def _params(cfg):
  # Each parameter shape set is initialised once per module. Eagerly: the initialiser ops compiled for
  # one model (also in other test modules) serve the next, where a jitted init compiles them all again.
  ids = jnp.ones((1, 8), jnp.int32)
  return nn.unbox(model.BertEncoder(cfg).init(jax.random.key(0), ids)["params"])


def init(cfg):
  """The encoder's params for `cfg` (dropout rates and the compute dtype do not change them)."""
  params = _params(dataclasses.replace(cfg, hidden_dropout=0.1, attention_dropout=0.1, dtype=jnp.float32))
  return jax.tree.map(lambda x: x, params)  # fresh dicts: a test may edit its tree


def apply(cfg, params, ids, mask, seg, *, deterministic=True, output_hidden_states=False, rngs=None, **arrays):
  """`BertEncoder(cfg).apply` under jit: one compilation, not one per operation as in eager mode."""
  return _jitted_apply(cfg, deterministic, output_hidden_states)(params, rngs, ids, mask, seg, arrays)


@functools.cache
def _jitted_apply(cfg, deterministic, output_hidden_states):
  def fn(params, rngs, ids, mask, seg, arrays):
    return model.BertEncoder(cfg).apply({"params": params}, ids, mask, seg, rngs=rngs, deterministic=deterministic,
                                        output_hidden_states=output_hidden_states, **arrays)
  return jax.jit(fn)


def random_batch(rng, batch=2, length=12):
  ids = rng.integers(5, VOCAB, size=(batch, length), dtype=np.int32)
  return ids, np.ones_like(ids), (np.arange(length) >= length // 2).astype(np.int32)[None].repeat(batch, 0)


def n_params(cfg):
  shapes = jax.eval_shape(model.BertEncoder(cfg).init, jax.random.key(0), jnp.ones((1, 8), jnp.int32))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes)))


@pytest.mark.parametrize("preset,expected", [("base", 109_482_240), ("large", 335_141_888)])
def test_param_count_matches_hf_bert_model(preset, expected):
  # HF BertModel with pooler, vocab 30522; eval_shape never materialises the weights.
  assert n_params(model.BertConfig.from_preset(preset)) == expected


def test_presets_and_table6_grid():
  assert model.BertConfig.from_preset("L-6_H-768_A-3").num_heads == 3
  for name in model.TABLE6:
    cfg = model.BertConfig.from_preset(name)
    assert cfg.intermediate_size == 4 * cfg.hidden_size
  assert model.BertConfig.from_preset("large") == model.BertConfig.from_preset("L-24_H-1024_A-16")
  assert model.BertConfig.from_preset("mini", dtype="bfloat16").dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="unknown preset"):
    model.BertConfig.from_preset("huge")
  with pytest.raises(ValueError, match="remat_policy"):
    tiny(remat_policy="everything")


def test_hf_dict_round_trip():
  cfg = tiny(hidden_dropout=0.2, layer_norm_eps=1e-6)
  d = cfg.to_hf_dict()
  assert d["num_hidden_layers"] == 2 and d["hidden_act"] == "gelu"
  assert model.BertConfig.from_hf_dict(d) == cfg
  with pytest.raises(ValueError, match="position_embedding_type"):
    model.BertConfig.from_hf_dict({**d, "position_embedding_type": "relative_key"})
  # ALBERT's one group of one layer is shared or not alike: the dict says which params the layer has.
  for shared in (False, True):
    albert = tiny(num_layers=1, embedding_size=8, share_layers=shared)
    assert model.BertConfig.from_hf_dict(albert.to_hf_dict()) == albert


def test_output_shapes_and_pooled_positions():
  cfg = tiny()
  ids, mask, seg = random_batch(np.random.default_rng(0))
  params = init(cfg)
  out = apply(cfg, params, ids, mask, seg, output_hidden_states=True)
  assert out["sequence_output"].shape == (2, 12, cfg.hidden_size)
  assert out["pooled_output"].shape == (2, cfg.hidden_size)
  assert out["hidden_states"].shape == (cfg.num_layers + 1, 2, 12, cfg.hidden_size)
  np.testing.assert_array_equal(out["hidden_states"][-1], out["sequence_output"])
  pooled = apply(cfg, params, ids, mask, seg, pooled_positions=np.array([[0, 5], [0, 7]]))
  assert pooled["pooled_output"].shape == (2, 2, cfg.hidden_size)
  np.testing.assert_allclose(pooled["pooled_output"][:, 0], out["pooled_output"], atol=1e-6)


def test_sequences_longer_than_the_position_table_are_an_error():
  ids = np.ones((1, 33), np.int32)  # tiny() has 32 positions
  with pytest.raises(ValueError, match="sequence length 33 exceeds max_position_embeddings 32"):
    jax.eval_shape(model.BertEncoder(tiny()).init, jax.random.key(0), ids)


def test_scanned_equals_unscanned_and_layouts_convert():
  ids, mask, seg = random_batch(np.random.default_rng(1))
  cfg = tiny()
  params = init(cfg)
  scanned = model.scan_params(params)
  assert scanned["encoder"]["layers"]["intermediate"]["kernel"].shape == (2, 128, 512)
  scanned_shapes = jax.eval_shape(model.BertEncoder(tiny(scan_layers=True)).init, jax.random.key(0), ids)
  assert jax.tree.structure(scanned) == jax.tree.structure(nn.unbox(scanned_shapes["params"]))
  jax.tree.map(np.testing.assert_array_equal, model.unscan_params(scanned), params)
  a = apply(cfg, params, ids, mask, seg, output_hidden_states=True)
  b = apply(tiny(scan_layers=True), scanned, ids, mask, seg, output_hidden_states=True)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), a, b)


@pytest.mark.slow
def test_scanned_layers_unrolled_over_their_stacked_params():
  """`scan_unroll` num_layers: the scanned layout's params, no loop in the step, the unrolled layers' outputs
  and gradients, and none of a looped stack's recomputation (`scan_recomputed`)."""
  ids, mask, seg = random_batch(np.random.default_rng(5))
  params = init(tiny())

  def loss_fn(cfg):
    return lambda p: jnp.sum(model.BertEncoder(cfg).apply({"params": p}, ids, mask, seg)["pooled_output"])

  flat, looped = tiny(scan_layers=True, scan_unroll=2), tiny(scan_layers=True)
  assert not flat.looped_layers and looped.looped_layers and not tiny().looped_layers
  # One layer, one a trip: JAX keeps a loop of one trip.
  assert tiny(num_layers=1, scan_layers=True).looped_layers
  assert not tiny(num_layers=1, scan_layers=True, scan_unroll=2).looped_layers
  a = apply(tiny(), params, ids, mask, seg, output_hidden_states=True)
  b = apply(flat, model.scan_params(params), ids, mask, seg, output_hidden_states=True)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), a, b)
  ref = jax.jit(jax.grad(loss_fn(tiny())))(params)
  got = jax.jit(jax.grad(loss_fn(flat)))(model.scan_params(params))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), model.scan_params(ref), got)
  hlo = lambda cfg: jax.jit(jax.grad(loss_fn(cfg))).lower(model.scan_params(params)).as_text()  # noqa: E731
  assert "stablehlo.while" in hlo(looped) and "stablehlo.while" not in hlo(flat)
  assert "remat" in str(jax.make_jaxpr(jax.grad(loss_fn(looped)))(model.scan_params(params)))
  assert "remat" not in str(jax.make_jaxpr(jax.grad(loss_fn(flat)))(model.scan_params(params)))
  with pytest.raises(ValueError, match="scan_unroll 0"):
    tiny(scan_layers=True, scan_unroll=0)


def test_padding_does_not_change_real_positions():
  cfg = tiny()
  rng = np.random.default_rng(2)
  ids, mask, seg = random_batch(rng, length=10)
  params = init(cfg)
  ref = apply(cfg, params, ids, mask, seg)
  pad = lambda x, v: np.concatenate([x, np.full((2, 6), v, np.int32)], axis=1)
  # Garbage ids and segment ids in the padding: only input_mask may decide.
  padded = apply(cfg, params, pad(ids, 7), pad(mask, 0), pad(seg, 1))
  np.testing.assert_allclose(padded["sequence_output"][:, :10], ref["sequence_output"], atol=1e-5)
  np.testing.assert_allclose(padded["pooled_output"], ref["pooled_output"], atol=1e-5)


@pytest.mark.parametrize("position_pad_id", [None, 1])
def test_packed_examples_are_independent(position_pad_id):
  """Also with RoBERTa's positions (counted from pad id 1 + 1), to which a packed batch's offsets map."""
  cfg = tiny(position_pad_id=position_pad_id)
  enc = model.BertEncoder(cfg)
  # Two examples with disjoint token ids packed in one row, then padding.
  a, b = np.arange(10, 16, dtype=np.int32), np.arange(30, 35, dtype=np.int32)
  ids = np.concatenate([a, b, [0, 0, 0]])[None]
  example_ids = np.array([[1] * 6 + [2] * 5 + [0] * 3], np.int32)
  position_ids = np.array([list(range(6)) + list(range(5)) + [0] * 3], np.int32)
  mask = (example_ids > 0).astype(np.int32)
  seg = np.zeros_like(ids)
  params = init(cfg)

  def first_example_output(p):
    out = enc.apply({"params": p}, ids, mask, seg, position_ids=position_ids, example_ids=example_ids)
    return jnp.sum(out["sequence_output"][0, :6] ** 2)

  grad = jax.jit(jax.grad(first_example_output))(params)["embeddings"]["word_embeddings"]["embedding"]
  assert np.all(np.asarray(grad[b]) == 0.0)  # exactly zero, not merely small
  assert np.all(np.abs(np.asarray(grad[a])).max(axis=-1) > 0)
  # The second example packed equals the second example alone.
  packed = apply(cfg, params, ids, mask, seg, position_ids=position_ids, example_ids=example_ids,
                 pooled_positions=np.array([[0, 6]]))
  alone = apply(cfg, params, b[None], np.ones((1, 5), np.int32), np.zeros((1, 5), np.int32))
  np.testing.assert_allclose(packed["sequence_output"][0, 6:11], alone["sequence_output"][0], atol=1e-5)
  np.testing.assert_allclose(packed["pooled_output"][0, 1], alone["pooled_output"][0], atol=1e-5)


def test_bfloat16_compute_close_to_float32():
  ids, mask, seg = random_batch(np.random.default_rng(3))
  params = init(tiny())
  f32 = apply(tiny(), params, ids, mask, seg)
  bf16 = apply(tiny(dtype=jnp.bfloat16), params, ids, mask, seg)
  assert bf16["sequence_output"].dtype == jnp.bfloat16
  err = np.abs(np.asarray(bf16["sequence_output"], np.float32) - np.asarray(f32["sequence_output"]))
  # Outputs are LayerNorm-ed (unit scale); bf16 has an 8-bit mantissa (relative step 2^-8 = 0.004).
  assert err.max() < 0.08 and err.mean() < 0.01, (err.max(), err.mean())  # measured 0.039, 0.0038


@pytest.mark.slow
def test_remat_does_not_change_gradients():
  ids, mask, seg = random_batch(np.random.default_rng(4))
  params = init(tiny())

  def loss_fn(cfg):
    return lambda p: jnp.sum(model.BertEncoder(cfg).apply({"params": p}, ids, mask, seg)["pooled_output"])

  close = lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  ref = jax.jit(jax.grad(loss_fn(tiny())))(params)
  # Scanned without a policy, the LayerNorms and the feed-forward GELU alone are recomputed
  # (layer_norm.layer_norm, encoder.scan_recomputed).
  for cfg, p in [(tiny(remat_policy="full"), params),
                 (tiny(remat_policy="minimal", scan_layers=True), model.scan_params(params)),
                 (tiny(scan_layers=True), model.scan_params(params)),
                 (tiny(recompute_gelu=True), params)]:
    grad_fn = jax.grad(loss_fn(cfg))
    assert "remat" in str(jax.make_jaxpr(grad_fn)(p))  # the switch really rematerialises
    got = jax.jit(grad_fn)(p)
    jax.tree.map(close, model.scan_params(ref) if cfg.scan_layers else ref, got)


def test_scanned_feed_forward_gelu_saves_its_input_alone(capsys):
  # Autodiff's exact GELU saves three [rows, intermediate] arrays for its backward pass; a scanned stack
  # would stack each over the layers. Recomputed, it saves its input (and its gradient is the same); so it
  # does unrolled with `recompute_gelu`, behind the CSE barrier (without it XLA merges the recomputation
  # back into the forward pass).
  x = jnp.linspace(-4.0, 4.0, 96).reshape(8, 12)
  grads = {}
  for layout, saves, prevent_cse in (({}, 3, None), ({"scan_layers": True}, 1, False),
                                     ({"recompute_gelu": True}, 1, True)):
    fn = model.scan_recomputed(tiny(**layout), functools.partial(model.gelu, tiny()))
    print_saved_residuals(lambda x: fn(x).sum(), x)
    saved = [line for line in capsys.readouterr().out.splitlines() if "[8,12]" in line]
    assert len(saved) == saves, (layout, saved)
    remat = [e for e in jax.make_jaxpr(fn)(x).eqns if "prevent_cse" in e.params]   # jax.checkpoint's
    assert [e.params["prevent_cse"] for e in remat] == ([] if prevent_cse is None else [prevent_cse]), layout
    grads[tuple(layout)] = jax.grad(lambda x: fn(x).sum())(x)
  for g in grads.values():
    np.testing.assert_allclose(g, grads[()], rtol=1e-6)


def test_dense_multiplies_its_inputs_rows_outside_a_scanned_stack():
  # [B, L, H] @ [H, F] as the 2-D matmul [B * L, H] @ [H, F]; in a scanned stack's layer, as given, also
  # when the stack is unrolled over its stacked params (`scan_unroll`).
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 32)), jnp.float32)
  stacked = {"scan_layers": True, "scan_unroll": 2}
  for scan, in_layer, rank in (({}, True, 2), ({"scan_layers": True}, False, 2), ({"scan_layers": True}, True, 3),
                               (stacked, True, 3)):
    dense = model.dense(tiny(**scan), 8, ("embed", "mlp"), "d", in_layer=in_layer)
    params = nn.unbox(dense.init(jax.random.key(0), x)["params"])
    params["bias"] = jnp.arange(8.0)
    jaxpr = jax.make_jaxpr(jax.grad(lambda p, x: jnp.sum(dense.apply({"params": p}, x) ** 2), (0, 1)))(params, x)
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 3 and {e.invars[0].aval.ndim for e in dots} == {rank}, (scan, in_layer, dots)
    y = dense.apply({"params": params}, x)
    np.testing.assert_allclose(y, np.einsum("blh,hf->blf", x, params["kernel"]) + params["bias"], rtol=1e-5)
    d_params, d_x = jax.grad(lambda p, x: jnp.sum(dense.apply({"params": p}, x) ** 2), (0, 1))(params, x)
    np.testing.assert_allclose(d_params["kernel"], np.einsum("blh,blf->hf", x, 2 * y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_x, np.einsum("blf,hf->blh", 2 * y, params["kernel"]), rtol=1e-5, atol=1e-5)


def test_attention_projections_multiply_heads_and_head_size_as_one_axis():
  # [H, N, K] kernels multiply as [H, N * K] matrices, [N, K, H] as [N * K, H] (a TPU pads a 64-wide minor
  # axis to 128); the parameters keep their shapes and the products, outputs and gradients are the einsums'.
  rng = np.random.default_rng(0)
  cfg = tiny()
  n, k, h = cfg.num_heads, cfg.head_dim, cfg.hidden_size
  cases = (("blh,hnk->blnk", (h, n, k), ("embed", "heads", "kv"), ("heads", "kv"), (2, 3, h), (h, n * k)),
           ("blnk,nkh->blh", (n, k, h), ("heads", "kv", "embed"), ("embed",), (2, 3, n, k), (n * k, h)))
  for equation, shape, axes, bias_axes, x_shape, matrix in cases:
    proj = projections.Einsum(cfg, equation, shape, axes, bias_axes)
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    params = nn.unbox(proj.init(jax.random.key(0), x)["params"])
    assert params["kernel"].shape == shape
    params["bias"] = jnp.asarray(rng.normal(size=params["bias"].shape), jnp.float32)
    loss = lambda p, x: jnp.sum(proj.apply({"params": p}, x) ** 2)
    jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1)))(params, x)
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 3 and dots[0].invars[1].aval.shape == matrix, dots
    y = proj.apply({"params": params}, x)
    expected = np.einsum(equation, x, params["kernel"]) + params["bias"]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)
    d_params, d_x = jax.grad(loss, (0, 1))(params, x)
    e_params, e_x = jax.grad(lambda p, x: jnp.sum((jnp.einsum(equation, x, p["kernel"]) + p["bias"]) ** 2),
                             (0, 1))(params, x)
    np.testing.assert_allclose(d_params["kernel"], e_params["kernel"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_x, e_x, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_fused_qkv_keeps_the_parameters_outputs_and_gradients():
  # model.fused_qkv: one matmul with the query, key and value kernels side by side; the parameter tree is
  # the three projections' and outputs and gradients are those of the three matmuls.
  ids, mask, seg = random_batch(np.random.default_rng(7))
  mask[1, 9:] = 0
  plain, fused = tiny(), tiny(fused_qkv=True)
  params = init(plain)
  rng = np.random.default_rng(8)
  for name in ("query", "key", "value"):   # biases that differ, so that each must reach its own heads
    attention = params["encoder"]["layer_0"]["attention"][name]
    attention["bias"] = jnp.asarray(rng.normal(size=attention["bias"].shape), jnp.float32)
  assert jax.tree.structure(nn.unbox(model.BertEncoder(fused).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))
                                     ["params"])) == jax.tree.structure(params)

  # A random projection of the output (a sum of squares after the last LayerNorm has next to no gradient).
  weights = jnp.asarray(rng.normal(size=ids.shape + (plain.hidden_size,)), jnp.float32)

  def loss(cfg, p):
    out = model.BertEncoder(cfg).apply({"params": p}, ids, mask, seg, deterministic=True)
    return jnp.sum(out["sequence_output"] * weights), out["sequence_output"]

  jaxpr = jax.make_jaxpr(lambda p: loss(fused, p))(params)
  assert sum(e.primitive.name == "dot_general" for e in jaxpr.eqns) < sum(
      e.primitive.name == "dot_general" for e in jax.make_jaxpr(lambda p: loss(plain, p))(params).eqns)
  (_, y), grads = jax.value_and_grad(functools.partial(loss, fused), has_aux=True)(params)
  (_, y_ref), grads_ref = jax.value_and_grad(functools.partial(loss, plain), has_aux=True)(params)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), grads, grads_ref)
  assert float(jnp.abs(grads["encoder"]["layer_0"]["attention"]["key"]["kernel"]).max()) > 1e-3


def test_attention_dropout_path_matches_fused_attention():
  # Training with attention dropout uses an explicit softmax; with a vanishing rate it must agree.
  ids, mask, seg = random_batch(np.random.default_rng(5))
  mask[1, 8:] = 0
  cfg = tiny(hidden_dropout=0.0, attention_dropout=1e-9)
  params = init(cfg)
  fused = apply(cfg, params, ids, mask, seg)
  explicit = apply(cfg, params, ids, mask, seg, deterministic=False, rngs={"dropout": jax.random.key(0)})
  np.testing.assert_allclose(explicit["sequence_output"][0], fused["sequence_output"][0], atol=1e-5)
  np.testing.assert_allclose(explicit["sequence_output"][1, :8], fused["sequence_output"][1, :8], atol=1e-5)


def test_dropout_active_only_when_not_deterministic():
  ids, mask, seg = random_batch(np.random.default_rng(6))
  cfg = tiny()
  params = init(cfg)
  run = lambda key: apply(cfg, params, ids, mask, seg, deterministic=False, rngs={"dropout": key})["sequence_output"]
  assert not np.allclose(run(jax.random.key(0)), run(jax.random.key(1)))


RULES = [("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor"),
         ("activation_batch", ("data", "fsdp"))]


@pytest.mark.parametrize("scan", [False, True])
def test_init_under_mesh_shards_kernels(scan):
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  # Unscanned, one layer shows a layer's kernels (and each layer's initialisers cost compile time).
  cfg = tiny(scan_layers=True) if scan else tiny(num_layers=1)
  ids = jnp.ones((8, 16), jnp.int32)
  init_fn = lambda key: model.BertEncoder(cfg).init(key, ids)
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    abstract = jax.eval_shape(init_fn, jax.random.key(0))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, RULES)
    params = nn.unbox(jax.jit(init_fn, out_shardings=shardings)(jax.random.key(0))["params"])
  layer = params["encoder"]["layers"] if scan else params["encoder"]["layer_0"]
  lead = (None,) if scan else ()
  P = jax.sharding.PartitionSpec
  kernel = layer["intermediate"]["kernel"]
  assert kernel.sharding.spec == P(*lead, "fsdp", "tensor")
  assert kernel.addressable_shards[0].data.shape == ((2,) if scan else ()) + (64, 256)
  assert layer["attention"]["query"]["kernel"].sharding.spec == P(*lead, "fsdp", "tensor", None)
  assert layer["attention"]["out"]["kernel"].sharding.spec == P(*lead, "tensor", None, "fsdp")
  word = params["embeddings"]["word_embeddings"]["embedding"]
  assert word.sharding.spec == P("tensor", "fsdp")
  assert word.addressable_shards[0].data.shape == (VOCAB // 2, 64)


def test_default_positions_are_the_tables_first_rows_without_a_lookup():
  # Without position_ids every row's positions are 0..L-1: the table's first L rows are added as they
  # are; given, they are looked up. The same outputs and gradients, one gather and its scatter fewer.
  ids, mask, seg = random_batch(np.random.default_rng(5))
  cfg = tiny()
  params = init(cfg)
  given = {"position_ids": np.broadcast_to(np.arange(ids.shape[1]), ids.shape)}

  def loss(arrays):
    return lambda p: jnp.sum(model.BertEncoder(cfg).apply({"params": p}, ids, mask, seg, **arrays)["sequence_output"]
                             * jnp.arange(cfg.hidden_size))

  np.testing.assert_allclose(apply(cfg, params, ids, mask, seg)["sequence_output"],
                             apply(cfg, params, ids, mask, seg, **given)["sequence_output"], rtol=1e-6, atol=1e-6)
  got, want = jax.grad(loss({}))(params), jax.grad(loss(given))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
  count = lambda arrays, name: str(jax.make_jaxpr(jax.grad(loss(arrays)))(params)).count(f" {name}[")   # noqa: E731
  assert count({}, "gather") == count(given, "gather") - 1
  assert count({}, "scatter-add") == count(given, "scatter-add") - 1
  with pytest.raises(ValueError, match="max_position_embeddings"):
    apply(cfg, params, np.zeros((1, cfg.max_position_embeddings + 1), np.int32),
          np.ones((1, cfg.max_position_embeddings + 1), np.int32), np.zeros((1, cfg.max_position_embeddings + 1), np.int32))
