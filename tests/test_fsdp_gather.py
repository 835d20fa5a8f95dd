"""`model.reshard_after_forward=False`: each fsdp-sharded weight gathered once a step, the same losses."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import sharding, train_setup
from bert_jax.models import encoder, fsdp_gather
from test_mesh import _compiled_step, _config, random_batch

# _config's attention kernels (query, key, value [hidden, heads, head_dim] and out [heads, head_dim, hidden]),
# whole, as the matrices they multiply: [hidden, heads * head_dim] and [heads * head_dim, hidden] (the
# shape of the heads' [hidden, hidden] kernels too, hence the op names).
ATTENTION_KERNEL = "f32[32,32]"
ATTENTION = "/attention/"
FFN_KERNEL = "f32[32,64]"    # its intermediate kernel: [hidden, intermediate]


def _step(reshard_after_forward: bool, scan_layers: bool = False, constrain_attention_matrices: bool = True):
  config = _config(data=2, fsdp=4)
  config.model.scan_layers = scan_layers
  config.model.constrain_attention_matrices = constrain_attention_matrices
  # Under remat the layer's recomputation gathers its weights again unless the policy keeps them.
  config.model.remat_policy = "minimal"
  config.model.reshard_after_forward = reshard_after_forward
  return config, train_setup.setup(config, sharding.create_mesh(config.mesh))


def _trajectory(config, s, steps=3) -> list[tuple[float, float]]:
  """(loss, gradient norm) of each step, each after the previous steps' updates."""
  state, dropout_rng = s.init(jax.random.key(0)), jax.random.key(1)
  out = []
  for i in range(steps):
    state, metrics = s.train_step(state, sharding.global_batch(random_batch(config, seed=i), s.mesh), dropout_rng)
    out.append((float(metrics["loss"]), float(metrics["grad_norm"])))
  return out


def _all_gathers_of(compiled_text: str, shape: str, source: str = "") -> int:
  """The all-gathers of arrays of `shape` in the compiled text whose op name has `source` in it."""
  return len(re.findall(rf"= {re.escape(shape)}\S* all-gather(?:-start)?\(.*op_name=\"[^\"]*{re.escape(source)}",
                        compiled_text))


@pytest.mark.slow
def test_each_weight_is_gathered_once_and_the_losses_stay():
  resharded, once = _step(True), _step(False)
  # Query, key, value and out: gathered in the forward pass and again in the backward pass's recomputation,
  # or once.
  assert _all_gathers_of(_compiled_step(*resharded).as_text(), ATTENTION_KERNEL, ATTENTION) == 8
  assert _all_gathers_of(_compiled_step(*once).as_text(), ATTENTION_KERNEL, ATTENTION) == 4
  # The same weights multiply either way and the gradients reach the parameters' shards alike: the gradient
  # norms agree, and so do the losses after two updates (a gradient scaled or sharded wrong moves both).
  reference = _trajectory(*resharded)
  assert reference[2][0] != reference[0][0] and reference[1][1] != reference[0][1]
  np.testing.assert_allclose(_trajectory(*once), reference, rtol=1e-6)


@pytest.mark.slow
def test_the_attention_matrices_left_to_the_partitioner_train_the_same():
  """`model.constrain_attention_matrices` False (XLA gathers and reshapes the attention kernels as it
  chooses) changes where the bytes go, not the step: the same losses and gradient norms."""
  constrained, free = _step(True), _step(True, constrain_attention_matrices=False)
  assert free[0].model.constrain_attention_matrices is False
  reference = _trajectory(*constrained)
  assert reference[2][0] != reference[0][0]
  np.testing.assert_allclose(_trajectory(*free), reference, rtol=1e-6)


@pytest.mark.slow
def test_scanned_layers_gather_the_attention_kernels_once_and_the_losses_stay():
  resharded, once = _step(True, scan_layers=True), _step(False, scan_layers=True)
  resharded_text, once_text = _compiled_step(*resharded).as_text(), _compiled_step(*once).as_text()
  # In the loop body (one op in the text for every layer): the attention kernels gathered once, or in the
  # forward pass and again in the recomputation; the feed-forward kernels in both passes either way.
  assert _all_gathers_of(once_text, ATTENTION_KERNEL, ATTENTION) == 4 and _all_gathers_of(resharded_text, ATTENTION_KERNEL, ATTENTION) == 8
  assert _all_gathers_of(once_text, FFN_KERNEL) == _all_gathers_of(resharded_text, FFN_KERNEL) == 2
  np.testing.assert_allclose(_trajectory(*once), _trajectory(*resharded), rtol=1e-6)


def test_scanned_dense_kernels_are_gathered_where_they_are_used():
  # A kept gathered copy would be written into an array of all layers; scanned, the dense projections
  # leave their gathers to XLA (`projections.dense`), the attention projections keep theirs.
  cfg = encoder.BertConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                           max_position_embeddings=8, reshard_after_forward=False)
  for in_layer in (False, True):
    assert encoder.dense(cfg, 32, ("embed", "mlp"), "d", in_layer=in_layer).dot_general is not jax.lax.dot_general
  scanned = dataclasses.replace(cfg, scan_layers=True)
  assert encoder.dense(scanned, 32, ("embed", "mlp"), "d", in_layer=True).dot_general is jax.lax.dot_general
  # The heads' projections sit outside the stack: their gathered copy is not stacked.
  assert encoder.dense(scanned, 32, ("embed", "mlp"), "d").dot_general is not jax.lax.dot_general


def test_without_a_mesh_the_weights_are_used_as_they_are():
  cfg = encoder.BertConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                           max_position_embeddings=8, reshard_after_forward=False)
  model = encoder.BertEncoder(cfg)
  ids = jnp.ones((2, 8), jnp.int32)
  params = model.init(jax.random.key(0), ids, jnp.ones_like(ids), jnp.zeros_like(ids))
  resharding = encoder.BertEncoder(dataclasses.replace(cfg, reshard_after_forward=True))
  args = (ids, jnp.ones_like(ids), jnp.zeros_like(ids))
  jax.tree.map(np.testing.assert_array_equal, model.apply(params, *args), resharding.apply(params, *args))


def test_a_dimension_sharded_over_fsdp_and_tensor_together_is_refused():
  P = jax.sharding.PartitionSpec
  assert fsdp_gather._gather_dims(P("fsdp", "tensor", None)) == [(0, ("fsdp",))]
  assert fsdp_gather._gather_dims(P(("data", "fsdp"), None)) == [(0, ("data", "fsdp"))]
  with pytest.raises(ValueError, match="batch and other mesh axes together"):
    fsdp_gather._gather_dims(P(("fsdp", "tensor"), None))
