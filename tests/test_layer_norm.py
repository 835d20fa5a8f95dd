"""models/layer_norm.py: flax's LayerNorm, its outputs and gradients, with fewer passes over x."""

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.extend import core as jcore
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from bert_jax.models import layer_norm


def _flax(use_bias=True, dtype=None):
  return nn.LayerNorm(epsilon=1e-12, use_fast_variance=False, use_bias=use_bias, dtype=dtype)


def _params(use_bias, features, rng):
  p = {"scale": jnp.asarray(1 + 0.1 * rng.normal(size=features), jnp.float32)}
  if use_bias:
    p["bias"] = jnp.asarray(0.1 * rng.normal(size=features), jnp.float32)
  return p


def _loss(module, weights):
  return lambda p, x: jnp.sum(module.apply({"params": p}, x).astype(jnp.float32) * weights)


@pytest.mark.parametrize("use_bias", [True, False])
def test_outputs_and_gradients_are_flax_layer_norms(use_bias):
  rng = np.random.default_rng(0)
  # Rows with their own spreads and offsets, up to a mean three times the spread (the one-pass variance
  # loses about 1e-7 * (1 + (mean / spread)^2) of it; test_one_pass_variance_error_grows_with_the_mean).
  spread = rng.uniform(0.5, 3, (3, 5, 1))
  x = jnp.asarray((rng.normal(size=(3, 5, 64)) + rng.uniform(-3, 3, (3, 5, 1))) * spread, jnp.float32)
  weights = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  p = _params(use_bias, 64, rng)
  ours, ref = layer_norm.LayerNorm(epsilon=1e-12, use_bias=use_bias), _flax(use_bias)
  np.testing.assert_allclose(ours.apply({"params": p}, x), ref.apply({"params": p}, x), rtol=1e-5, atol=1e-5)
  got = jax.grad(_loss(ours, weights), (0, 1))(p, x)
  want = jax.grad(_loss(ref, weights), (0, 1))(p, x)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), got, want)


def test_one_pass_variance_error_grows_with_the_mean():
  # The documented price of the one-pass variance: float32 digits lost as the mean grows against
  # the spread; a post-LN BERT's rows sit near zero mean.
  z = np.random.default_rng(4).normal(size=(256, 1024))
  z = (z - z.mean(-1, keepdims=True)) / z.std(-1, keepdims=True)
  for ratio, bound in ((0, 1e-6), (3, 2e-6), (30, 1.5e-4)):   # measured 6e-8, 1e-6, 6e-5
    x = jnp.asarray(z + ratio, jnp.float32)
    _, rstd = layer_norm._statistics(x, 0.)
    err = np.abs(np.asarray(rstd, np.float64) - 1).max()
    assert err < bound, (ratio, err)


def test_bfloat16_inputs_and_outputs_as_flax():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(4, 32)), jnp.bfloat16)
  p = _params(True, 32, rng)
  ours = layer_norm.LayerNorm(epsilon=1e-12, dtype=jnp.bfloat16).apply({"params": p}, x)
  ref = _flax(dtype=jnp.bfloat16).apply({"params": p}, x)
  assert ours.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(ref, np.float32), atol=0.02)
  dx = jax.grad(lambda x: jnp.sum(layer_norm.LayerNorm(epsilon=1e-12).apply({"params": p}, x)))(x)
  assert dx.dtype == jnp.bfloat16


def _reduction_depth(fn, *args):
  """The most reductions on any path through fn's jaxpr, through the jaxprs nested in its equations."""

  def walk(jaxpr, in_depths):
    env = dict(zip(jaxpr.invars, in_depths))
    get = lambda v: 0 if isinstance(v, jcore.Literal) else env.get(v, 0)   # noqa: E731
    for eqn in jaxpr.eqns:
      ins = [get(v) for v in eqn.invars]
      d = max(ins, default=0)
      for sub in jcore.jaxprs_in_params(eqn.params):
        d = max(d, walk(sub, ins if len(ins) == len(sub.invars) else [d] * len(sub.invars)))
      d += eqn.primitive.name in ("reduce_sum", "reduce_max")
      env.update((v, d) for v in eqn.outvars)
    return max((get(v) for v in jaxpr.outvars), default=0)

  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return walk(jaxpr, [0] * len(jaxpr.invars))


def test_forward_reads_x_once_and_backward_twice():
  # Each reduction that waits on another is one more pass over the [rows, embed] array. Ours: the
  # statistics (one pass), then the backward pass's sums (a second); flax's two-pass variance and its
  # autodiff chain more.
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
  p = _params(True, 16, rng)
  weights = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  ours, ref = layer_norm.LayerNorm(epsilon=1e-12), _flax()
  assert _reduction_depth(lambda x: ours.apply({"params": p}, x), x) == 1
  assert _reduction_depth(lambda x: ref.apply({"params": p}, x), x) == 2
  assert _reduction_depth(jax.grad(_loss(ours, weights), (0, 1)), p, x) == 2
  assert _reduction_depth(jax.grad(_loss(ref, weights), (0, 1)), p, x) > 2


def test_saves_its_input_and_two_row_statistics(capsys):
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(8, 16)), jnp.float32)
  p = _params(True, 16, rng)
  print_saved_residuals(lambda x: jnp.sum(layer_norm.LayerNorm().apply({"params": p}, x) ** 2), x)
  out = capsys.readouterr().out.splitlines()
  assert len([line for line in out if "[8,16]" in line]) <= 2, out   # x (and the output for the square)
  assert len([line for line in out if "[8,1]" in line]) == 2, out
