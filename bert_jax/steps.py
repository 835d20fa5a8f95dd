"""The pure train and eval steps of any objective: loss from sums and weights, accumulation, non-finite guard.

Static parts (model, optimizer, config) are bound with functools.partial and the result is jitted once
in `train_setup.setup`. `frozen` holds the variables an objective reads but never trains (DistilBERT's teacher):
the model sees them as its "frozen" collection, they take no gradient and are neither in the TrainState
(so neither in the optimizer state nor in checkpoints) nor changed by a step. The objective (`config.objective`, bert_jax/objectives/) returns its losses as sums and
weights: the number of predicted tokens differs per batch, shard and micro-batch, so the means are
taken once, over the global batch.

Batch-size warmup (`config.batch_size_warmup_steps` > 0, ModernBERT's; Warner et al. 2024): the compiled
shapes never change, the global batch stays `micro_batches` micro-batches, and step t trains on the first
k(t) of them only (`active_micro_batches`); the others are skipped by `lax.cond` (no compute) and their rows
are discarded, never trained on. Losses and their denominators count the active micro-batches only.
"""

import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from bert_jax import objectives
from bert_jax import optimizer as optimizer_lib

Batch = dict[str, jax.Array]


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array              # int32 scalar: steps taken, including skipped (non-finite) ones
  params: Any
  opt_state: Any
  nonfinite_count: jax.Array   # int32: non-finite steps skipped in total
  nonfinite_streak: jax.Array  # int32: ... in a row, up to now


def _split_micro_batches(batch: Batch, n: int) -> Batch:
  """[B, ...] -> [n, B / n, ...] with micro-batch i = rows i::n, so every micro-batch spans all shards."""
  def split(x):
    x = x.reshape((x.shape[0] // n, n) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def variables(params, frozen) -> dict:
  """The model's variables: the trained params and, when the objective has them, the frozen ones."""
  return {"params": params, "frozen": frozen} if frozen else {"params": params}


def batch_size_warmup(config) -> tuple[int, int, int] | None:
  """(first k, micro_batches, warmup steps) of the batch-size warmup, None when it is off.

  Raises ValueError naming the field when the warmup cannot be built from whole micro-batches.
  """
  warmup_steps = int(config.get("batch_size_warmup_steps", 0))
  if warmup_steps == 0:
    return None
  n, rows, min_rows = int(config.micro_batches), int(config.global_batch_size), int(config.batch_size_warmup_min_rows)
  if warmup_steps < 0:
    raise ValueError(f"batch_size_warmup_steps {warmup_steps} is negative (0 turns the warmup off)")
  if not 0 < min_rows < rows:
    raise ValueError(f"batch_size_warmup_min_rows {min_rows} must be in (0, global_batch_size {rows})")
  if rows % n or min_rows % (rows // n):
    raise ValueError(
        f"batch_size_warmup_min_rows {min_rows} is not a whole number of micro-batches of global_batch_size "
        f"{rows} / micro_batches {n} rows: set micro_batches to a multiple of {rows // math.gcd(rows, min_rows)}")
  return min_rows // (rows // n), n, warmup_steps


def active_micro_batches(step: jax.Array, config) -> jax.Array:
  """k(step): micro-batches trained on at `step`, from ceil(min_rows / micro rows) up to all of them.

  Linear in the step: the warmup's steps are split evenly among k = k0, ..., n, so k reaches n before
  `batch_size_warmup_steps` and the warmup trains on as many rows as a continuous ramp from min_rows to
  the global batch would ((k0 + n) / 2 micro-batches a step on average); n at every step after it.
  """
  k0, n, warmup_steps = batch_size_warmup(config)
  t = jnp.minimum(step, warmup_steps)   # bounded: no int32 overflow in the product
  return jnp.minimum(k0 + t * (n - k0 + 1) // warmup_steps, n)


def _grads_and_sums(params, batch: Batch, key, frozen, step, *, model, config):
  """Gradient of the global-batch loss and its sums, accumulated over `config.micro_batches`.

  With a batch-size warmup only the first `active_micro_batches(step)` micro-batches count.
  """
  objective = objectives.get(config)
  n = int(config.micro_batches)
  micro_batches = _split_micro_batches(batch, n)
  if batch_size_warmup(config) is None:
    weights, active = objective.loss_weights(batch, config), None
  else:
    active = jnp.arange(n) < active_micro_batches(step, config)
    # Weights are sums over rows: the active micro-batches' are the denominators (the mean over what trains).
    micro_weights = jax.vmap(lambda m: objective.loss_weights(m, config))(micro_batches)
    weights = jax.tree.map(lambda w: jnp.sum(jnp.where(active, w, 0)), micro_weights)

  def loss_fn(p, micro, micro_key):
    outputs = model.apply(variables(p, frozen), micro, deterministic=False, rngs={"dropout": micro_key})
    sums = objective.loss_sums(outputs, micro, config)
    # Divided by the global batch's weights (its active micro-batches'): summed over micro-batches, the mean.
    return objective.loss(sums, weights), sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if n == 1:
    return grad_fn(params, batch, key)

  def add(carry, i, micro):
    grads, sums = grad_fn(params, micro, jax.random.fold_in(key, i))
    return jax.tree.map(jnp.add, carry, (grads, sums))

  def body(carry, xs):
    i, micro = xs
    if active is None:
      return add(carry, i, micro), None
    # A skipped micro-batch costs no forward or backward pass: lax.cond runs one branch.
    return jax.lax.cond(active[i], add, lambda c, *_: c, carry, i, micro), None

  shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro_batches), key)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(n), micro_batches))
  return grads, sums


def train_step(state: TrainState, batch: Batch, rng: jax.Array, frozen=None, *, model, tx, config):
  """One optimizer step on the global batch -> (new state, metrics of this step).

  Dropout keys come from `fold_in(rng, state.step)`, so a resumed run replays the same randomness.
  A step whose loss, gradient, update or new parameters are not all finite leaves params and optimizer
  state untouched: `state.step` counts it, the optimizer's own count (which drives the learning-rate
  schedule) does not. So the parameters of a TrainState are always finite. An update can be NaN while
  loss and gradient are finite only with Adam's eps = 0 or nearly (0 / 0 at a zero gradient); elsewhere the test
  is of loss and gradient norm alone (`update_can_be_nonfinite`), decided before the update
  (`_guarded_update`), where testing every update and parameter costs a second pass over parameters and
  moments. The logged `learning_rate` is the schedule at the optimizer's count, i.e. the rate this step
  applies (or would have applied, when skipped), so after skipped steps it trails `schedule(state.step)`.
  """
  key = jax.random.fold_in(rng, state.step)
  grads, sums = _grads_and_sums(state.params, batch, key, frozen, state.step, model=model, config=config)
  loss = objectives.get(config).loss(sums)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  if update_can_be_nonfinite(config.optimizer):
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite &= _all_finite(updates) & _all_finite(params)
    params, opt_state = _keep_new_if(finite, (params, opt_state), (state.params, state.opt_state))
  else:
    params, opt_state = _guarded_update(tx, grads, state.params, state.opt_state, finite)
  new_state = state.replace(
      step=state.step + 1,
      params=params,
      opt_state=opt_state,
      nonfinite_count=state.nonfinite_count + (~finite).astype(jnp.int32),
      nonfinite_streak=jnp.where(finite, 0, state.nonfinite_streak + 1),
  )
  lr = optimizer_lib.applied_learning_rate(state.opt_state, config.optimizer)
  metrics = dict(sums, loss=loss, grad_norm=grad_norm, learning_rate=lr,
                 nonfinite_count=new_state.nonfinite_count, nonfinite_streak=new_state.nonfinite_streak)
  return new_state, metrics


def _keep_new_if(finite, new, old):
  """`new` where the scalar `finite`, else `old`, leaf by leaf."""
  return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)


def _guarded_update(tx, grads, params, opt_state, finite):
  """(params, opt_state) after the optimizer's update where `finite`, else as they were.

  On the CPU the update runs in one branch of a conditional. Choosing between the new and the old values
  leaf by leaf, XLA's CPU backend copies each moment before updating it in its donated buffer, since
  another fusion still reads the old one: 26 ms of a 0.6 s `bench train` step. Elsewhere it is that choice,
  which the TPU compiler folds into the update's fusions; as a conditional, v3:8x8 phase 1 moved 3.909 GB
  a core against 3.833 GB, v5e:8x8's 13.55 GB a chip against 13.23 GB (docs/performance.md).
  """
  def apply(params, opt_state):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  def select(params, opt_state, finite):
    return _keep_new_if(finite, apply(params, opt_state), (params, opt_state))

  def branch(params, opt_state, finite):
    return jax.lax.cond(finite, apply, lambda *old: old, params, opt_state)

  return jax.lax.platform_dependent(params, opt_state, finite, cpu=branch, default=select)


def update_can_be_nonfinite(opt_config) -> bool:
  """Whether finite gradients can give a non-finite update or parameter. AdamW, LAMB and StableAdamW
  divide by sqrt(v) + eps (StableAdamW's RMS by max(v, eps^2)); LAMB's trust ratio and the global-norm
  clip guard their own zero norms. So with an eps whose square is still a normal f32 (eps >= 1e-18) a
  finite gradient gives a finite update, and the new parameters are finite short of an f32 overflow of
  parameter + update, which is not tested. A smaller eps (0, or one that rounds to 0) keeps the full test."""
  return float(opt_config.get("eps", 0.0)) < 1e-18


def _all_finite(tree) -> jax.Array:
  """True when every element of every array in `tree` is finite (a scalar; reduced per array)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def eval_step(params, batch: Batch, frozen=None, *, model, config) -> dict[str, jax.Array]:
  """Loss sums and correct counts of one held-out batch (no dropout); the caller adds them up."""
  outputs = model.apply(variables(params, frozen), batch, deterministic=True)
  return objectives.get(config).loss_sums(outputs, batch, config)
