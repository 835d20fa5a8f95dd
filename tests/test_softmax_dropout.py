"""Attention's softmax, dropout and weighted sum with a leaner backward pass: the same values and gradients."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import encoder as model
from bert_jax.models import softmax_dropout

B, N, L, K = 2, 3, 8, 4


def _inputs(seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=(B, L, N, K)) * 2, dtype) for _ in range(3))
  lengths = np.array([L, 5])
  mask = jnp.asarray(np.arange(L)[None, None, None, :] < lengths[:, None, None, None])   # [B, 1, 1, L]
  return q, k, v, mask


def _plain(q, k, v, mask, key, rate, scores_dtype=jnp.float32):
  """The ops autodiff sees without `attend`: the encoder's explicit path with flax's Dropout."""
  scores = jnp.einsum("bqnk,bsnk->bnqs", q, k, preferred_element_type=scores_dtype).astype(jnp.float32)
  scores = jnp.where(mask, scores / np.sqrt(q.shape[-1]), jnp.finfo(jnp.float32).min)
  probs = jnp.where(mask, jax.nn.softmax(scores, axis=-1), 0.0)
  dropped = nn.Dropout(rate).apply({}, probs, deterministic=False, rngs={"dropout": key})
  return jnp.einsum("bnqs,bsnk->bqnk", dropped.astype(v.dtype), v)


def _dropout_key(key):
  """The key nn.Dropout draws (make_rng("dropout") in its own scope)."""
  return nn.Dropout(0.1).apply({}, rngs={"dropout": key}, method=lambda m: m.make_rng("dropout"))


def test_values_and_float32_gradients_are_autodiffs():
  q, k, v, mask = _inputs()
  key = jax.random.key(7)
  w = jnp.asarray(np.random.default_rng(1).normal(size=(B, L, N, K)), jnp.float32)
  plain = lambda *qkv: jnp.sum(_plain(*qkv, mask, key, 0.1) * w)
  fused = lambda *qkv: jnp.sum(softmax_dropout.attend(*qkv, mask, _dropout_key(key), 0.1, jnp.float32) * w)
  (l0, g0), (l1, g1) = (jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v) for f in (plain, fused))
  # The same dropout bits and ops (run eagerly here, so rounding may differ in the last place).
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  for a, b in zip(g0, g1):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * float(jnp.max(jnp.abs(a))))


def test_bfloat16_residuals_round_the_backward_pass_only():
  """bfloat16 inputs: "bfloat16" residuals against autodiff of the plain ops, within bfloat16 rounding."""
  q, k, v, mask = _inputs(2, jnp.bfloat16)
  key = jax.random.key(3)
  w = jnp.asarray(np.random.default_rng(4).normal(size=(B, L, N, K)), jnp.float32)
  plain = lambda *qkv: jnp.sum(_plain(*qkv, mask, key, 0.1).astype(jnp.float32) * w)
  fused = lambda *qkv: jnp.sum(
      softmax_dropout.attend(*qkv, mask, _dropout_key(key), 0.1, jnp.bfloat16).astype(jnp.float32) * w)
  (l0, g0), (l1, g1) = (jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v) for f in (plain, fused))
  assert float(l0) == float(l1)
  for a, b in zip(g0, g1):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    scale = np.max(np.abs(a))
    assert 0 < np.max(np.abs(b - a)) < 2e-2 * scale   # rounded, within a few bfloat16 steps of the largest
  # No gradient reaches masked keys (row 1 has 5 keys).
  assert float(jnp.max(jnp.abs(g1[1][1, 5:]))) == 0.0


def test_scores_in_the_compute_dtype_are_the_rounded_scores():
  """bfloat16 inputs with bfloat16 scores: the plain ops on scores rounded to bfloat16, not the float32
  scores' values (the option changes the forward pass, by bfloat16 rounding)."""
  q, k, v, mask = _inputs(5, jnp.bfloat16)
  key = jax.random.key(11)
  w = jnp.asarray(np.random.default_rng(6).normal(size=(B, L, N, K)), jnp.float32)
  out = lambda f: lambda *qkv: jnp.sum(f(*qkv).astype(jnp.float32) * w)
  rounded = out(lambda *qkv: _plain(*qkv, mask, key, 0.1, jnp.bfloat16))
  full = out(lambda *qkv: _plain(*qkv, mask, key, 0.1))
  fused = out(lambda *qkv: softmax_dropout.attend(*qkv, mask, _dropout_key(key), 0.1, jnp.bfloat16, jnp.bfloat16))
  (l0, g0), (l1, g1), (lf, _) = (jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v) for f in (rounded, fused, full))
  assert float(l1) == float(l0) != float(lf)
  assert abs(float(l1) - float(lf)) < 2e-2 * float(jnp.sum(jnp.abs(w)))
  for a, b in zip(g0, g1):   # the backward pass as "bfloat16" residuals make it from these probabilities
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.max(np.abs(b - a)) < 2e-2 * np.max(np.abs(a))


@pytest.mark.slow
def test_the_encoder_writes_its_scores_in_the_configured_dtype():
  """The tiny encoder, training (dropout, through `attend`) and with output_attentions (the plain ops):
  "compute" changes both in bfloat16 compute, where it means bfloat16 scores, and neither in float32."""
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, 100, (2, 16)))
  mask, seg = jnp.ones((2, 16), jnp.int32), jnp.zeros((2, 16), jnp.int32)
  for dtype in (jnp.bfloat16, jnp.float32):
    outputs = {}
    for scores in ("float32", "compute"):
      cfg = model.BertConfig.from_preset("tiny", dtype=dtype, attention_scores=scores, attention_residuals="bfloat16")
      m = model.BertEncoder(cfg)
      params = m.init(jax.random.key(0), ids, mask, seg)["params"]
      train = m.apply({"params": params}, ids, mask, seg, deterministic=False, rngs={"dropout": jax.random.key(1)})
      probe = m.apply({"params": params}, ids, mask, seg, output_attentions=True)
      outputs[scores] = (np.asarray(train["sequence_output"], np.float32),
                         np.asarray(probe["attentions"][0], np.float32))
    for a, b in zip(outputs["float32"], outputs["compute"]):
      assert np.array_equal(a, b) == (dtype == jnp.float32)
      np.testing.assert_allclose(b, a, atol=0.05 * np.max(np.abs(a)))
  assert model.BertConfig.from_preset("tiny", attention_scores="compute").scores_dtype == jnp.float32
  with pytest.raises(ValueError, match="attention_scores 'bfloat16'"):
    model.BertConfig.from_preset("tiny", attention_scores="bfloat16")


@pytest.mark.parametrize("dtype,layout", [("float32", {}), ("bfloat16", {})] + [
    pytest.param("float32", layout, marks=pytest.mark.slow)
    for layout in ({"scan_layers": True}, {"remat_policy": "minimal"}, {"share_layers": True},
                   {"shared_sublayer": "attention"}, {"dropout_bits": "hash"})])
@pytest.mark.slow
def test_the_encoder_trains_to_the_same_loss_and_gradients(dtype, layout):
  """The model with attention_residuals "float32" against "autodiff" (the plain ops), unrolled, scanned,
  rematerialised and with shared layers: the same dropout bits at each layer's path, the same loss,
  gradients equal to 1e-6 of the largest (float32) or 1e-3 (bfloat16 compute)."""
  cfg0 = dataclasses.replace(model.BertConfig.from_preset("tiny"), dtype=jnp.dtype(dtype), **layout)
  rng = np.random.default_rng(0)
  b, length = 4, 16
  ids = jnp.asarray(rng.integers(5, cfg0.vocab_size, (b, length)))
  mask = jnp.asarray((np.arange(length)[None] < np.array([16, 12, 9, 16])[:, None]).astype(np.int32))
  seg = jnp.zeros((b, length), jnp.int32)
  w = jnp.asarray(rng.normal(size=(b, length, cfg0.hidden_size)), jnp.float32)
  results, custom_calls = {}, {}
  for residuals in ("autodiff", "float32"):
    m = model.BertEncoder(dataclasses.replace(cfg0, attention_residuals=residuals))
    params = m.init(jax.random.key(0), ids, mask, seg)["params"]

    def loss(p, m=m):
      out = m.apply({"params": p}, ids, mask, seg, deterministic=False, rngs={"dropout": jax.random.key(3)})
      return jnp.sum(out["sequence_output"].astype(jnp.float32) * w)

    grad_fn = jax.value_and_grad(loss)
    custom_calls[residuals] = str(jax.make_jaxpr(loss)(params)).count("custom_vjp_call")
    results[residuals] = jax.jit(grad_fn)(params)
  # The attention's own gradient is a custom_vjp beside the LayerNorms' (which both settings have); under a
  # remat policy the plain ops run whatever the setting (attention.SelfAttention._explicit_attention).
  assert custom_calls["autodiff"] > 0
  lean = layout.get("remat_policy", "none") == "none"
  assert (custom_calls["float32"] > custom_calls["autodiff"]) == lean, custom_calls
  (l0, g0), (l1, g1) = results["autodiff"], results["float32"]
  assert float(l0) == float(l1)
  top = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g0))
  tol = 1e-6 if dtype == "float32" else 1e-3
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, a, rtol=0, atol=tol * top), g0, g1)


@pytest.mark.slow
def test_leaner_residuals_train_to_the_losses_of_the_plain_ops():
  """Twenty bf16 train steps of the tiny config (with BERT's dropout) on one batch: "float32" and "bfloat16"
  residuals against "autodiff" (the plain ops), all with float32 scores, follow the same losses, to 1e-3
  relative at every step (measured: 2.3e-4 and 1.6e-4; bfloat16 compute rounds the plain ops' gradients as
  much); so do "bfloat16" residuals with bfloat16 scores (`attention_scores="compute"`, the pretraining
  configs'; measured: 3.0e-4), which are not the float32 scores' losses."""
  from bert_jax.tools import bench_train
  from configs import tiny
  losses = {}
  for residuals, scores in (("autodiff", "float32"), ("float32", "float32"), ("bfloat16", "float32"),
                            ("bfloat16", "compute")):
    c = tiny.get_config()
    c.dtype, c.model.attention_residuals, c.global_batch_size = "bfloat16", residuals, 8
    c.model.attention_scores = scores
    c.model.hidden_dropout = c.model.attention_dropout = 0.1
    c.optimizer.warmup_steps = 5
    timer = bench_train.TrainStepTimer(c, warmup=0)
    losses[residuals, scores] = []
    for _ in range(20):
      timer()
      losses[residuals, scores].append(float(timer._metrics["loss"]))
  a = np.array(losses["autodiff", "float32"])
  assert a[-1] < a[0] - 0.5   # it trains: the comparison is not of a flat curve
  for residuals in ("float32", "bfloat16"):
    np.testing.assert_allclose(losses[residuals, "float32"], a, rtol=1e-3)
  np.testing.assert_allclose(losses["bfloat16", "compute"], a, rtol=1e-3)
  assert losses["bfloat16", "compute"] != losses["bfloat16", "float32"]


def test_bfloat16_scores_on_a_real_checkpoint_stay_within_bfloat16_computes_error():
  """MiniLM's real weights and sentences, bfloat16 compute, the explicit path (output_attentions): the
  hidden states with bfloat16 scores are as far from Hugging Face's float32 ones as with float32 scores,
  to 10% in the mean (measured: 0.0132 against 0.0128; max 0.027 against 0.031), and not equal to them."""
  from bert_jax.interop import checkpoints_hf
  from tests.conftest import shared_path
  path = shared_path("minilm")
  ref = np.load(path / "hf_reference.npz")
  cfg, params = checkpoints_hf.load_hf(path)
  ids, mask, seg = (ref[f"batch_{k}"].astype(np.int32) for k in ("input_ids", "attention_mask", "token_type_ids"))
  errors, outputs = {}, {}
  for scores in ("float32", "compute"):
    c = dataclasses.replace(cfg, dtype=jnp.dtype(jnp.bfloat16), attention_scores=scores)
    run = jax.jit(lambda p, c=c: model.BertEncoder(c).apply({"params": p}, ids, mask, seg, output_attentions=True))
    outputs[scores] = np.asarray(run(params["bert"])["sequence_output"], np.float32)
    errors[scores] = np.abs(outputs[scores] - ref["batch_last_hidden_state"]).max(-1)[mask == 1]
  assert errors["compute"].mean() < 1.1 * errors["float32"].mean()
  assert errors["compute"].max() < 0.05
  assert not np.array_equal(outputs["compute"], outputs["float32"])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compute_residuals_are_those_of_the_compute_dtype(dtype):
  """attention_residuals "compute" (the pretraining configs' default) keeps the probabilities in the model's
  dtype: the encoder's loss and gradients are those of naming that dtype, to the bit, and in float32 they
  differ from bfloat16's (so float32 pretraining with attention dropout, `bench train`'s comparison model,
  keeps autodiff's float32 gradients)."""
  cfg0 = dataclasses.replace(model.BertConfig.from_preset("tiny"), dtype=jnp.dtype(dtype))
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, cfg0.vocab_size, (2, 16)))
  mask, seg = jnp.ones((2, 16), jnp.int32), jnp.zeros((2, 16), jnp.int32)
  w = jnp.asarray(rng.normal(size=(2, 16, cfg0.hidden_size)), jnp.float32)
  results = {}
  for residuals in dict.fromkeys(("compute", dtype, "bfloat16")):
    m = model.BertEncoder(dataclasses.replace(cfg0, attention_residuals=residuals))
    params = m.init(jax.random.key(0), ids, mask, seg)["params"]
    loss = lambda p, m=m: jnp.sum(m.apply({"params": p}, ids, mask, seg, deterministic=False,
                                          rngs={"dropout": jax.random.key(3)})["sequence_output"].astype(jnp.float32) * w)
    results[residuals] = jax.jit(jax.value_and_grad(loss))(params)
  same = jax.tree.map(lambda a, b: bool(jnp.all(a == b)), results["compute"], results[dtype])
  assert all(jax.tree.leaves(same))
  if dtype == "float32":
    differs = jax.tree.map(lambda a, b: bool(jnp.any(a != b)), results["compute"][1], results["bfloat16"][1])
    assert any(jax.tree.leaves(differs))


def test_float32_pretraining_configs_keep_float32_residuals():
  """tiny.py (the quick start, no dropout) and `bench train`'s comparison model (BERT's dropout) compute in
  float32: with attention dropout their attention's backward pass keeps float32 probabilities, as the peers'
  autodiff does; bfloat16 pretraining keeps bfloat16."""
  from bert_jax import train
  from bert_jax.tools import bench_train
  from configs import bert_base, tiny
  for c, dtype in ((tiny.get_config(), jnp.float32), (bench_train.comparison_config(packing=False), jnp.float32),
                   (bert_base.get_config("phase1"), jnp.bfloat16)):
    assert train.bert_config(c).residuals_dtype == jnp.dtype(dtype)
