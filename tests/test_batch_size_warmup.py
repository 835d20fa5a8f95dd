"""Batch-size warmup (bert_jax/steps.py): k of n micro-batches active is a step on their rows alone; the
schedule k(step); after the warmup the step is the plain one; invalid fields are named."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import optimizer, steps
from configs import common, modernbert_base, modernbert_large

VOCAB, LENGTH, PREDICTIONS, ROWS = 11, 5, 2, 8


class _TinyLM(nn.Module):
  """Embedding, one tanh layer, MLM logits at the masked positions and NSP logits from the first token."""

  @nn.compact
  def __call__(self, batch, deterministic=True):
    x = nn.Dropout(0.5, deterministic=deterministic)(nn.Embed(VOCAB, 4)(batch["input_ids"]))
    x = jnp.tanh(nn.Dense(4)(x))                                                  # [B, L, 4]
    h = jnp.take_along_axis(x, batch["masked_lm_positions"][..., None], axis=1)   # [B, P, 4]
    return {"mlm_logits": nn.Dense(VOCAB)(h), "nsp_logits": nn.Dense(2)(x[:, 0])}


def _config(micro_batches, rows=ROWS, warmup_steps=0, min_rows=0):
  c = ml_collections.ConfigDict({"micro_batches": micro_batches, "mlm_all_positions": False,
                                 "global_batch_size": rows, "batch_size_warmup_steps": warmup_steps,
                                 "batch_size_warmup_min_rows": min_rows})
  c.optimizer = common.optimizer_config()
  c.optimizer.update(learning_rate=0.1, warmup_steps=0, total_steps=100, clip_norm=0.0)
  return c


def _batch(rows=ROWS, seed=0):
  rng = np.random.default_rng(seed)
  return {"input_ids": rng.integers(0, VOCAB, (rows, LENGTH), dtype=np.int32),
          "masked_lm_positions": rng.integers(0, LENGTH, (rows, PREDICTIONS), dtype=np.int32),
          "masked_lm_ids": rng.integers(0, VOCAB, (rows, PREDICTIONS), dtype=np.int32),
          # Uneven weights: the denominators must count the active rows' weights, not the batch's.
          "masked_lm_weights": rng.integers(0, 2, (rows, PREDICTIONS)).astype(np.float32),
          "next_sentence_labels": rng.integers(0, 2, (rows,), dtype=np.int32)}


def _steps(config, batch, at):
  """[(new state, metrics) of one train step from fixed params at `state.step` = t, for t in at], the
  jaxpr of its gradient over the micro-batches (the optimizer's guard may hold a conditional of its own)."""
  model = _TinyLM()
  tx = optimizer.create_optimizer(config.optimizer)
  params = model.init(jax.random.key(0), jax.tree.map(lambda x: x[:1], batch))["params"]
  state = lambda t: steps.TrainState(step=jnp.int32(t), params=params, opt_state=tx.init(params),
                                     nonfinite_count=jnp.int32(0), nonfinite_streak=jnp.int32(0))
  fn = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, config=config))
  grads = functools.partial(steps._grads_and_sums, model=model, config=config)   # pylint: disable=protected-access
  jaxpr = jax.make_jaxpr(grads)(params, batch, jax.random.key(1), None, jnp.int32(at[0]))
  return [fn(state(t), batch, jax.random.key(1)) for t in at], str(jaxpr)


def _assert_same_step(a, b):
  (state_a, metrics_a), (state_b, metrics_b) = a, b
  for x, y in zip(jax.tree.leaves(state_a.params), jax.tree.leaves(state_b.params)):
    np.testing.assert_allclose(x, y, atol=1e-6, rtol=1e-6)
  for name in ("loss", "grad_norm", "mlm_loss_sum", "mlm_weight", "nsp_loss_sum", "nsp_weight"):
    np.testing.assert_allclose(metrics_a[name], metrics_b[name], atol=1e-6, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("step, k", [(2, 2), (4, 3)])
@pytest.mark.slow
def test_k_active_micro_batches_equal_a_step_on_their_rows_alone(step, k):
  n = 4   # micro-batches of 2 rows; from 1 to 4 over 8 steps: k = 1, 1, 2, 2, 3, 3, 4, 4
  batch = _batch()
  # Micro-batch i is rows i::n: the active rows are those with row % n < k. The skipped rows' weights are
  # NaN: were they read, the step would be non-finite and skipped.
  active = np.arange(ROWS) % n < k
  batch["masked_lm_weights"][~active] = np.nan
  warm = _config(n, warmup_steps=8, min_rows=2)
  assert int(steps.active_micro_batches(jnp.int32(step), warm)) == k
  [(state, metrics)], jaxpr = _steps(warm, batch, [step])
  assert int(state.nonfinite_count) == 0 and "cond" in jaxpr   # skipped by lax.cond, not masked
  # The same rows as a plain batch of k micro-batches in the same order (so the same dropout keys).
  sub = jax.tree.map(lambda x: np.swapaxes(x.reshape((ROWS // n, n) + x.shape[1:])[:, :k], 0, 1), batch)
  sub = jax.tree.map(lambda x: np.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:]), sub)
  assert sub["input_ids"].shape == (2 * k, LENGTH)
  [plain], _ = _steps(_config(k, rows=2 * k), sub, [step])
  _assert_same_step((state, metrics), plain)


def test_after_the_warmup_the_step_is_the_plain_one():
  batch, at = _batch(seed=1), [0, 7, 8, 9, 1000]
  plain, plain_jaxpr = _steps(_config(4), batch, at)
  warm, _ = _steps(_config(4, warmup_steps=8, min_rows=2), batch, at)
  assert "cond" not in plain_jaxpr
  for a, b in zip(warm[1:], plain[1:]):   # k = 4 from step 6 on: the same step
    _assert_same_step(a, b)
  assert not np.allclose(warm[0][1]["loss"], plain[0][1]["loss"])   # k = 1: a different one


def test_schedule_is_linear_from_the_min_rows_to_all_micro_batches():
  def ks(config, ts):
    return [int(steps.active_micro_batches(jnp.int32(t), config)) for t in ts]
  # k0 = 1 of 6 over 12 steps: each k holds 2 steps.
  assert ks(_config(6, rows=12, warmup_steps=12, min_rows=2), [0, 1, 2, 5, 9, 10, 11, 12, 10**6]) == [
      1, 1, 2, 3, 5, 6, 6, 6, 6]
  # k0 = 2 of 6 (4 rows of micro-batches of 2) over 10 steps: k = 2 + t * 5 // 10.
  assert ks(_config(6, rows=12, warmup_steps=10, min_rows=4), [0, 1, 2, 3, 9, 10]) == [2, 2, 3, 3, 6, 6]
  # Over the warmup, (k0 + n) / 2 micro-batches a step on average: a continuous ramp's rows.
  config = _config(6, rows=12, warmup_steps=600, min_rows=2)
  assert np.mean(ks(config, range(600))) == 3.5


@pytest.mark.parametrize("module, n, tokens, rows", [(modernbert_base, 6, 50e9, 4608),
                                                     (modernbert_large, 11, 10e9, 4928)])
def test_modernbert_phase1_warms_up_from_one_micro_batch(module, n, tokens, rows):
  c = module.get_config("phase1")
  assert steps.batch_size_warmup(c) == (1, n, int(np.ceil(tokens / (rows * 1024))))
  assert c.global_batch_size // n == c.batch_size_warmup_min_rows
  warmup_steps = c.batch_size_warmup_steps
  assert int(steps.active_micro_batches(jnp.int32(warmup_steps - 1), c)) == n
  for phase in ("extension", "decay"):   # phase 1's steps are over: no warmup
    assert steps.batch_size_warmup(module.get_config(phase)) is None


@pytest.mark.parametrize("fields, message", [
    ({"micro_batches": 4}, "set micro_batches to a multiple of 6"),
    ({"batch_size_warmup_min_rows": 4608}, r"must be in \(0, global_batch_size 4608\)"),
    ({"batch_size_warmup_min_rows": 0}, r"must be in \(0, global_batch_size 4608\)"),
    ({"batch_size_warmup_steps": -1}, "is negative"),
])
def test_invalid_warmup_is_named(fields, message):
  c = modernbert_base.get_config()
  c.update(fields)
  with pytest.raises(ValueError, match=message):
    steps.batch_size_warmup(c)
  with pytest.raises(ValueError, match=message):   # also when the step is traced
    _steps(_config(c.micro_batches, c.global_batch_size, c.batch_size_warmup_steps, c.batch_size_warmup_min_rows),
           _batch(c.global_batch_size), [0])
