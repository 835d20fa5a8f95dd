"""Optimizer: BERT's schedule, AdamW with and without bias correction against hand-written updates,
the weight-decay mask, clipping and LAMB."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax import optimizer
from bert_jax.models import heads
from bert_jax.models import encoder as model
from bert_jax.finetune import scalar_mix
from configs import common


def _config(**overrides) -> ml_collections.ConfigDict:
  c = common.optimizer_config()
  c.update(dict(learning_rate=0.1, warmup_steps=4, total_steps=20, clip_norm=0.0) | overrides)
  return c


def test_schedule_warms_up_then_decays_linearly_to_zero():
  schedule = optimizer.learning_rate_schedule(_config())
  lr = [float(schedule(t)) for t in range(25)]
  np.testing.assert_allclose(lr[:4], [0.0, 0.025, 0.05, 0.075], rtol=1e-6)
  # google-research/bert: after warmup, lr * (1 - t / total).
  np.testing.assert_allclose(lr[4:21], [0.1 * (1 - t / 20) for t in range(4, 21)], rtol=1e-5, atol=1e-8)
  assert lr[20:] == [0.0] * 5
  assert max(lr) == pytest.approx(0.1 * (1 - 4 / 20))


def _params():
  return {"dense": {"kernel": jnp.array([[0.5, -1.0], [2.0, 0.3]]), "bias": jnp.array([0.1, -0.2])},
          "layer_norm": {"scale": jnp.array([1.0, 1.0]), "bias": jnp.array([0.0, 0.0])}}


def _grads(step):
  return jax.tree.map(lambda p: jnp.sin(p * (step + 1) + 0.3), _params())


def _reference(params, steps, *, lr_fn, b1, b2, eps, wd, bias_correction):
  """google-research/bert AdamWeightDecayOptimizer, in numpy (plus optional bias correction)."""
  params = jax.tree.map(np.asarray, params)
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  for t in range(steps):
    g = jax.tree.map(np.asarray, _grads(t))
    m = jax.tree.map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
    v = jax.tree.map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
    c1, c2 = (1 - b1 ** (t + 1), 1 - b2 ** (t + 1)) if bias_correction else (1.0, 1.0)
    mask = optimizer.decay_mask(params)
    update = jax.tree.map(lambda m_, v_, p, d: (m_ / c1) / (np.sqrt(v_ / c2) + eps) + (wd * p if d else 0.0),
                          m, v, params, mask)
    params = jax.tree.map(lambda p, u: p - lr_fn(t) * u, params, update)
  return params


def _run(tx, steps):
  params = _params()
  state = tx.init(params)
  for t in range(steps):
    updates, state = tx.update(_grads(t), state, params)
    params = optax.apply_updates(params, updates)
  return params


@pytest.mark.parametrize("bias_correction", [False, True])
def test_adamw_matches_hand_written_update(bias_correction):
  c = _config(bias_correction=bias_correction, weight_decay=0.01, b2=0.98)
  schedule = optimizer.learning_rate_schedule(c)
  got = _run(optimizer.create_optimizer(c), 6)
  want = _reference(_params(), 6, lr_fn=lambda t: float(schedule(t)), b1=c.b1, b2=c.b2, eps=c.eps,
                    wd=c.weight_decay, bias_correction=bias_correction)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


def test_without_bias_correction_first_step_is_larger_by_the_correction_factor():
  # Step 1: corrected m/sqrt(v) = g/|g|; uncorrected it is (1 - b1) / sqrt(1 - b2) times that.
  c = dict(weight_decay=0.0, warmup_steps=0, total_steps=10**9)
  on = _run(optimizer.create_optimizer(_config(bias_correction=True, **c)), 1)
  off = _run(optimizer.create_optimizer(_config(bias_correction=False, **c)), 1)
  k0 = _params()["dense"]["kernel"]
  ratio = np.abs(off["dense"]["kernel"] - k0) / np.abs(on["dense"]["kernel"] - k0)
  np.testing.assert_allclose(ratio, (1 - 0.9) / np.sqrt(1 - 0.999), rtol=1e-3)


def test_bias_corrected_adamw_equals_optax_adamw():
  c = _config(bias_correction=True, weight_decay=0.01)
  ref = optax.adamw(optimizer.learning_rate_schedule(c), b1=c.b1, b2=c.b2, eps=c.eps,
                    weight_decay=c.weight_decay, mask=optimizer.decay_mask)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               _run(optimizer.create_optimizer(c), 5), _run(ref, 5))


def test_decay_mask_excludes_layer_norm_and_biases():
  mask = optimizer.decay_mask(_params())
  assert mask == {"dense": {"kernel": True, "bias": False}, "layer_norm": {"scale": False, "bias": False}}
  boxed = {"mlm": {"layer_norm": {"scale": jnp.ones(2)}, "transform": {"kernel": jnp.ones((2, 2))}}}
  assert jax.tree.leaves(optimizer.decay_mask(boxed)) == [False, True]
  # google-research/bert matches "bias", "LayerNorm" and "layer_norm" anywhere in the name.
  names = {"output_bias": 0, "LayerNorm": {"gamma": 0}, "attention": {"value": {"kernel": 0}}}
  assert optimizer.decay_mask(names) == {"output_bias": False, "LayerNorm": {"gamma": False},
                                         "attention": {"value": {"kernel": True}}}


_ENCODER_DECAYED = [
    "bert/embeddings/position_embeddings/embedding", "bert/embeddings/token_type_embeddings/embedding",
    "bert/embeddings/word_embeddings/embedding",
    *(f"bert/encoder/layer_0/{m}/kernel" for m in ("attention/key", "attention/out", "attention/query",
                                                    "attention/value", "intermediate", "output")),
    "bert/pooler/kernel"]


def _head_models(cfg):
  """Every model with a head: pretraining (heads.py) and finetuning (heads.py, finetune/scalar_mix.py)."""
  ids = jnp.zeros((1, 8), jnp.int32)
  pretraining = ({"input_ids": ids, "input_mask": ids, "segment_ids": ids,
                  "masked_lm_positions": jnp.zeros((1, 2), jnp.int32)},)
  finetuning = (ids, ids, ids)
  return {
      "pretraining": (heads.BertForPreTraining(cfg), pretraining, ["mlm/transform/kernel", "nsp/kernel"]),
      "pretraining_no_nsp": (heads.BertForPreTraining(cfg, use_nsp=False), pretraining, ["mlm/transform/kernel"]),
      "sequence": (heads.BertForSequenceClassification(cfg, 3), finetuning, ["classifier/kernel"]),
      "token": (heads.BertForTokenClassification(cfg, 5), finetuning, ["classifier/kernel"]),
      "qa": (heads.BertForQuestionAnswering(cfg), finetuning, ["qa_outputs/kernel"]),
      **{f"scalar_mix_{kind}": (scalar_mix.ScalarMixModel(cfg, kind, 3), finetuning,
                                ["scalar_mix/weights", f"{head}/kernel"])
         for kind, head in (("classification", "classifier"), ("token_classification", "classifier"),
                            ("span", "qa_outputs"))},
  }


def test_only_kernels_and_embeddings_of_every_head_decay():
  cfg = model.BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=32, num_layers=1)
  for name, (module, args, head_decayed) in _head_models(cfg).items():
    params = jax.eval_shape(lambda m=module, a=args: m.init(jax.random.key(0), *a)["params"])
    flat, _ = jax.tree_util.tree_flatten_with_path(optimizer.decay_mask(params))
    decayed = sorted("/".join(optimizer.path_names(path)) for path, decays in flat if decays)
    assert decayed == sorted(_ENCODER_DECAYED + head_decayed), name
    assert len(flat) - len(decayed) >= 14, name   # 13 encoder biases and layer-norm leaves, >= 1 head bias


def test_global_norm_clipping():
  c = _config(clip_norm=1.0, weight_decay=0.0, bias_correction=True, warmup_steps=0)
  tx = optimizer.create_optimizer(c)
  params = {"w": jnp.zeros(3)}
  big = {"w": jnp.array([300.0, -400.0, 0.0])}
  small = {"w": jnp.array([0.3, -0.4, 0.0])}
  # Adam is scale-invariant except for eps, so compare the clipped moments instead of the updates.
  _, s_big = tx.update(big, tx.init(params), params)
  _, s_small = tx.update(jax.tree.map(lambda g: g / 0.5 * 1.0, small), tx.init(params), params)
  np.testing.assert_allclose(s_big[1].mu["w"], s_small[1].mu["w"], rtol=1e-6)


def test_lamb_scales_each_layer_by_its_trust_ratio():
  c = _config(name="lamb", weight_decay=0.0, warmup_steps=0, learning_rate=0.1, total_steps=10**9)
  tx = optimizer.create_optimizer(c)
  params = {"a": jnp.full(4, 3.0), "b": jnp.full(4, 0.5)}
  grads = {"a": jnp.array([1.0, -1.0, 2.0, 0.5]), "b": jnp.array([0.1, 0.2, -0.3, 0.4])}
  updates, _ = tx.update(grads, tx.init(params), params)
  for k in params:   # ||update|| = lr * ||param|| (You et al. 2019, trust ratio)
    np.testing.assert_allclose(jnp.linalg.norm(updates[k]), 0.1 * jnp.linalg.norm(params[k]), rtol=1e-5)


def test_unknown_optimizer_name_is_rejected():
  with pytest.raises(ValueError, match="adamw"):
    optimizer.create_optimizer(_config(name="sgd"))
