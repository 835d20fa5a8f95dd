"""The train step on a toy model: the logged learning rate is the one applied, also after skipped steps."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import optimizer, steps
from configs import common

VOCAB, PREDICTIONS = 7, 3


class _BiasOnlyLM(nn.Module):
  """MLM logits that are one learned vector: every element gets a non-zero gradient."""

  @nn.compact
  def __call__(self, batch, deterministic=True):
    del deterministic
    w = self.param("w", nn.initializers.normal(1.0), (VOCAB,))
    return {"mlm_logits": jnp.broadcast_to(w, batch["masked_lm_ids"].shape + (VOCAB,))}


def _config():
  c = ml_collections.ConfigDict({"micro_batches": 1, "mlm_all_positions": False})
  c.optimizer = common.optimizer_config()
  # b1 = b2 = eps = 0: the Adam direction is sign(g), so every element moves by exactly the rate.
  c.optimizer.update(learning_rate=0.1, warmup_steps=4, total_steps=20, b1=0.0, b2=0.0, eps=0.0,
                     weight_decay=0.0, clip_norm=0.0, bias_correction=False)
  return c


def _batch(poisoned: bool):
  ids = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
  weights = np.full(ids.shape, np.nan if poisoned else 1.0, np.float32)
  return {"masked_lm_ids": ids, "masked_lm_positions": np.zeros_like(ids), "masked_lm_weights": weights}


def _state_and_tx(config, model):
  """A fresh TrainState of `model` and the optimizer of `config`."""
  tx = optimizer.create_optimizer(config.optimizer)
  params = model.init(jax.random.key(0), _batch(False))["params"]
  zero = jnp.zeros([], jnp.int32)
  state = steps.TrainState(step=zero, params=params, opt_state=tx.init(params), nonfinite_count=zero,
                           nonfinite_streak=zero)
  return state, tx


def test_logged_learning_rate_is_the_applied_one_after_a_skipped_step():
  config, model = _config(), _BiasOnlyLM()
  state, tx = _state_and_tx(config, model)
  step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, config=config))
  schedule = optimizer.learning_rate_schedule(config.optimizer)
  applied, logged = [], []
  for t in range(7):
    new, metrics = step(state, _batch(poisoned=t in (1, 2)), jax.random.key(1))
    applied.append(float(jnp.max(jnp.abs(new.params["w"] - state.params["w"]))))
    logged.append(float(metrics["learning_rate"]))
    state = new
  assert int(state.step) == 7 and int(state.nonfinite_count) == 2
  assert applied[1] == applied[2] == 0.0   # skipped: nothing moved
  # The optimizer counted 5 updates: steps 0, 3, 4, 5, 6 applied schedule(0), ..., schedule(4).
  finite = [0, 3, 4, 5, 6]
  np.testing.assert_allclose([applied[t] for t in finite], [float(schedule(i)) for i in range(5)],
                             rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose([logged[t] for t in finite], [applied[t] for t in finite], rtol=1e-4, atol=1e-7)
  # A skipped step logs the rate it would have applied, the one the next applied step uses.
  assert logged[1] == logged[2] == logged[3]
  assert logged[6] != float(schedule(6))   # the schedule at state.step is not what was applied


def test_the_guard_tests_every_update_only_where_adam_can_divide_zero_by_zero():
  model = _BiasOnlyLM()
  counts = {}
  for eps in (0.0, 1e-6):
    config = _config()
    config.optimizer.eps = eps
    state, tx = _state_and_tx(config, model)
    step = functools.partial(steps.train_step, model=model, tx=tx, config=config)
    counts[eps] = str(jax.make_jaxpr(step)(state, _batch(False), jax.random.key(1))).count("is_finite")
    # Either way a NaN loss leaves the parameters and moments as they were.
    new, _ = jax.jit(step)(state, _batch(poisoned=True), jax.random.key(1))
    assert int(new.nonfinite_count) == 1
    jax.tree.map(np.testing.assert_array_equal, (new.params, new.opt_state), (state.params, state.opt_state))
  assert steps.update_can_be_nonfinite(common.optimizer_config()) is False   # the default eps is 1e-6
  assert steps.update_can_be_nonfinite(ml_collections.ConfigDict({"eps": 1e-20}))   # eps^2 underflows
  assert counts[1e-6] == 2 and counts[0.0] > 2   # loss and gradient norm; then every update and parameter


def test_the_guard_is_a_conditional_on_the_cpu():
  """On the CPU the update runs in a branch (XLA's CPU backend would copy every moment for a select);
  the TPU step's select is checked by tests/test_aot.py."""
  config, model = _config(), _BiasOnlyLM()
  config.optimizer.eps = 1e-6   # the guard decides before the update
  state, tx = _state_and_tx(config, model)
  step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, config=config))
  assert " conditional(" in step.lower(state, _batch(False), jax.random.key(1)).compile().as_text()
  # A clean step moves every element (the second: the first's rate is 0 in the warmup); a poisoned one
  # moves none, of the parameters and the moments.
  moved, _ = step(step(state, _batch(False), jax.random.key(1))[0], _batch(False), jax.random.key(1))
  assert np.all(np.asarray(moved.params["w"]) != np.asarray(state.params["w"]))
  adam, fresh = moved.opt_state[0], state.opt_state[0]   # (count, mu, nu)
  assert int(adam.count) == 2 and np.all(np.asarray(adam.nu["w"]) != np.asarray(fresh.nu["w"]))
  kept, _ = step(moved, _batch(True), jax.random.key(1))
  assert int(kept.nonfinite_count) == 1
  jax.tree.map(np.testing.assert_array_equal, (kept.params, kept.opt_state), (moved.params, moved.opt_state))
