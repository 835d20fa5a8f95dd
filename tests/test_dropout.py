"""Dropout's bits (models/dropout.py): threefry is flax's nn.Dropout; the counter hash keeps 1 - rate, is
fixed by the key and is the same on any sharding."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.models import dropout
from bert_jax.models import encoder as model


class _One(nn.Module):
  kind: str   # "flax" or the bits of ours
  rate: float = 0.1

  @nn.compact
  def __call__(self, x):
    layer = nn.Dropout(self.rate) if self.kind == "flax" else dropout.Dropout(self.rate, bits=self.kind)
    return layer(x, deterministic=False)


def _apply(kind, x, seed=0):
  return _One(kind).apply({}, x, rngs={"dropout": jax.random.key(seed)})


def test_threefry_bits_are_flaxs_dropout():
  x = jnp.arange(1, 64 * 48 + 1, dtype=jnp.float32).reshape(64, 48)
  np.testing.assert_array_equal(_apply("threefry", x), _apply("flax", x))


def test_hash_bits_keep_one_minus_rate_and_follow_the_key():
  x = jnp.ones((8, 64, 128), jnp.float32)
  out = _apply("hash", x)
  kept = np.asarray(out != 0)
  assert abs(kept.mean() - 0.9) < 0.005                       # 65,536 draws: 5 standard deviations is 0.006
  np.testing.assert_allclose(np.asarray(out)[kept], 1 / 0.9, rtol=1e-6)
  # Not a pattern along any axis: rows and columns keep about the same share.
  assert abs(kept.mean(axis=(0, 1)) - 0.9).max() < 0.1 and abs(kept.mean(axis=(0, 2)) - 0.9).max() < 0.1
  np.testing.assert_array_equal(out, _apply("hash", x))       # the same key, the same bits
  assert (np.asarray(_apply("hash", x, seed=1) != 0) != kept).mean() > 0.1
  assert (np.asarray(_apply("threefry", x) != 0) != kept).mean() > 0.1
  half = _apply("hash", x.astype(jnp.bfloat16))
  assert half.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(half != 0), kept)   # the bits do not depend on the dtype


def test_hash_bits_refuse_more_elements_than_their_index_counts():
  with pytest.raises(ValueError, match="more than 2"):
    jax.eval_shape(lambda k: dropout.keep_mask(k, 0.1, (2048, 16, 512, 512), "hash"), jax.random.key(0))
  jax.eval_shape(lambda k: dropout.keep_mask(k, 0.1, (1024, 16, 512, 512), "hash"), jax.random.key(0))   # 2^32


def test_rate_one_drops_everything_with_a_zero_gradient():
  x = jnp.ones((4, 8), jnp.float32)
  for kind in ("flax", "hash"):
    out, grad = jax.value_and_grad(lambda x, kind=kind: jnp.sum(
        _One(kind, rate=1.0).apply({}, x, rngs={"dropout": jax.random.key(0)})))(x)
    assert float(out) == 0.0 and not np.isnan(np.asarray(grad)).any(), kind


def test_element_index_is_row_major():
  shape = (3, 5, 7)
  np.testing.assert_array_equal(dropout.element_index(shape), np.arange(105).reshape(shape))


def test_hash_bits_are_the_same_on_any_sharding():
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
  key, shape = jax.random.key(5), (16, 4, 32, 32)
  whole = jax.jit(lambda k: dropout.keep_mask(k, 0.1, shape, "hash"))(key)
  for spec in (P("a", "b"), P(None, None, "b", "a"), P(("a", "b"))):
    sharded = jax.jit(lambda k: dropout.keep_mask(k, 0.1, shape, "hash"),
                      out_shardings=NamedSharding(mesh, spec))(key)
    np.testing.assert_array_equal(sharded, whole, err_msg=str(spec))


@pytest.mark.slow
def test_the_encoder_draws_the_configured_bits():
  cfg = model.BertConfig.from_preset("tiny")
  ids = jnp.asarray(np.random.default_rng(0).integers(5, cfg.vocab_size, (2, 16)))
  ones, zeros = jnp.ones((2, 16), jnp.int32), jnp.zeros((2, 16), jnp.int32)
  outs = {}
  for bits in dropout.DROPOUT_BITS:
    m = model.BertEncoder(dataclasses.replace(cfg, dropout_bits=bits))
    params = m.init(jax.random.key(0), ids, ones, zeros)["params"]
    run = lambda d, m=m, params=params: m.apply({"params": params}, ids, ones, zeros, deterministic=d,
                                                 rngs={"dropout": jax.random.key(3)})["sequence_output"]
    outs[bits] = (run(True), run(False))
  np.testing.assert_array_equal(outs["hash"][0], outs["threefry"][0])   # no dropout: the same model
  assert not np.allclose(outs["hash"][1], outs["threefry"][1])
  with pytest.raises(ValueError, match="dropout_bits 'philox'"):
    model.BertConfig(dropout_bits="philox")
