"""AdamW / LAMB / StableAdamW with BERT's or a warmup-stable-decay schedule, as one optax transformation.

Reproduces `optimization.py` of google-research/bert: global-norm clipping at 1.0, Adam moments,
decoupled weight decay 0.01 (not on LayerNorm parameters or biases) added to the Adam direction and
scaled by the learning rate, linear warmup then linear decay to zero; and optionally without Adam's
bias correction, which that AdamWeightDecayOptimizer omits. Finetuning builds its optimizer here too.

ModernBERT's (Warner et al. 2024): StableAdamW (Wortsman et al. 2023; `scale_by_stable_adamw`) and the
warmup-stable-decay schedule with a 1-sqrt decay (`wsd_schedule`).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

NAMES = ("adamw", "lamb", "stable_adamw")   # optimizer.name


def learning_rate_schedule(opt_config) -> optax.Schedule:
  """The schedule `opt_config.schedule` names: "linear" (BERT's, `linear_schedule`) or "wsd" (`wsd_schedule`)."""
  name = opt_config.get("schedule", "linear")
  if name == "wsd":
    return wsd_schedule(opt_config)
  if name != "linear":
    raise ValueError(f"optimizer.schedule must be 'linear' or 'wsd', got {name!r}")
  if opt_config.get("decay_steps", 0) or opt_config.get("final_lr_fraction", 0.0):
    raise ValueError("optimizer.decay_steps and final_lr_fraction act only with optimizer.schedule 'wsd'")
  return linear_schedule(opt_config)


def wsd_schedule(opt_config) -> optax.Schedule:
  """Warmup-stable-decay (trapezoidal): linear warmup from 0 over `warmup_steps`, the peak until
  `total_steps - decay_steps`, then down to `final_lr_fraction` x peak at `total_steps` and there after.

  `decay_shape` "1-sqrt": f + (1 - f)(1 - sqrt(x)) at the decay's fraction x (ModernBERT's
  OneMinusSqrtScheduler, src/scheduler.py of AnswerDotAI/ModernBERT); "linear": f + (1 - f)(1 - x).
  `decay_steps` 0: no decay (ModernBERT's first phase, t_decay 0).
  """
  peak, final = float(opt_config.learning_rate), float(opt_config.final_lr_fraction)
  warmup, total, decay = int(opt_config.warmup_steps), int(opt_config.total_steps), int(opt_config.decay_steps)
  shape = opt_config.decay_shape
  if shape not in ("1-sqrt", "linear"):
    raise ValueError(f"optimizer.decay_shape must be '1-sqrt' or 'linear', got {shape!r}")
  if total <= 0 or decay < 0 or warmup < 0 or warmup + decay > total:
    raise ValueError(f"optimizer warmup_steps {warmup} + decay_steps {decay} must fit in total_steps {total}")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    x = jnp.clip((step - (total - decay)) / max(decay, 1), 0.0, 1.0) if decay else jnp.zeros_like(step)
    down = 1.0 - (jnp.sqrt(x) if shape == "1-sqrt" else x)
    stable_or_decayed = peak * (final + (1.0 - final) * down)
    if warmup <= 0:
      return stable_or_decayed
    return jnp.where(step < warmup, peak * step / warmup, stable_or_decayed)

  return schedule


def linear_schedule(opt_config) -> optax.Schedule:
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


def scale_by_stable_adamw(b1: float, b2: float, eps: float, weight_decay: float = 0.0,
                          mask=None) -> optax.GradientTransformation:
  """StableAdamW's step before the learning rate (Wortsman et al. 2023, Algorithm 2, as optimi's and
  AnswerDotAI/ModernBERT's src/optimizer.py compute it), per tensor:

      v_hat = bias-corrected second moment (this step's gradient included)
      rms   = sqrt(mean(g^2 / max(v_hat, eps^2)))
      step  = (m_hat / (sqrt(v_hat) + eps) + weight_decay * p [where `mask`]) / max(1, rms)

  The learning rate multiplies it afterwards, so each tensor's learning rate is lr / max(1, rms)
  (Adafactor's update clipping, in place of gradient clipping). `weight_decay` here is the coefficient
  divided by the peak learning rate: ModernBERT's fully decoupled decay (optimi `decouple_lr=True`)
  shrinks p by (lr_t / lr_peak) * wd / max(1, rms) per step.
  """
  adam = scale_by_adam(b1, b2, eps)

  def update_fn(updates, state, params=None):
    direction, new_state = adam.update(updates, state)
    t = new_state.count.astype(jnp.float32)
    decays = mask(params) if weight_decay else jax.tree.map(lambda _: False, updates)

    def leaf(g, d, v, p, decayed):
      v_hat = v / (1.0 - b2**t)
      g = g.astype(jnp.float32)
      rms = jnp.sqrt(jnp.mean(jnp.square(g) / jnp.maximum(v_hat, eps * eps)))
      step = d.astype(jnp.float32) + (weight_decay * p.astype(jnp.float32) if decayed else 0.0)
      return (step / jnp.maximum(1.0, rms)).astype(d.dtype)

    if weight_decay and params is None:
      raise ValueError("stable_adamw with weight decay needs the params")
    params = updates if params is None else params
    return jax.tree.map(leaf, updates, direction, new_state.nu, params, decays), new_state

  return optax.GradientTransformation(adam.init, update_fn)


def scale_by_layer_trust_ratio(mask) -> optax.GradientTransformation:
  """LAMB's trust ratio (You et al. 2019), as google-research/albert's lamb_optimizer.py applies it: each
  update scaled by ||param|| / ||update|| (1 where either is 0), except where `mask(params)` is False:
  ALBERT excludes from the layer adaptation what it excludes from weight decay (LayerNorm, biases).

  The norms are per layer: a leaf of scanned layers (`layers` [N, ...], models/layouts.py) takes one ratio
  per layer along its leading axis, as the same layers unrolled would, not one over the whole stack."""

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("the trust ratio needs the params")
    adapted = mask(params)

    def leaf(path, u, p, adapt):
      if not adapt:
        return u
      axes = tuple(range(1, p.ndim)) if "layers" in path_names(path) and p.ndim > 1 else None
      p_norm = jnp.sqrt(jnp.sum(jnp.square(p.astype(jnp.float32)), axis=axes, keepdims=True))
      u_norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=axes, keepdims=True))
      ratio = jnp.where((p_norm > 0) & (u_norm > 0), p_norm / jnp.where(u_norm > 0, u_norm, 1.0), 1.0)
      return (u * ratio).astype(u.dtype)

    return jax.tree_util.tree_map_with_path(leaf, updates, params, adapted), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def path_names(path) -> list[str]:
  """The dict keys and attribute names along a tree path, less the `.value` of boxed (partitioned)
  params; a dict key "value" (the attention's value projection) stays."""
  names = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      names.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey) and k.name != "value":
      names.append(k.name)
  return names


def _decays(names: list[str]) -> bool:
  """google-research/bert `_do_use_weight_decay`: no decay where the name matches "LayerNorm",
  "layer_norm" or "bias" anywhere (a substring search over the whole variable name).

  On our names: any key containing "bias" (`bias`, the MLM head's `output_bias`) or naming a layer
  norm in any spelling ("LayerNorm", "layer_norm", "layernorm"), which takes LayerNorm's `scale` too.
  A leaf named `scale` outside a layer norm is exempt as well: the reference has none, and ours is the
  gamma of finetune/scalar_mix.py, a multiplier like LayerNorm's.
  """
  lowered = [n.lower() for n in names]
  if lowered and lowered[-1] == "scale":
    return False
  return not any("bias" in n or "layernorm" in n.replace("_", "") for n in lowered)


def decay_mask(params: Any) -> Any:
  """True where weight decay applies (`_decays` of the parameter's path)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: _decays(path_names(path)), params)


def create_optimizer(opt_config) -> optax.GradientTransformation:
  """The transformation for `config.optimizer` (fields in configs/common.py: optimizer_config)."""
  parts = []
  if opt_config.clip_norm and opt_config.clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt_config.clip_norm))
  if opt_config.name == "stable_adamw":
    if not opt_config.bias_correction:
      raise ValueError("optimizer.bias_correction False is AdamW's; stable_adamw always corrects the bias")
    wd = float(opt_config.weight_decay) / float(opt_config.learning_rate)   # fully decoupled, see above
    parts.append(scale_by_stable_adamw(opt_config.b1, opt_config.b2, opt_config.eps, wd, decay_mask))
    parts.append(optax.scale_by_learning_rate(learning_rate_schedule(opt_config)))
    return optax.chain(*parts)
  parts.append(scale_by_adam(opt_config.b1, opt_config.b2, opt_config.eps, opt_config.bias_correction))
  if opt_config.weight_decay:
    parts.append(optax.add_decayed_weights(opt_config.weight_decay, mask=decay_mask))
  if opt_config.name == "lamb":
    parts.append(scale_by_layer_trust_ratio(decay_mask))   # You et al. 2019, Algorithm 2
  elif opt_config.name != "adamw":
    raise ValueError(f"optimizer.name must be 'adamw', 'lamb' or 'stable_adamw', got {opt_config.name!r}")
  parts.append(optax.scale_by_learning_rate(learning_rate_schedule(opt_config)))
  return optax.chain(*parts)


def applied_learning_rate(opt_state: Any, opt_config) -> jax.Array:
  """The learning rate the next update from `opt_state` applies: the schedule at the optimizer's own
  step count (the count of its `scale_by_learning_rate`), which only applied updates advance."""
  is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)
  counts = [s.count for s in jax.tree.leaves(opt_state, is_leaf=is_schedule) if is_schedule(s)]
  if len(counts) != 1:
    raise ValueError(f"expected one learning-rate schedule in the optimizer state, found {len(counts)}")
  return learning_rate_schedule(opt_config)(counts[0])
