"""Mesh construction, logical rules and global batches on the 8 fake CPU devices."""

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bert_jax import sharding
from configs import common


def _mesh_config(**axes):
  m = common.mesh_config()
  m.update(axes)
  return m


@pytest.mark.parametrize("axes, shape", [
    ({}, (8, 1, 1)),
    ({"fsdp": 4}, (2, 4, 1)),
    ({"data": 2, "fsdp": 2, "tensor": 2}, (2, 2, 2)),
    ({"data": 1, "fsdp": -1}, (1, 8, 1)),
    ({"data": 2, "dcn_data": 2, "tensor": 2}, (4, 1, 2)),
])
def test_create_mesh_fills_minus_one(axes, shape):
  mesh = sharding.create_mesh(_mesh_config(**axes))
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert tuple(mesh.shape.values()) == shape
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


@pytest.mark.parametrize("axes, message", [
    ({"data": 3}, "needs 3 devices"),
    ({"fsdp": 3}, "does not divide"),
    ({"data": -1, "fsdp": -1}, "at most one"),
    ({"dcn_data": 3}, "slices"),
])
def test_mesh_that_does_not_match_the_devices_is_rejected(axes, message):
  with pytest.raises(ValueError, match=message):
    sharding.create_mesh(_mesh_config(**axes))


def test_create_mesh_on_a_subset_of_devices():
  mesh = sharding.create_mesh(_mesh_config(), devices=jax.devices()[:1])
  assert mesh.devices.size == 1


def test_logical_rules_map_parameters_and_activations():
  rules = sharding.logical_rules(common.pretrain_config())
  mesh = sharding.create_mesh(_mesh_config(data=2, fsdp=2, tensor=2))
  specs = {"word": P("vocab", "embed"), "mlp": P("embed", "mlp"), "act": P("activation_batch", None)}
  out = sharding.logical_to_shardings(specs, mesh, rules)
  assert out["word"].spec == P("tensor", "fsdp")
  assert out["mlp"].spec == P("fsdp", "tensor")
  assert out["act"].spec == P(("data", "fsdp"), None)
  assert nn.logical_to_mesh_axes(("layers", "kv"), rules) == P(None, None)


def test_global_batch_is_sharded_over_data_and_fsdp():
  mesh = sharding.create_mesh(_mesh_config(data=2, fsdp=2, tensor=2))
  host = {"input_ids": np.arange(8 * 3, dtype=np.int32).reshape(8, 3), "labels": np.arange(8, dtype=np.int32)}
  batch = sharding.global_batch(host, mesh)
  assert sharding.data_parallel_size(mesh) == 4
  assert batch["input_ids"].shape == (8, 3)
  np.testing.assert_array_equal(batch["input_ids"], host["input_ids"])
  # 4 batch shards of 2 rows, each replicated over the 2-way tensor axis.
  shard_rows = {tuple(np.asarray(s.data)[:, 0]) for s in batch["input_ids"].addressable_shards}
  assert shard_rows == {(0, 3), (6, 9), (12, 15), (18, 21)}
  assert batch["labels"].sharding.spec == P(("data", "fsdp"))
