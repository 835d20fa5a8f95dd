"""The word-embedding lookup on each device's shard: jnp.take's values and gradients, no full-size table."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import embedding_lookup
from configs import common

V, E, B, L = 64, 32, 16, 8
RULES = tuple(tuple(rule) for rule in common.LOGICAL_AXIS_RULES)


def _mesh(shape):
  return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape), ("data", "fsdp", "tensor"))


def _inputs():
  table = jax.random.normal(jax.random.key(0), (V, E))
  ids = jax.random.randint(jax.random.key(1), (B, L), 0, V)
  weights = jax.random.normal(jax.random.key(2), (B, L, E))
  return table, ids, weights


def _value_and_grad(table, ids, weights, dtype=jnp.float32):
  return jax.value_and_grad(lambda t: jnp.sum(embedding_lookup.lookup(t, ids, dtype).astype(jnp.float32)
                                              * weights))(table)


def _sharded(shape, dtype=jnp.float32):
  """(value, table gradient, compiled HLO) of the lookup on `shape`'s mesh, under the configs' rules."""
  mesh = _mesh(shape)
  table, ids, weights = _inputs()
  table = jax.device_put(table, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("tensor", "fsdp")))
  ids = jax.device_put(ids, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"))))

  @jax.jit
  def step(table, ids):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(RULES):
      return _value_and_grad(table, ids, weights, dtype)
  value, grad = step(table, ids)
  return value, grad, step.lower(table, ids).compile().as_text()


def _table_sized_ops(hlo: str) -> list[str]:
  """The table-sized scatters, gathers and collectives of a compiled step (XLA's path makes them)."""
  return [line for line in hlo.splitlines()
          if re.search(rf"\[{V},{E}\]", line) and re.search(r"scatter|all-reduce|all-gather|reduce-scatter", line)]


@pytest.mark.parametrize("shape", [(2, 4, 1), (1, 4, 2), (1, 2, 4), (1, 8, 1)])
def test_sharded_lookup_is_takes_value_and_gradient_with_no_table_sized_op(shape):
  table, ids, weights = _inputs()
  reference_value, reference_grad = _value_and_grad(table, ids, weights)   # no mesh: jnp.take
  value, grad, hlo = _sharded(shape)
  assert embedding_lookup._plan((V, E), (B, L), _mesh(shape).abstract_mesh, RULES) is not None
  np.testing.assert_allclose(value, reference_value, rtol=1e-5)
  np.testing.assert_allclose(grad, reference_grad, rtol=1e-5, atol=1e-6)
  assert not _table_sized_ops(hlo)


def test_a_data_parallel_mesh_keeps_take_and_its_table_sized_gradient():
  # No fsdp split of the table: the lookup is jnp.take, whose gradient is reduced over the data axis whole.
  assert embedding_lookup._plan((V, E), (B, L), _mesh((8, 1, 1)).abstract_mesh, RULES) is None
  table, ids, weights = _inputs()
  value, grad, hlo = _sharded((8, 1, 1))
  np.testing.assert_allclose(grad, _value_and_grad(table, ids, weights)[1], rtol=1e-5, atol=1e-6)
  assert _table_sized_ops(hlo)


def test_ids_split_over_the_vocabularys_axis_too_keep_take():
  # The psum over the vocabulary's slices would add up different tokens' rows.
  rules = tuple((n, ("data", "fsdp", "tensor") if n == "activation_batch" else a) for n, a in RULES)
  assert embedding_lookup._plan((V, E), (B, L), _mesh((2, 2, 2)).abstract_mesh, rules) is None


def test_bfloat16_rows_are_the_cast_tables_rows_and_the_gradient_stays_float32():
  table, ids, weights = _inputs()
  value, grad, _ = _sharded((2, 4, 1), jnp.bfloat16)
  rows = jnp.take(table.astype(jnp.bfloat16), ids, axis=0).astype(jnp.float32)
  np.testing.assert_allclose(value, jnp.sum(rows * weights), rtol=1e-5)
  assert grad.dtype == jnp.float32


def test_layouts_it_does_not_cover_fall_back_to_take():
  mesh = _mesh((1, 8, 1)).abstract_mesh
  assert embedding_lookup._plan((V, 12), (B, L), mesh, RULES) is None            # the width does not divide
  embed_on_tensor = tuple((k, "tensor" if k == "embed" else v) for k, v in RULES)
  assert embedding_lookup._plan((V, E), (B, L), mesh, embed_on_tensor) is None   # columns not on a batch axis
  assert embedding_lookup._plan((V, E), (1, L), mesh, RULES) is None   # a batch the mesh does not divide (init)


@pytest.mark.parametrize("mesh_shape", [(2, 4, 1), (1, 4, 2)])
@pytest.mark.slow
def test_train_steps_with_the_lookup_on_shards_keep_the_losses(mesh_shape):
  """Two train steps (dropout on; the second after an update) of the model with `embedding_lookup_on_shards`
  against the same model's jnp.take on one device: the same losses (2e-5, as test_mesh's meshes)."""
  from bert_jax import sharding, train_setup
  from test_mesh import _config, _losses

  losses = {}
  for on_shards, devices in ((False, jax.devices()[:1]), (True, None)):
    config = _config(*((1, 1, 1) if devices else mesh_shape))
    config.model.embedding_lookup_on_shards = on_shards
    s = train_setup.setup(config, sharding.create_mesh(config.mesh, devices=devices))
    losses[on_shards] = _losses(config, s)
    if on_shards:   # the step's compiled HLO has the lookup's all-to-all and no table-sized scatter
      hlo = s.train_step.lower(s.abstract_state, train_setup.abstract_batch(config),
                               jax.eval_shape(lambda: train_setup.rngs(config)[1])).compile().as_text()
      vocab, width = config.model.vocab_size, config.model.hidden_size
      assert "all-to-all" in hlo and not re.search(rf"\[{vocab},{width}\]\S* scatter\(", hlo)
  np.testing.assert_allclose(losses[True], losses[False], rtol=2e-5)
