"""LayerNorm's backward kernel: the XLA gradient from one or two incoming gradients (interpreted), the same
model gradients and training losses with it as without (paired post-LN norms, unrolled, scanned, on a
mesh), and what XLA's cost analysis counts for it when compiled for a TPU."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import encoder as model
from bert_jax.models import layer_norm, layer_norm_kernel
from test_fsdp_gather import _trajectory
from test_mesh import _mesh_setup

EPS = 1e-12


def _inputs(rows=48, features=256, dtype=jnp.float32, seed=0):
  k = jax.random.split(jax.random.key(seed), 5)
  x = (jax.random.normal(k[0], (rows, features)) * 2 + 0.3).astype(dtype)
  dys = tuple(jax.random.normal(k[i], (rows, features)).astype(dtype) for i in (1, 2))
  scale = 1 + 0.1 * jax.random.normal(k[3], (features,))
  return x, dys, scale


@pytest.mark.parametrize("n_dy", [1, 2])
@pytest.mark.parametrize("dtype, rtol", [(jnp.float32, 1e-5), (jnp.bfloat16, 1e-2)])
def test_the_kernel_gives_the_xla_gradient(n_dy, dtype, rtol):
  x, dys, scale = _inputs(dtype=dtype)
  dys = dys[:n_dy]
  got = layer_norm_kernel.gradient(x, dys, scale, EPS, "interpret")
  want = layer_norm_kernel.reference(x, dys, scale, EPS)
  # And the plain LayerNorm's backward pass on the summed gradient.
  mean, rstd = layer_norm._statistics(x, EPS)
  plain = layer_norm._normalize_bwd(EPS, dtype, "xla", (x, mean, rstd, scale, jnp.zeros_like(scale)), sum(dys))
  assert got[0].dtype == x.dtype and got[0].shape == x.shape
  for g, w, p in zip(got, want, plain):
    np.testing.assert_allclose(np.float32(g), np.float32(w), rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(w))))
    np.testing.assert_allclose(np.float32(g), np.float32(p), rtol=rtol, atol=rtol * float(jnp.max(jnp.abs(p))))


def test_blocks_of_rows_divide_the_rows_and_fit():
  assert [layer_norm_kernel.block_rows(n, 1024) for n in (512, 384, 48, 5)] == [256, 128, 16, None]
  assert layer_norm_kernel.block_rows(512, 4096) == 64      # 256 K elements a block
  x, dys, scale = _inputs(rows=5 * 8 + 3)    # 43 rows: padded to 48 in the kernel
  got = layer_norm_kernel.gradient(x, dys, scale, EPS, "interpret")
  np.testing.assert_allclose(got[0], layer_norm_kernel.reference(x, dys, scale, EPS)[0], rtol=1e-5, atol=1e-5)


@functools.cache
def _grads(kernel, variant):
  layout = {"unrolled": {}, "scanned": {"scan_layers": True}, "remat full": {"remat_policy": "full"},
            "shared layers": {"share_layers": True}}[variant]
  cfg = model.BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=16, num_layers=3,
                                     layer_norm_kernel=kernel, **layout)
  ids = (jnp.arange(2 * 16).reshape(2, 16) * 7) % 64
  encoder = model.BertEncoder(cfg)
  params = nn.unbox(encoder.init(jax.random.key(0), ids)["params"])
  weights = jax.random.normal(jax.random.key(1), (2, 16, cfg.hidden_size))

  def loss(params):
    out = encoder.apply({"params": params}, ids, output_hidden_states=True)
    return jnp.sum(out["sequence_output"] * weights) + jnp.sum(out["hidden_states"][1] * weights)
  return jax.grad(loss)(params)


def _assert_same_grads(grads, reference):
  flat = lambda t: jax.tree_util.tree_leaves_with_path(t)   # noqa: E731
  assert len(flat(grads)) == len(flat(reference))
  for (path, g), (_, r) in zip(flat(grads), flat(reference)):
    # atol: the keys' bias, whose gradient is 0 but for rounding (softmax ignores a score added to every key)
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * float(jnp.max(jnp.abs(r))) + 1e-7, err_msg=str(path))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["unrolled", "scanned", "remat full", "shared layers"])
def test_a_model_with_the_kernel_has_the_plain_gradients(variant):
  assert model.paired_layer_norms(model.BertConfig.from_preset("tiny", layer_norm_kernel="interpret"))
  reference = _grads("xla", variant)
  assert float(jnp.max(jnp.abs(reference["encoder"][
      "shared_layer" if variant == "shared layers" else "layers" if variant == "scanned" else "layer_0"][
      "output_layer_norm"]["scale"]))) > 0
  _assert_same_grads(_grads("interpret", variant), reference)
  # On other backends "pallas" is XLA's formula on the same paired norms.
  _assert_same_grads(_grads("pallas", variant), reference)


@pytest.mark.slow
def test_a_model_trained_with_the_kernel_on_a_mesh_follows_the_same_losses():
  reference = _trajectory(*_mesh_setup(layer_norm_kernel="xla"))
  assert reference[2][0] != reference[0][0]
  np.testing.assert_allclose(_trajectory(*_mesh_setup(layer_norm_kernel="interpret")), reference, rtol=1e-5)


def test_xla_counts_the_kernels_bytes_when_compiled_for_a_tpu():
  pytest.importorskip("libtpu")
  from bert_jax.models import flash_dropout   # pylint: disable=g-import-not-at-top
  from bert_jax.tools import aot   # pylint: disable=g-import-not-at-top
  device = aot.topology_devices("v3:2x2")[:1]
  at = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(device), ("x",)), jax.sharding.PartitionSpec())
  rows = jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16, sharding=at)
  scale = jax.ShapeDtypeStruct((1024,), jnp.float32, sharding=at)
  step = jax.jit(lambda x, a, b, s: layer_norm_kernel.gradient(x, (a, b), s, EPS, "pallas"))
  with flash_dropout.compiling_for("TPU v3"):
    compiled = step.lower(rows, rows, rows, scale).compile()
  assert "tpu_custom_call" in compiled.as_text()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  # x and the two gradients read, dx written: 4 arrays of 1 MB, and the column sums.
  assert 4 * 512 * 1024 * 2 <= cost["bytes accessed"] < 1.2 * 4 * 512 * 1024 * 2
