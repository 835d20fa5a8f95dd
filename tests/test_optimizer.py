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


def test_lamb_leaves_layer_norms_and_biases_out_of_the_trust_ratio():
  """google-research/albert's LAMB excludes LayerNorm and biases from the layer adaptation, as from weight
  decay: a small bias moves by the Adam step (lr at the first step), not by lr * ||bias||."""
  c = _config(name="lamb", weight_decay=0.0, warmup_steps=0, learning_rate=0.1, total_steps=10**9)
  tx = optimizer.create_optimizer(c)
  params = {"dense": {"kernel": jnp.full(4, 3.0), "bias": jnp.full(4, 1e-3)}, "LayerNorm": {"scale": jnp.full(4, 2.0)}}
  grads = jax.tree.map(lambda p: jnp.array([1.0, -1.0, 2.0, 0.5]), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(jnp.abs(updates["dense"]["bias"]), 0.1, rtol=1e-5)   # Adam's first step: sign(g)
  np.testing.assert_allclose(jnp.abs(updates["LayerNorm"]["scale"]), 0.1, rtol=1e-5)
  np.testing.assert_allclose(jnp.linalg.norm(updates["dense"]["kernel"]), 0.1 * 6.0, rtol=1e-5)


def test_lamb_takes_a_trust_ratio_per_layer_of_scanned_layers():
  """Scanned layers' leaves are stacked [N, ...]: each layer keeps the ratio it has unrolled."""
  c = _config(name="lamb", weight_decay=0.0, warmup_steps=0, learning_rate=0.1, total_steps=10**9)
  tx = optimizer.create_optimizer(c)
  w0, w1, g = jnp.full((4, 4), 1.0), jnp.full((4, 4), 0.1), jnp.full((4, 4), 0.01)
  unrolled = {"layer_0": {"kernel": w0}, "layer_1": {"kernel": w1}}
  u, _ = tx.update(jax.tree.map(lambda _: g, unrolled), tx.init(unrolled), unrolled)
  scanned = {"layers": {"kernel": jnp.stack([w0, w1])}}
  us, _ = tx.update({"layers": {"kernel": jnp.stack([g, g])}}, tx.init(scanned), scanned)
  np.testing.assert_allclose(us["layers"]["kernel"], jnp.stack([u["layer_0"]["kernel"], u["layer_1"]["kernel"]]),
                             rtol=1e-6)
  np.testing.assert_allclose(jnp.linalg.norm(u["layer_1"]["kernel"]), 0.1 * 0.4, rtol=1e-5)


def test_unknown_optimizer_name_is_rejected():
  with pytest.raises(ValueError, match="adamw"):
    optimizer.create_optimizer(_config(name="sgd"))


# ModernBERT's optimizer and schedule (Warner et al. 2024): StableAdamW and warmup-stable-decay.

def _spiky_grads(step):
  """_grads, but the dense kernel's gradient is 30x larger at step 3: StableAdamW's clipping acts there."""
  g = _grads(step)
  if step == 3:
    g["dense"]["kernel"] = 30.0 * g["dense"]["kernel"]
  return g


def _stable_adamw_reference(params, steps, *, lr_fn, peak, b1, b2, eps, wd):
  """optimi's StableAdamW with decouple_lr=True (AnswerDotAI/ModernBERT src/optimizer.py), in numpy: its
  debiased betas (beta_hat = (beta^t - beta) / (beta^t - 1)) and lerp updates; returns (params, rms per step)."""
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  mask, rms_seen = optimizer.decay_mask(params), []
  for t in range(1, steps + 1):
    g = jax.tree.map(lambda x: np.asarray(x, np.float64), _spiky_grads(t - 1))
    b1_hat, b2_hat = (b1**t - b1) / (b1**t - 1), (b2**t - b2) / (b2**t - 1)
    m = jax.tree.map(lambda m_, g_: m_ + (1 - b1_hat) * (g_ - m_), m, g)
    v = jax.tree.map(lambda v_, g_: b2_hat * v_ + (1 - b2_hat) * g_ * g_, v, g)
    rms = jax.tree.map(lambda g_, v_: np.sqrt(np.mean(g_ * g_ / np.maximum(v_, eps * eps))), g, v)
    rms_seen.append(rms)
    lr = lr_fn(t - 1)

    def step(p, m_, v_, r, decays):
      neg_lr = -lr / max(1.0, r)
      if decays:
        p = p * (1 + neg_lr / peak * wd)
      return p + neg_lr * m_ / (np.sqrt(v_) + eps)

    params = jax.tree.map(step, params, m, v, rms, mask)
  return params, rms_seen


def test_stable_adamw_matches_the_reference_update_and_clips_the_spike():
  c = _config(name="stable_adamw", weight_decay=0.05, b2=0.98, schedule="wsd", decay_steps=4,
              final_lr_fraction=0.1)
  schedule = optimizer.learning_rate_schedule(c)
  tx = optimizer.create_optimizer(c)
  params = _params()
  state = tx.init(params)
  for t in range(8):
    updates, state = tx.update(_spiky_grads(t), state, params)
    params = optax.apply_updates(params, updates)
  want, rms = _stable_adamw_reference(_params(), 8, lr_fn=lambda t: float(schedule(t)), peak=c.learning_rate,
                                      b1=c.b1, b2=c.b2, eps=c.eps, wd=c.weight_decay)
  assert rms[3]["dense"]["kernel"] > 1.5 and rms[2]["dense"]["kernel"] <= 1.0   # the clipping is exercised
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), params, want)


def test_stable_adamw_without_a_spike_is_adamw_with_fully_decoupled_decay():
  # RMS(g^2 / v_hat) is exactly 1 at step 1, so nothing is clipped: AdamW's step, decay wd * (lr / peak) * p.
  c = _config(name="stable_adamw", weight_decay=0.05, warmup_steps=0, total_steps=10**9)
  params = _params()
  updates, _ = optimizer.create_optimizer(c).update(_grads(0), optimizer.create_optimizer(c).init(params), params)
  adam = _config(weight_decay=0.05 / c.learning_rate, warmup_steps=0, total_steps=10**9)
  want, _ = optimizer.create_optimizer(adam).update(_grads(0), optimizer.create_optimizer(adam).init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), updates, want)


def test_stable_adamw_refuses_no_bias_correction():
  with pytest.raises(ValueError, match="bias"):
    optimizer.create_optimizer(_config(name="stable_adamw", bias_correction=False))


@pytest.mark.parametrize("shape", ["1-sqrt", "linear"])
def test_wsd_schedule_warms_up_holds_then_decays(shape):
  c = _config(schedule="wsd", learning_rate=0.1, warmup_steps=4, total_steps=20, decay_steps=8,
              final_lr_fraction=0.01, decay_shape=shape)
  lr = np.array([float(optimizer.learning_rate_schedule(c)(t)) for t in range(25)])
  down = (lambda x: 1 - np.sqrt(x)) if shape == "1-sqrt" else (lambda x: 1 - x)
  want = [0.1 * t / 4 if t < 4 else 0.1 if t <= 12 else 0.1 * (0.01 + 0.99 * down(min(t - 12, 8) / 8))
          for t in range(25)]
  np.testing.assert_allclose(lr, want, rtol=1e-6, atol=1e-9)
  assert lr[20:].tolist() == pytest.approx([0.001] * 5)


def test_wsd_without_decay_steps_stays_at_the_peak():
  c = _config(schedule="wsd", warmup_steps=3, total_steps=10, decay_steps=0)
  lr = [float(optimizer.learning_rate_schedule(c)(t)) for t in range(3, 30)]
  assert lr == pytest.approx([0.1] * len(lr))


@pytest.mark.parametrize("changes, match", [
    ({"schedule": "cosine"}, "schedule"), ({"decay_steps": 5}, "wsd"),
    ({"schedule": "wsd", "decay_steps": 18}, "fit"), ({"schedule": "wsd", "decay_shape": "cos"}, "decay_shape")])
def test_schedule_fields_that_cannot_act_are_errors(changes, match):
  with pytest.raises(ValueError, match=match):
    optimizer.learning_rate_schedule(_config(**changes))
