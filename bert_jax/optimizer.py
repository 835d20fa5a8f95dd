"""AdamW / LAMB with BERT's schedule, clipping and weight-decay mask, as one optax transformation.

Reproduces `optimization.py` of google-research/bert: global-norm clipping at 1.0, Adam moments,
decoupled weight decay 0.01 (not on LayerNorm parameters or biases) added to the Adam direction and
scaled by the learning rate, linear warmup then linear decay to zero; and optionally without Adam's
bias correction, which that AdamWeightDecayOptimizer omits. Finetuning builds its optimizer here too.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(opt_config) -> optax.Schedule:
  """Linear warmup from 0 over `warmup_steps`, linear decay to 0 at `total_steps`.

  As google-research/bert: the decay line is `lr * (1 - step / total_steps)` from step 0, and warmup
  (`lr * step / warmup_steps`) replaces it while `step < warmup_steps`.
  """
  peak = float(opt_config.learning_rate)
  warmup, total = int(opt_config.warmup_steps), int(opt_config.total_steps)
  if total <= 0:
    raise ValueError(f"optimizer.total_steps must be positive, got {total}")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    decayed = peak * jnp.clip(1.0 - step / total, 0.0, 1.0)
    if warmup <= 0:
      return decayed
    return jnp.where(step < warmup, peak * step / warmup, decayed)

  return schedule


class ScaleByAdamState(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def scale_by_adam(b1: float, b2: float, eps: float, bias_correction: bool = True) -> optax.GradientTransformation:
  """Adam's direction m / (sqrt(v) + eps); with `bias_correction=False` m and v are used as they are."""

  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return ScaleByAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    count = optax.safe_increment(state.count)
    mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), state.nu, updates)
    if bias_correction:
      t = count.astype(jnp.float32)
      mu_hat = jax.tree.map(lambda m: m / (1.0 - b1**t), mu)
      nu_hat = jax.tree.map(lambda v: v / (1.0 - b2**t), nu)
    else:
      mu_hat, nu_hat = mu, nu
    direction = jax.tree.map(lambda m, v, g: (m / (jnp.sqrt(v) + eps)).astype(g.dtype), mu_hat, nu_hat, updates)
    return direction, ScaleByAdamState(count, mu, nu)

  return optax.GradientTransformation(init_fn, update_fn)


_NO_DECAY_NAMES = ("bias", "scale")   # biases and LayerNorm's scale (flax names it "scale")


def decay_mask(params: Any) -> Any:
  """True where weight decay applies: not biases, not LayerNorm parameters (as google-research/bert)."""

  def decays(path, _):
    keys = [str(getattr(k, "key", getattr(k, "name", ""))) for k in path]
    keys = [k for k in keys if k and k != "value"]   # skip the `.value` of boxed (partitioned) params
    in_layer_norm = any("layernorm" in k.lower().replace("_", "") for k in keys)
    return not (in_layer_norm or (keys and keys[-1] in _NO_DECAY_NAMES))

  return jax.tree_util.tree_map_with_path(decays, params)


def create_optimizer(opt_config) -> optax.GradientTransformation:
  """The transformation for `config.optimizer` (fields in configs/common.py: optimizer_config)."""
  parts = []
  if opt_config.clip_norm and opt_config.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt_config.clip_norm))
  parts.append(scale_by_adam(opt_config.b1, opt_config.b2, opt_config.eps, opt_config.bias_correction))
  if opt_config.weight_decay:
    parts.append(optax.add_decayed_weights(opt_config.weight_decay, mask=decay_mask))
  if opt_config.name == "lamb":
    parts.append(optax.scale_by_trust_ratio())   # You et al. 2019, Algorithm 2
  elif opt_config.name != "adamw":
    raise ValueError(f"optimizer.name must be 'adamw' or 'lamb', got {opt_config.name!r}")
  parts.append(optax.scale_by_learning_rate(learning_rate_schedule(opt_config)))
  return optax.chain(*parts)
