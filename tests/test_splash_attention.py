"""The splash attention kernel (models/splash.py), run by Pallas' interpreter on the CPU: it computes what
the dense-mask path computes, with packing, padding, sliding windows and causality, forward and backward,
inside the encoder (scanned or not) and sharded over a mesh; it lowers for TPU as a Mosaic kernel."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import sharding
from bert_jax.models import encoder, splash
from bert_jax.models.config import BertConfig
from configs import common

B, L, N, K = 2, 256, 2, 64


def _inputs(seed=0):
  r = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(r.normal(size=(B, L, N, K)), jnp.float32) for _ in range(3))
  input_mask = np.ones((B, L), np.int32)
  input_mask[1, 200:] = 0                    # padding
  example_ids = np.zeros((B, L), np.int32)
  example_ids[0, 100:] = 1                   # two packed examples
  return q, k, v, jnp.asarray(input_mask), jnp.asarray(example_ids)


@pytest.mark.parametrize("window,causal", [(None, False), (32, False), (None, True), (32, True)])
@pytest.mark.slow
def test_kernel_equals_dense_mask(window, causal):
  q, k, v, input_mask, example_ids = _inputs()
  mask = splash.segment_mask("splash_interpret", input_mask, example_ids, window, causal).replace(
      local=window is not None)
  dense = encoder.attention_mask(input_mask, example_ids, causal, window)
  real = np.asarray(input_mask, bool)
  weight = input_mask[:, :, None, None].astype(jnp.float32)
  ours = lambda q, k, v: splash.attention(q, k, v, mask)
  theirs = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=dense)
  np.testing.assert_allclose(np.asarray(ours(q, k, v))[real], np.asarray(theirs(q, k, v))[real], atol=2e-6)
  grads = [jax.grad(lambda *a, f=f: (f(*a) * weight).sum(), argnums=(0, 1, 2))(q, k, v) for f in (ours, theirs)]
  for a, b in zip(*grads):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_window_changes_the_output():
  """The window is applied: a 32-token window differs from global attention (the test above could not
  tell if both paths ignored it)."""
  q, k, v, input_mask, example_ids = _inputs()
  full = splash.segment_mask("splash_interpret", input_mask, example_ids, 32)
  local = splash.attention(q, k, v, full.replace(local=True))
  glob = splash.attention(q, k, v, full.replace(local=False))
  assert float(jnp.abs(local - glob).max()) > 0.1


def _modernbert(**overrides):
  fields = dict(vocab_size=64, hidden_size=128, num_layers=3, num_heads=2, intermediate_size=96,
                max_position_embeddings=512, rope_theta=160000.0, local_rope_theta=10000.0, geglu=True,
                pre_norm=True, final_norm=True, norm_bias=False, dense_bias=False, global_attn_every_n_layers=3,
                local_attention=64, hidden_dropout=0.0, attention_dropout=0.0, type_vocab_size=0)
  return BertConfig(**{**fields, **overrides})


@pytest.mark.parametrize("scan_layers,kernel", [(False, "splash_interpret"), (True, "splash_interpret"),
                                               (True, "splash")])
@pytest.mark.slow
def test_encoder_splash_equals_xla(scan_layers, kernel):
  """A ModernBERT-style encoder (one global layer, two with a 64-token window, packed and padded) gives
  the same hidden states and parameter gradients with either kernel ("splash" on this CPU: XLA's attention
  under the kernel's mask, `lax.platform_dependent`)."""
  _, _, _, input_mask, example_ids = _inputs()
  ids = jnp.asarray(np.random.default_rng(1).integers(0, 64, (B, L)))
  model = lambda kernel: encoder.BertEncoder(_modernbert(scan_layers=scan_layers, attention_kernel=kernel))
  params = model("xla").init(jax.random.PRNGKey(0), ids, input_mask=input_mask, example_ids=example_ids)
  real = np.asarray(input_mask, bool)

  def loss(params, kernel):
    out = model(kernel).apply(params, ids, input_mask=input_mask, example_ids=example_ids)["sequence_output"]
    return (out * input_mask[..., None]).sum(), out

  (_, xla), g_xla = jax.value_and_grad(loss, has_aux=True)(params, "xla")
  (_, ours), g_ours = jax.value_and_grad(loss, has_aux=True)(params, kernel)
  np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(xla)[real], atol=1e-5)
  for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_xla)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_sharded_over_batch_and_heads():
  """Under a data x tensor mesh the kernel runs per shard (shard_map): rows over `data`, heads over
  `tensor`, as the logical axis rules say; the result equals the unsharded one."""
  _, _, _, input_mask, example_ids = _inputs()
  ids = jnp.asarray(np.random.default_rng(2).integers(0, 64, (B * 2, L)))
  input_mask, example_ids = jnp.tile(input_mask, (2, 1)), jnp.tile(example_ids, (2, 1))
  cfg = _modernbert(attention_kernel="splash_interpret")
  model = encoder.BertEncoder(cfg)
  params = model.init(jax.random.PRNGKey(0), ids, input_mask=input_mask, example_ids=example_ids)
  apply = lambda p, i, m, e: model.apply(p, i, input_mask=m, example_ids=e)["sequence_output"]
  alone = apply(params, ids, input_mask, example_ids)
  mc = common.mesh_config()
  mc.data, mc.fsdp, mc.tensor = 4, 1, 2
  mesh = sharding.create_mesh(mc, jax.devices()[:8])
  config = common.pretrain_config()
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.logical_rules(config)):
    sharded = jax.jit(apply)(params, ids, input_mask, example_ids)
    text = jax.jit(apply).lower(params, ids, input_mask, example_ids).as_text()
  assert "shard_map" in text or "sdy.manual_computation" in text
  real = np.asarray(input_mask, bool)
  np.testing.assert_allclose(np.asarray(sharded)[real], np.asarray(alone)[real], atol=1e-5)


def test_lowers_for_tpu_as_a_mosaic_kernel():
  """"splash" lowers for TPU from this CPU as the Mosaic kernel (what `bert-jax aot` compiles), and for
  the CPU without it."""
  q, k, v, input_mask, example_ids = _inputs()
  mask = splash.segment_mask("splash", input_mask, example_ids, 32).replace(local=True)
  f = jax.jit(lambda q, k, v: splash.attention(q, k, v, mask))
  assert "tpu_custom_call" in jax.export.export(f, platforms=["tpu"])(q, k, v).mlir_module()
  assert "tpu_custom_call" not in jax.export.export(f, platforms=["cpu"])(q, k, v).mlir_module()


def test_bad_lengths_and_names_fail_clearly():
  q, k, v, input_mask, example_ids = _inputs()
  short = splash.segment_mask("splash_interpret", input_mask[:, :100], example_ids[:, :100])
  with pytest.raises(ValueError, match="multiple of 128.*attention_kernel 'xla'"):
    splash.attention(q[:, :100], k[:, :100], v[:, :100], short)
  with pytest.raises(ValueError, match="attention_kernel 'flashy'"):
    BertConfig(attention_kernel="flashy")


def test_config_with_untileable_length_stops_before_compiling():
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from configs import modernbert_base  # pylint: disable=g-import-not-at-top
  c = modernbert_base.get_config()
  assert c.model.attention_kernel == "splash"
  c.data.seq_length, c.data.max_predictions_per_seq = 200, 60
  with pytest.raises(Exception, match="attention_kernel 'splash'.*seq_length 200"):
    train.validate(c, num_devices=8)
