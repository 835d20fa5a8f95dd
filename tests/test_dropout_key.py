"""The "hash" dropout key (models/dropout_key.py): distinct keys, threefry's statistics, the same bits on
every mesh, and fewer ops than threefry for a dropout's key."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_jax import train_setup
from bert_jax.models import dropout
from bert_jax.models import dropout_key
from configs import tiny


def key(seed=0):
  return jax.random.key(seed, impl=dropout_key.IMPL)


def words(keys):
  return [tuple(k) for k in np.asarray(jax.random.key_data(keys)).reshape(-1, 2).tolist()]


def test_folds_and_splits_give_distinct_keys():
  k = key()
  folded = words(jax.vmap(lambda i: jax.random.fold_in(k, i))(jnp.arange(4096)))
  split = words(jax.random.split(k, 4096))
  seeds = words(jax.vmap(key)(jnp.arange(4096)))
  assert len(set(folded)) == len(set(split)) == len(set(seeds)) == 4096
  assert not set(folded) & set(split) and not set(folded) & set(seeds)
  # Deterministic, and folding in one value after another is not folding them the other way round.
  assert words(jax.random.fold_in(k, 7)) == words(jax.random.fold_in(key(), 7))
  ab, ba = (jax.random.fold_in(jax.random.fold_in(k, a), b) for a, b in ((1, 2), (2, 1)))
  assert words(ab) != words(ba)
  assert jax.random.key_data(jax.random.split(k, (2, 3))).shape == (2, 3, 2)


def test_bits_have_threefrys_statistics():
  """Uniform floats, Bernoulli masks and their correlations between neighbours and between keys folded
  apart, against threefry's within a few standard errors."""
  n = 1 << 20
  for k in (key(), jax.random.key(0)):
    u = np.asarray(jax.random.uniform(jax.random.fold_in(k, 1), (n,)))
    assert abs(u.mean() - 0.5) < 0.002 and abs(u.var() - 1 / 12) < 0.001
    assert np.histogram(u, bins=16, range=(0, 1))[0].min() > n / 16 * 0.98
    masks = [np.asarray(jax.random.bernoulli(jax.random.fold_in(k, i), 0.9, (n,))).astype(np.float32)
             for i in (2, 3)]
    assert abs(masks[0].mean() - 0.9) < 0.002
    centred = [m - m.mean() for m in masks]
    corr = lambda a, b: float((a * b).mean() / np.sqrt((a * a).mean() * (b * b).mean()))  # noqa: E731
    for lag in (1, 2, 128, 16384):
      assert abs(corr(centred[0][:-lag], centred[0][lag:])) < 0.005
    assert abs(corr(*centred)) < 0.005
  with pytest.raises(ValueError, match=r"more than 2\^32 elements"):   # their bits would repeat
    jax.jit(lambda k: jax.random.bits(k, (2 ** 16, 2 ** 16, 2), jnp.uint32)).lower(key())
  assert jax.random.bits(key(), (3,), jnp.uint8).dtype == jnp.uint8
  assert jax.random.bits(key(), (3,), jnp.uint16).dtype == jnp.uint16


def test_the_bits_are_the_same_on_every_mesh():
  mesh = jax.make_mesh((jax.device_count(),), ("x",))
  shape = (64, 128)
  plain = jax.random.bits(key(3), shape, jnp.uint32)
  sharded = jax.jit(lambda k: jax.random.bits(k, shape, jnp.uint32),
                    out_shardings=NamedSharding(mesh, P("x")))(key(3))
  np.testing.assert_array_equal(np.asarray(sharded), np.asarray(plain))


def test_a_dropouts_key_and_seeds_take_fewer_ops_than_threefrys():
  """What each dropout of the model computes for its mask's seeds: flax's fold of its path into the key and
  the seeds taken from it (`dropout.seeds_of`)."""
  def ops(k):
    text = jax.jit(lambda k: dropout.seeds_of(jax.random.fold_in(k, 12345))).lower(k).compile().as_text()
    return sum(" = " in line for line in text.splitlines())

  assert ops(key()) * 2 < ops(jax.random.key(0))


def test_the_run_config_names_it():
  config = tiny.get_config()
  config.dropout_rng = "hash"
  init_rng, dropout_rng = train_setup.rngs(config)
  assert str(jax.random.key_impl(dropout_rng)) == "hsh"
  assert words(dropout_rng) == words(train_setup.rngs(config)[1])
  keep = dropout.keep_mask(jax.random.fold_in(dropout_rng, 3), 0.1, (256, 256), "hash")
  assert 0.89 < float(keep.mean()) < 0.91
  with pytest.raises(ValueError, match="take one key"):
    dropout.seeds_of(jax.random.split(dropout_rng, 2))
