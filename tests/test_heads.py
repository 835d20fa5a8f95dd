"""Pretraining and finetuning heads: shapes, param trees, the tied decoder, the masked-position gather."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import heads
from bert_jax.models import encoder as model

VOCAB = 64


def tiny(**overrides):
  return model.BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=32, **overrides)


def pretraining_batch(batch=2, length=12, predictions=3):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, VOCAB, size=(batch, length), dtype=np.int32)
  return {
      "input_ids": ids,
      "input_mask": np.ones_like(ids),
      "segment_ids": np.zeros_like(ids),
      "masked_lm_positions": np.array([[1, 4, 0], [2, 3, 9]], np.int32)[:batch, :predictions],
  }


@pytest.mark.slow
def test_pretraining_outputs_and_param_tree():
  cfg = tiny()
  batch = pretraining_batch()
  m = heads.BertForPreTraining(cfg)
  params = nn.unbox(m.init(jax.random.key(0), batch)["params"])
  assert set(params) == {"bert", "mlm", "nsp"}
  assert set(params["mlm"]) == {"transform", "layer_norm", "output_bias"}  # no separate decoder matrix
  out = m.apply({"params": params}, batch)
  assert out["mlm_logits"].shape == (2, 3, VOCAB) and out["mlm_logits"].dtype == jnp.float32
  assert out["nsp_logits"].shape == (2, 2) and out["nsp_logits"].dtype == jnp.float32

  # The gathered logits are the all-positions logits at the masked positions.
  every = heads.BertForPreTraining(cfg, mlm_all_positions=True).apply({"params": params}, batch)
  assert every["mlm_logits"].shape == (2, 12, VOCAB)
  gathered = np.take_along_axis(np.asarray(every["mlm_logits"]), batch["masked_lm_positions"][..., None], 1)
  np.testing.assert_allclose(out["mlm_logits"], gathered, atol=1e-5)

  # Decoder is tied: logits = transform(x) @ word_embeddings^T + bias.
  seq = model.BertEncoder(cfg).apply({"params": params["bert"]}, batch["input_ids"], batch["input_mask"],
                                     batch["segment_ids"])["sequence_output"]
  mlm = params["mlm"]
  h = nn.gelu(seq @ mlm["transform"]["kernel"] + mlm["transform"]["bias"], approximate=False)
  mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
  h = (h - mu) / np.sqrt(var + cfg.layer_norm_eps) * mlm["layer_norm"]["scale"] + mlm["layer_norm"]["bias"]
  table = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  np.testing.assert_allclose(every["mlm_logits"], h @ table.T + mlm["output_bias"], atol=1e-4)


def test_without_nsp_and_packed_nsp_positions():
  cfg = tiny()
  batch = pretraining_batch()
  no_nsp = heads.BertForPreTraining(cfg, use_nsp=False)
  params = nn.unbox(no_nsp.init(jax.random.key(0), batch)["params"])
  assert set(params) == {"bert", "mlm"}
  assert set(no_nsp.apply({"params": params}, batch)) == {"mlm_logits"}

  packed = {**batch, "next_sentence_positions": np.array([[0, 6], [0, 0]], np.int32),
            "example_ids": np.array([[1] * 6 + [2] * 6, [1] * 12], np.int32),
            "position_ids": np.array([list(range(6)) * 2, list(range(12))], np.int32)}
  m = heads.BertForPreTraining(cfg)
  params = m.init(jax.random.key(0), packed)
  out = m.apply(params, packed)
  assert out["nsp_logits"].shape == (2, 2, 2)
  # Row 1 holds a single example, so its first NSP logits equal the unpacked ones.
  single = m.apply(params, batch)
  np.testing.assert_allclose(out["nsp_logits"][1, 0], single["nsp_logits"][1], atol=1e-5)


def test_finetuning_heads_share_the_encoder_tree():
  cfg = tiny()
  batch = pretraining_batch()
  args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
  pretrained = nn.unbox(heads.BertForPreTraining(cfg).init(jax.random.key(1), batch)["params"])
  cases = [(heads.BertForSequenceClassification(cfg, num_labels=3), "classifier", (2, 3)),
           (heads.BertForSequenceClassification(cfg, num_labels=1), "classifier", (2, 1)),
           (heads.BertForTokenClassification(cfg, num_labels=5), "classifier", (2, 12, 5))]
  for m, head, shape in cases:
    params = nn.unbox(m.init(jax.random.key(0), *args)["params"])
    assert set(params) == {"bert", head}
    params["bert"] = pretrained["bert"]  # the encoder moves between models
    logits = m.apply({"params": params}, *args)
    assert logits.shape == shape and logits.dtype == jnp.float32
  qa = heads.BertForQuestionAnswering(cfg)
  params = nn.unbox(qa.init(jax.random.key(0), *args)["params"])
  assert set(params) == {"bert", "qa_outputs"}
  out = qa.apply({"params": params}, *args)
  assert out["start_logits"].shape == out["end_logits"].shape == (2, 12)


def test_finetuning_dropout_needs_rng_only_in_training():
  cfg = tiny()
  batch = pretraining_batch()
  args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"])
  m = heads.BertForSequenceClassification(cfg, num_labels=2)
  params = m.init(jax.random.key(0), *args)
  a = m.apply(params, *args, deterministic=False, rngs={"dropout": jax.random.key(1)})
  b = m.apply(params, *args, deterministic=False, rngs={"dropout": jax.random.key(2)})
  assert not np.allclose(a, b)
  np.testing.assert_array_equal(m.apply(params, *args), m.apply(params, *args))


@pytest.mark.slow
def test_sharded_forward_and_grad_match_single_device():
  # Every activation constraint of the encoder and heads under the project's logical rules.
  from configs import common  # pylint: disable=g-import-not-at-top
  rules = common.LOGICAL_AXIS_RULES
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  cfg = tiny(scan_layers=True, remat_policy="minimal")
  batch = pretraining_batch()
  batch = {k: np.tile(v, (4, 1)) for k, v in batch.items()}  # 8 rows: one per data x fsdp shard pair
  m = heads.BertForPreTraining(cfg)
  # The scanned layout of eagerly made params (whose initialiser ops are compiled already): a jitted
  # init would compile them all again for nothing, the values do not matter here.
  params = nn.unbox(heads.BertForPreTraining(tiny()).init(jax.random.key(0), pretraining_batch())["params"])
  params = model.scan_params(params)
  loss = lambda p, b: jnp.sum(jax.nn.log_softmax(m.apply({"params": p}, b)["mlm_logits"])[..., 7])
  ref_loss, ref_grad = jax.jit(jax.value_and_grad(loss))(params, batch)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    specs = nn.get_partition_spec(jax.eval_shape(m.init, jax.random.key(0), batch)["params"])
    shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
    sharded = jax.device_put(params, shardings)
    got_loss, got_grad = jax.jit(jax.value_and_grad(loss))(sharded, batch)
  assert sharded["bert"]["encoder"]["layers"]["intermediate"]["kernel"].sharding.spec == \
      jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  np.testing.assert_allclose(got_loss, ref_loss, rtol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5), got_grad, ref_grad)


def test_every_param_has_logical_axis_names():
  allowed = {"vocab", "embed", "mlp", "heads", "kv", "layers", "type_vocab", "position", None}
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  for scan in (False, True):
    cfg = tiny(scan_layers=scan)
    boxed = jax.eval_shape(heads.BertForPreTraining(cfg).init, jax.random.key(0), pretraining_batch())["params"]
    leaves = jax.tree_util.tree_flatten_with_path(boxed, is_leaf=is_box)[0]
    # 16 per layer, embeddings 5, pooler 2, MLM 5, NSP 2.
    assert len(leaves) == 16 * (1 if scan else cfg.num_layers) + 5 + 2 + 5 + 2
    for path, leaf in leaves:
      assert is_box(leaf), path
      assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= allowed, (path, leaf.names)
      in_stack = scan and "encoder" in jax.tree_util.keystr(path)
      assert (leaf.names[0] == "layers") == in_stack, (path, leaf.names)


def _plain(x, t, b, library=False):
  """Autodiff's tied decoder: float32 logits plus the bias (`library`, `tied_logits`' switch, unused)."""
  del library
  return jnp.einsum("...e,ve->...v", x, t, preferred_element_type=jnp.float32) + b


def _grads(dtype, decode):
  """Gradients of a weighted sum of tied logits with respect to x, the table and the bias, `decode`
  doing the logits."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 3, 16)), dtype)
  table = jnp.asarray(rng.normal(size=(VOCAB, 16)), dtype)
  bias = jnp.asarray(rng.normal(size=(VOCAB,)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(2, 3, VOCAB)), jnp.float32)
  grads = jax.grad(lambda x, t, b: jnp.sum(decode(x, t, b) * w), argnums=(0, 1, 2))(x, table, bias)
  return grads, (x, table, bias, w)


def test_tied_logits_forward_and_float32_gradients_are_autodiffs():
  ours, (x, table, bias, w) = _grads(jnp.float32, heads.tied_logits)
  reference, _ = _grads(jnp.float32, _plain)
  np.testing.assert_allclose(heads.tied_logits(x, table, bias), _plain(x, table, bias), rtol=1e-6)
  for a, b in zip(ours, reference):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ours[2], np.asarray(w).sum((0, 1)), rtol=1e-6, atol=1e-6)
  assert heads.tied_logits(x[:, :0], table, bias).shape == (2, 0, VOCAB)   # no rows: no logits


def test_tied_logits_bfloat16_backward_matmuls_take_a_bfloat16_gradient():
  (d_x, d_table, d_bias), (x, table, bias, w) = _grads(jnp.bfloat16, heads.tied_logits)
  assert d_x.dtype == d_table.dtype == jnp.bfloat16 and d_bias.dtype == jnp.float32
  # The matmuls over the table in the backward pass read the logits' gradient rounded to bfloat16
  # (autodiff hands them the float32 one): operands and result in bfloat16. The bias's gradient sums the
  # float32 one.
  grad = jax.grad(lambda x, t, b: jnp.sum(heads.tied_logits(x, t, b) * w), argnums=(0, 1, 2))
  dots = [e for e in jax.make_jaxpr(grad)(x, table, bias).eqns if e.primitive.name == "dot_general"]
  dtypes = sorted(tuple(str(v.aval.dtype) for v in e.invars + e.outvars) for e in dots)
  assert dtypes == [("bfloat16",) * 3, ("bfloat16",) * 3, ("float32",) * 3], dtypes
  d_w = w.astype(jnp.bfloat16).astype(jnp.float32)
  np.testing.assert_allclose(np.asarray(d_table, np.float32),
                             np.einsum("abv,abe->ve", d_w, np.asarray(x, np.float32)), rtol=2e-2, atol=2e-2)
  np.testing.assert_allclose(d_bias, np.asarray(w).sum((0, 1)), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_bfloat16_decoder_gradient_trains_to_autodiffs_losses(monkeypatch):
  """Twenty bf16 train steps of the tiny config (dropout on) on one batch, the tied decoder's backward pass
  in bfloat16 against autodiff's (a float32 logits gradient): the same first loss, and the same losses to
  1e-3 relative at every step (measured: 1.6e-4; bfloat16 compute rounds every other gradient as much)."""
  from bert_jax.tools import bench_train
  from configs import tiny
  losses = {}
  for name, decode in (("autodiff", _plain), ("tied_logits", heads.tied_logits)):
    monkeypatch.setattr(heads, "tied_logits", decode)
    c = tiny.get_config()
    c.dtype, c.global_batch_size, c.optimizer.warmup_steps = "bfloat16", 8, 5
    c.model.hidden_dropout = c.model.attention_dropout = 0.1
    timer = bench_train.TrainStepTimer(c, warmup=0)
    losses[name] = []
    for _ in range(20):
      timer()
      losses[name].append(float(timer._metrics["loss"]))
  a, b = np.array(losses["autodiff"]), np.array(losses["tied_logits"])
  assert a[-1] < a[0] - 0.5   # it trains: the comparison is not of a flat curve
  assert a[0] == b[0] and not np.array_equal(a, b)
  np.testing.assert_allclose(b, a, rtol=1e-3)
