"""The MLM decoder and cross-entropy on each device's slice of the vocabulary: the plain sums and gradients,
argmax's first index, no gathered table; a model trained with it follows the same losses."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import tied_decoder, vocab_split
from bert_jax.objectives import base
from configs import common
from test_fsdp_gather import _trajectory
from test_mesh import _compiled_step, _mesh_setup

V, E, B, P = 76, 32, 8, 5     # 76 rows: 38 a tensor slice of 2, padded to 40 over 4 fsdp shards
RULES = tuple(tuple(rule) for rule in common.LOGICAL_AXIS_RULES)
P_ = jax.sharding.PartitionSpec


def _mesh(shape):
  return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape), ("data", "fsdp", "tensor"))


def _inputs(seed=0):
  k = jax.random.split(jax.random.key(seed), 5)
  x = jax.random.normal(k[0], (B, P, E))
  table = jax.random.normal(k[1], (V, E)) * 0.3
  bias = jax.random.normal(k[2], (V,)) * 0.1
  # Half the labels the argmax: the correct count then has both kinds of position.
  best = jnp.argmax(jnp.einsum("bpe,ve->bpv", x, table) + bias, axis=-1)
  labels = jnp.where(jnp.arange(P) % 2 == 0, best, jax.random.randint(k[3], (B, P), 0, V))
  weights = (jax.random.uniform(k[4], (B, P)) > 0.3).astype(jnp.float32)
  return x, table, bias, labels, weights


def _plain(x, table, bias, labels, weights, dtype):
  """(loss sum, correct sum): base.cross_entropy_sums on tied_logits, as the head without the split."""
  logits = tied_decoder.tied_logits(x.astype(dtype), table.astype(dtype), bias)
  return base.cross_entropy_sums(logits, labels, weights)


def _split(x, table, bias, labels, weights, dtype):
  nll, correct = vocab_split.masked_lm_sums(x.astype(dtype), table.astype(dtype), bias, labels)
  return jnp.sum(nll * weights), jnp.sum(correct * weights)


def _value_and_grads(fn, mesh_shape, inputs, dtype=jnp.float32):
  """((loss sum, correct sum), gradients of the loss sum as to x, table, bias) under `mesh_shape`'s mesh and
  the configs' rules, the arrays sharded as a train step shards them; and the compiled HLO."""
  mesh = _mesh(mesh_shape)
  x, table, bias, labels, weights = inputs
  put = lambda a, spec: jax.device_put(a, jax.sharding.NamedSharding(mesh, spec))   # noqa: E731
  args = (put(x, P_(("data", "fsdp"))), put(table, P_("tensor", "fsdp")), put(bias, P_("tensor")),
          put(labels, P_(("data", "fsdp"))), put(weights, P_(("data", "fsdp"))))

  @jax.jit
  def step(x, table, bias, labels, weights):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(RULES):
      loss = lambda x, t, b: fn(x, t, b, labels, weights, dtype)   # noqa: E731
      (loss_sum, correct), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, table, bias)
      return (loss_sum, correct), grads
  return step(*args), step.lower(*args).compile().as_text()


@pytest.mark.parametrize("shape", [(1, 4, 2), (2, 4, 1), (1, 2, 4), (1, 8, 1), (2, 2, 2)])
def test_the_split_sums_and_gradients_are_the_plain_ones(shape):
  inputs = _inputs()
  assert vocab_split._plan((V, E), (B, P, E), _mesh(shape).abstract_mesh, RULES) is not None
  (reference, reference_grads), _ = _value_and_grads(_plain, shape, inputs)
  (ours, grads), hlo = _value_and_grads(_split, shape, inputs)
  assert 0 < float(reference[1]) < float(jnp.sum(inputs[4]))    # some right, some wrong: the count is tested
  np.testing.assert_allclose(ours[0], reference[0], rtol=1e-5)
  assert float(ours[1]) == float(reference[1])
  for g, r in zip(grads, reference_grads):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
  # No device holds a tensor slice's rows of the table at full width: nothing of [V / tensor, E] is gathered,
  # only each fsdp slot's rows of every tensor slice (the same shape where fsdp == tensor).
  data, fsdp, tensor = shape
  rows, ours = V // tensor, tensor * -(-(V // tensor) // fsdp)
  if rows != ours:
    assert not re.findall(rf"\[{rows},{E}\]\S* all-gather", hlo)
  # The masked rows: each tensor slice gathers its share of the fsdp group's, not all of them.
  assert re.findall(rf"\[{B * P // (data * tensor)},{E}\]\S* all-gather", hlo)
  if tensor > 1 and B * P // data != ours:
    assert not re.findall(rf"\[{B * P // data},{E}\]\S* all-gather", hlo)


def test_rows_the_tensor_axis_does_not_divide_keep_the_whole_group_on_each_slice():
  # 4 x 5 rows on data 1 x fsdp 4 x tensor 2: 5 a device, which 2 tensor slices cannot split.
  x, table, bias, labels, weights = _inputs()
  inputs = (x[:4], table, bias, labels[:4], weights[:4])
  (reference, reference_grads), _ = _value_and_grads(_plain, (1, 4, 2), inputs)
  (ours, grads), hlo = _value_and_grads(_split, (1, 4, 2), inputs)
  np.testing.assert_allclose(ours[0], reference[0], rtol=1e-5)
  assert float(ours[1]) == float(reference[1]) > 0
  for g, r in zip(grads, reference_grads):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
  assert re.findall(rf"\[{4 * P},{E}\]\S* all-gather", hlo)    # the fsdp group's 20 rows on each slice


def test_argmax_takes_the_first_of_tied_maxima_across_slices():
  x, table, bias, labels, weights = _inputs(1)
  # Tokens 3 and 70 (in different tensor and fsdp slices) get the same, largest logit at every row.
  big = jnp.full((E,), 0.0).at[0].set(50.0)
  table = table.at[3].set(big).at[70].set(big)
  bias = bias.at[3].set(0.0).at[70].set(0.0)
  x = x.at[..., 0].set(1.0)
  for label, right in ((70, 0.0), (3, 1.0)):
    labels = jnp.full((B, P), label)
    ones = jnp.ones((B, P))
    (reference, _), _ = _value_and_grads(_plain, (1, 4, 2), (x, table, bias, labels, ones))
    (ours, _), _ = _value_and_grads(_split, (1, 4, 2), (x, table, bias, labels, ones))
    assert float(reference[1]) == float(ours[1]) == right * B * P


def test_bfloat16_compute_matches_the_plain_bfloat16_head():
  inputs = _inputs(2)
  (reference, reference_grads), _ = _value_and_grads(_plain, (1, 4, 2), inputs, jnp.bfloat16)
  (ours, grads), _ = _value_and_grads(_split, (1, 4, 2), inputs, jnp.bfloat16)
  np.testing.assert_allclose(ours[0], reference[0], rtol=1e-4)
  for g, r in zip(grads, reference_grads):
    np.testing.assert_allclose(g, r, rtol=2e-2, atol=2e-2 * float(jnp.max(jnp.abs(r))))


def test_layouts_it_does_not_cover_are_left_to_the_logits():
  mesh = _mesh((8, 1, 1)).abstract_mesh    # the table's columns not split over fsdp
  assert vocab_split._plan((V, E), (B, P, E), mesh, RULES) is None
  assert vocab_split._plan((V, E), (1, P, E), _mesh((1, 4, 2)).abstract_mesh, RULES) is None   # init's one row
  assert vocab_split._plan((V + 1, E), (B, P, E), _mesh((1, 4, 2)).abstract_mesh, RULES) is None
  x, table, bias, labels, _ = _inputs()
  assert vocab_split.masked_lm_sums(x, table, bias, labels) is None    # no mesh, no rules
  # The rows split over the tensor axis too: a psum over the vocabulary's slices would add up other rows.
  rows_on_tensor = tuple((n, ("data", "fsdp", "tensor") if n == "activation_batch" else a) for n, a in RULES)
  assert vocab_split._plan((V, E), (B, P, E), _mesh((2, 2, 2)).abstract_mesh, rows_on_tensor) is None


@pytest.mark.slow
def test_a_model_trained_with_the_split_decoder_follows_the_same_losses():
  plain, split = _mesh_setup(decoder_on_shards=False), _mesh_setup(decoder_on_shards=True)
  hlo = _compiled_step(*split).as_text()
  assert "mlm/shard_map" in hlo and not re.findall(r"\[128,32\]\S* all-gather", hlo)   # 256 / tensor rows
  reference = _trajectory(*plain)
  assert reference[2][0] != reference[0][0]
  np.testing.assert_allclose(_trajectory(*split), reference, rtol=1e-5)
