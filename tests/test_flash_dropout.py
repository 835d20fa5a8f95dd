"""The flash kernel with dropout (models/flash_dropout.py), run by Pallas' TPU interpreter on the CPU: the
same values and gradients as the explicit path with the kernel's dropout bits, packing and padding, inside
the encoder and sharded over a mesh; its bits are a fair coin at the rate; it lowers for TPU."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import sharding
from bert_jax.models import encoder, flash_dropout, splash
from bert_jax.models.config import BertConfig
from configs import common

B, L, N, K = 2, 32, 3, 8


def _inputs(seed=0, dtype=jnp.float32):
  r = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(r.normal(size=(B, L, N, K)) * 2, dtype) for _ in range(3))
  input_mask = np.ones((B, L), np.int32)
  input_mask[1, 24:] = 0                     # padding
  example_ids = np.zeros((B, L), np.int32)
  example_ids[0, 10:] = 1                    # two packed examples
  mask = splash.segment_mask("flash_interpret", jnp.asarray(input_mask), jnp.asarray(example_ids))
  weight = jnp.asarray(r.normal(size=(B, L, N, K)) * input_mask[:, :, None, None], jnp.float32)
  return q, k, v, mask, weight


@pytest.mark.parametrize("rate", [0.0, 0.3])
@pytest.mark.slow
def test_kernel_equals_the_explicit_path_with_its_bits(rate):
  q, k, v, mask, weight = _inputs()
  key = jax.random.key(3)
  seeds = flash_dropout.seeds(key, B, N)
  ours = lambda q, k, v: jnp.sum(flash_dropout.attention(q, k, v, mask, key, rate) * weight)
  theirs = lambda q, k, v: jnp.sum(flash_dropout.reference(q, k, v, mask.segment_ids, seeds, rate) * weight)
  (l0, g0), (l1, g1) = (jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v) for f in (theirs, ours))
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  for a, b in zip(g0, g1):
    np.testing.assert_allclose(b, a, atol=1e-5 * float(jnp.max(jnp.abs(a))))


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_several_query_blocks_equal_the_explicit_path(rate):
  """384 tokens: three blocks of 128 queries, so the bits' query offset and the keys' and values'
  gradients summed over blocks are exercised (packing and padding too)."""
  r = np.random.default_rng(5)
  length, n = 384, 2
  q, k, v = (jnp.asarray(r.normal(size=(2, length, n, 16)), jnp.float32) for _ in range(3))
  input_mask = np.ones((2, length), np.int32)
  input_mask[1, 300:] = 0
  example_ids = np.zeros((2, length), np.int32)
  example_ids[0, 150:] = 1
  mask = splash.segment_mask("flash_interpret", jnp.asarray(input_mask), jnp.asarray(example_ids))
  weight = jnp.asarray(r.normal(size=(2, length, n, 16)) * input_mask[:, :, None, None], jnp.float32)
  key = jax.random.key(11)
  assert flash_dropout.block_q(length) == 128
  ours = lambda q, k, v: jnp.sum(flash_dropout.attention(q, k, v, mask, key, rate) * weight)
  theirs = lambda q, k, v: jnp.sum(
      flash_dropout.reference(q, k, v, mask.segment_ids, flash_dropout.seeds(key, 2, n), rate) * weight)
  (l0, g0), (l1, g1) = (jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v) for f in (theirs, ours))
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
  for a, b in zip(g0, g1):
    np.testing.assert_allclose(b, a, atol=1e-5 * float(jnp.max(jnp.abs(a))))


def test_reference_without_dropout_is_softmax_attention_within_segments():
  """The oracle above is itself right: without dropout it is jax.nn.dot_product_attention under the
  encoder's own mask (padding and packing)."""
  q, k, v, mask, weight = _inputs()
  input_mask = (mask.segment_ids > 0).astype(jnp.int32)
  dense = encoder.attention_mask(input_mask, jnp.maximum(mask.segment_ids - 1, 0))
  real = np.asarray(input_mask, bool)
  ours = flash_dropout.reference(q, k, v, mask.segment_ids, None, 0.0)
  np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(jax.nn.dot_product_attention(q, k, v, mask=dense))[real],
                             atol=2e-6)


@pytest.mark.slow
def test_bfloat16_inputs_within_rounding():
  q, k, v, mask, weight = _inputs(1, jnp.bfloat16)
  key = jax.random.key(4)
  seeds = flash_dropout.seeds(key, B, N)
  f = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * weight)
  ours = f(lambda q, k, v: flash_dropout.attention(q, k, v, mask, key, 0.1))
  theirs = f(lambda q, k, v: flash_dropout.reference(q, k, v, mask.segment_ids, seeds, 0.1))
  (l0, g0), (l1, g1) = (jax.value_and_grad(fn, argnums=(0, 1, 2))(q, k, v) for fn in (theirs, ours))
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-2)
  for a, b in zip(g0, g1):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.abs(a - b).max() <= 2e-2 * np.abs(a).max()


def test_dropout_bits_are_a_coin_at_the_rate_per_example_and_head():
  keep = np.asarray(flash_dropout.keep_mask(flash_dropout.seeds(jax.random.key(0), 4, 4), 128, 0.1))
  assert keep.shape == (4, 4, 128, 128)
  assert abs(keep.mean() - 0.9) < 0.005                 # 262,144 draws: 5 standard deviations is 0.003
  per_head = keep.reshape(16, -1)
  assert np.all(np.abs(per_head.mean(1) - 0.9) < 0.01)
  # Independent between heads, rows and a row's neighbours: agreement of two fair 0.9 coins is 0.82.
  assert abs((per_head[0] == per_head[1]).mean() - 0.82) < 0.01
  assert abs((keep[..., 1:] == keep[..., :-1]).mean() - 0.82) < 0.005
  assert abs((keep[:, :, 1:] == keep[:, :, :-1]).mean() - 0.82) < 0.005
  assert abs((keep[..., :64] == keep[..., 64:]).mean() - 0.82) < 0.005     # one hash's two halves
  again = np.asarray(flash_dropout.keep_mask(flash_dropout.seeds(jax.random.key(0), 4, 4), 128, 0.1))
  other = np.asarray(flash_dropout.keep_mask(flash_dropout.seeds(jax.random.key(1), 4, 4), 128, 0.1))
  assert (again == keep).all() and (other != keep).mean() > 0.1
  assert np.asarray(flash_dropout.keep_mask(flash_dropout.seeds(jax.random.key(0), 1, 1), 64, 0.5)).mean() == \
      pytest.approx(0.5, abs=0.03)


@pytest.mark.slow
def test_dropout_is_applied_and_rescaled():
  """With dropout the output differs from without, and on average (over keys) it is the same."""
  q, k, v, mask, _ = _inputs()
  plain = flash_dropout.attention(q, k, v, mask)
  outs = np.stack([np.asarray(flash_dropout.attention(q, k, v, mask, jax.random.key(i), 0.5)) for i in range(24)])
  assert np.abs(outs[0] - np.asarray(plain)).max() > 0.1
  real = np.asarray(mask.segment_ids > 0)
  err = np.abs(outs.mean(0) - np.asarray(plain))[real]
  assert np.median(err) < 0.5 * np.median(np.abs(outs[0] - np.asarray(plain))[real])


def _config(**overrides):
  fields = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)
  return BertConfig(**{**fields, **overrides})


@pytest.mark.parametrize("scan_layers", [pytest.param(False, marks=pytest.mark.exhaustive), True])
@pytest.mark.slow
def test_encoder_flash_equals_xla_without_dropout_and_its_reference_with(scan_layers):
  """An encoder with "flash_interpret" gives XLA's hidden states and gradients without dropout; with
  dropout, those of "flash" on this CPU (the reference ops with the same bits). The unrolled layers are
  `exhaustive`: the slow run's `test_flash_kernel_keeps_the_steps_loss` compares them in a whole step."""
  _, _, _, mask, _ = _inputs()
  input_mask = (mask.segment_ids > 0).astype(jnp.int32)
  example_ids = jnp.maximum(mask.segment_ids - 1, 0)
  ids = jnp.asarray(np.random.default_rng(1).integers(0, 64, (B, L)))
  w = jnp.asarray(np.random.default_rng(2).normal(size=(B, L, 32)) * input_mask[..., None], jnp.float32)
  model = lambda kernel, rate: encoder.BertEncoder(_config(scan_layers=scan_layers, attention_kernel=kernel,
                                                           attention_dropout=rate))
  params = model("xla", 0.0).init(jax.random.PRNGKey(0), ids, input_mask=input_mask, example_ids=example_ids)

  def loss(params, kernel, rate):
    out = model(kernel, rate).apply(params, ids, input_mask=input_mask, example_ids=example_ids,
                                    deterministic=rate == 0.0, rngs={"dropout": jax.random.key(5)})
    return jnp.sum(out["sequence_output"] * w)

  for rate, (a, b) in ((0.0, ("xla", "flash_interpret")), (0.2, ("flash", "flash_interpret"))):
    (l0, g0), (l1, g1) = (jax.value_and_grad(loss)(params, kernel, rate) for kernel in (a, b))
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    for x, y in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
      np.testing.assert_allclose(y, x, atol=2e-4, rtol=1e-4)
  dropped = jax.value_and_grad(loss)(params, "flash", 0.2)[0]
  assert abs(float(dropped) - float(loss(params, "xla", 0.0))) > 1e-3


def test_sharded_over_batch_and_heads():
  """Under a data x tensor mesh the kernel runs per shard with each shard's seeds: the result and the
  dropout bits equal the unsharded ones."""
  q, k, v, mask, _ = _inputs()
  q, k, v = (jnp.tile(x, (2, 1, 4 // N + 1, 1))[:, :, :4] for x in (q, k, v))     # 4 rows, 4 heads
  mask = mask.replace(segment_ids=jnp.tile(mask.segment_ids, (2, 1)))
  key = jax.random.key(9)
  f = lambda q, k, v: flash_dropout.attention(q, k, v, mask, key, 0.2)
  alone = f(q, k, v)
  mc = common.mesh_config()
  mc.data, mc.fsdp, mc.tensor = 4, 1, 2
  mesh = sharding.create_mesh(mc, jax.devices()[:8])
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(common.pretrain_config())):
    sharded = jax.jit(f)(q, k, v)
    text = jax.jit(f).lower(q, k, v).as_text()
  assert "shard_map" in text or "sdy.manual_computation" in text
  np.testing.assert_allclose(np.asarray(sharded), np.asarray(alone), atol=1e-6)


@pytest.mark.parametrize("device_kind,matmul,bits", [("", "bfloat16", "hash"), ("TPU v3", "float32", "hash"),
                                                    ("TPU v5 lite", "bfloat16", "hardware")])
def test_lowers_for_tpu_as_a_mosaic_kernel(device_kind, matmul, bits):
  """"flash" lowers for TPU as Mosaic kernels (forward and backward), with either bits, choosing float32
  matmul operands for v3's Mosaic (tests/test_aot.py compiles them), and for the CPU without them."""
  q, k, v, mask, weight = _inputs(0, jnp.bfloat16)
  mask = mask.replace(interpret=False)
  f = jax.jit(jax.value_and_grad(
      lambda q: jnp.sum(flash_dropout.attention(q, k, v, mask, jax.random.key(0), 0.1, bits) * weight)))
  with flash_dropout.compiling_for(device_kind):
    assert flash_dropout.matmul_dtype(jnp.bfloat16) == jnp.dtype(matmul)
    tpu = jax.export.export(f, platforms=["tpu"])(q).mlir_module()
  assert tpu.count("tpu_custom_call") >= 2
  assert "tpu_custom_call" not in jax.export.export(f, platforms=["cpu"])(q).mlir_module()


def test_hardware_bits_are_the_tpus_alone_the_interpreter_keeps_the_hash():
  q, k, v, mask, weight = _inputs()
  key = jax.random.key(3)
  ours = flash_dropout.attention(q, k, v, mask, key, 0.3, "hardware")   # interpreted: the hash's bits
  theirs = flash_dropout.reference(q, k, v, mask.segment_ids, flash_dropout.seeds(key, B, N), 0.3)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  assert BertConfig(attention_kernel="flash", flash_bits="hardware").flash_bits == "hardware"
  with pytest.raises(ValueError, match="flash_bits 'philox'"):
    BertConfig(flash_bits="philox")


def test_what_it_does_not_take_fails_clearly():
  with pytest.raises(ValueError, match="segment ids only"):
    BertConfig(attention_kernel="flash", causal=True)
  with pytest.raises(ValueError, match="segment ids only"):
    BertConfig(attention_kernel="flash", local_attention=64, global_attn_every_n_layers=3)
  with pytest.raises(ValueError, match="sequences up to 2048"):
    flash_dropout.block_q(4096)
  with pytest.raises(ValueError, match="above 1,024 tokens in blocks of 128"):
    flash_dropout.block_q(1100)
  assert [flash_dropout.block_q(n) for n in (32, 128, 512, 1024, 2048)] == [32, 128, 512, 512, 128]
  with pytest.raises(ValueError, match="even sequence lengths"):
    flash_dropout.keep_mask(jnp.zeros((1, 1, 2), jnp.int32), 33, 0.1)


def test_config_with_a_length_the_kernel_cannot_take_stops_before_compiling():
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from configs import bert_base  # pylint: disable=g-import-not-at-top
  c = bert_base.get_config("phase2")
  c.model.attention_kernel = "flash"
  train.validate(c, num_devices=32)   # its v3:4x4's cores: the mesh shards fsdp 32 ways
  c.data.seq_length, c.model.max_position_embeddings = 1100, 2048
  with pytest.raises(Exception, match="blocks of 128.*model.attention_kernel"):
    train.validate(c, num_devices=32)
