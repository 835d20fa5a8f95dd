"""A finetuning task's model, optimizer, loss and steps, for one trial (bert_jax/finetune/trainer.py vmaps
them over the trials it trains together).

The model is the pretrained encoder with one new output layer (Devlin et al. 2019, Sec. 4); the optimizer is
AdamW of bert_jax/optimizer.py at peak rate 1 (each trial's learning rate multiplies its update), with
layer-wise decay and a frozen encoder as options; losses are sums and weights.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax import optimizer as optimizer_lib
from bert_jax.finetune import scalar_mix
from bert_jax.models import encoder as model_lib
from bert_jax.models import heads

Config = ml_collections.ConfigDict


# ------------------------------------------------------------------------------------------------
# Model: the encoder (its initial weights come from `init.load_encoder`) and one task head.


def build_model(bert_cfg: model_lib.BertConfig, task, use_scalar_mix: bool = False) -> nn.Module:
  """The encoder with the task's head (or a scalar mix of its layers feeding the head).

  BERT's heads sit on the encoder's output (classification on its pooler); ModernBERT's (Hugging Face's
  ModernBertFor*) on its `head` (dense, activation, LayerNorm), a sequence classifier reading the [CLS]
  vector or the mean over real tokens as the task option `classifier_pooling` says (`init.classifier_pooling`).
  """
  if use_scalar_mix:
    return scalar_mix.ScalarMixModel(bert_cfg, task.kind, task.num_labels)
  modern = bert_cfg.model_type == "modernbert"
  if task.kind in ("classification", "regression"):
    pooling = task.options.get("classifier_pooling") or ("cls" if modern else "pooler")
    return heads.BertForSequenceClassification(bert_cfg, task.num_labels, pooling=pooling)
  if task.kind == "tagging":
    return heads.BertForTokenClassification(bert_cfg, task.num_labels, head=modern)
  return heads.BertForQuestionAnswering(bert_cfg, head=modern)


# ------------------------------------------------------------------------------------------------
# Optimizer: AdamW of bert_jax/optimizer.py, layer-wise decay, frozen encoder.


def _layer_depth(path, num_layers: int):
  """0 for embeddings, i + 1 for encoder layer i (an array over the scan axis), num_layers + 1 above."""
  keys = [str(getattr(k, "key", k)) for k in path]
  if not keys or keys[0] != "bert" or "pooler" in keys:
    return num_layers + 1
  if "embeddings" in keys:
    return 0
  for k in keys:
    if k.startswith("layer_") and k[6:].isdigit():
      return int(k[6:]) + 1
    if k == "layers":
      return np.arange(1, num_layers + 1)
  return num_layers + 1


def scale_by_layer(decay: float, num_layers: int) -> optax.GradientTransformation:
  """Layer-wise learning-rate decay (Clark et al. 2020, ELECTRA, App. A): the update of encoder layer i
  is scaled by decay**(num_layers - i), embeddings by decay**(num_layers + 1), pooler and head by 1.
  Scanned parameters (`layers`, leading layer axis) get one factor per slice."""
  def factors(updates):
    def one(path, u):
      f = np.float32(decay) ** (num_layers + 1 - np.asarray(_layer_depth(path, num_layers), np.float32))
      return f.reshape(f.shape + (1,) * (u.ndim - f.ndim))
    return jax.tree_util.tree_map_with_path(one, updates)

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, f: (u * f).astype(u.dtype), updates, factors(updates)), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def build_optimizer(config: Config, total_steps: int, num_layers: int) -> optax.GradientTransformation:
  """AdamW at peak rate 1 (the trial's learning rate multiplies the update), warmup + linear decay."""
  opt = Config(config.optimizer.to_dict())
  if opt.name == "stable_adamw" and opt.weight_decay:
    # Its decay is fully decoupled, divided by the peak rate (optimizer.scale_by_stable_adamw): at peak 1
    # times the trial's rate it would shrink the weights by lr * wd a step, not by wd.
    raise ValueError("finetuning scales each trial's update by its learning rate, and with it StableAdamW's "
                     "fully decoupled weight decay: use optimizer.name='adamw', or optimizer.weight_decay=0")
  opt.learning_rate, opt.total_steps = 1.0, total_steps
  opt.warmup_steps = int(config.warmup_fraction * total_steps)
  tx = optimizer_lib.create_optimizer(opt)
  if config.layerwise_lr_decay != 1.0:
    tx = optax.chain(tx, scale_by_layer(config.layerwise_lr_decay, num_layers))
  if config.freeze_encoder:
    # Feature-based approach (Devlin et al. 2019, 5.3): no update, no weight decay, no Adam state.
    labels = lambda params: {k: jax.tree.map(lambda _, k=k: "frozen" if k == "bert" else "train", v)
                             for k, v in params.items()}
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)
  return tx


# ------------------------------------------------------------------------------------------------
# Losses (sums and weights) and steps for one trial; the loop vmaps them over the trial axis.


def _cross_entropy_sum(logits, labels, weights):
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # f32 on purpose
  nll = -jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * weights)


def loss_sums(kind: str, outputs, batch) -> dict:
  """{"loss_sum", "weight"} of the task's loss; unlabelled rows (label -1 or NaN) weigh 0."""
  if kind == "span":
    w = jnp.ones(batch["start_positions"].shape, jnp.float32)
    loss = 0.5 * (_cross_entropy_sum(outputs["start_logits"], batch["start_positions"], w)
                  + _cross_entropy_sum(outputs["end_logits"], batch["end_positions"], w))
    return {"loss_sum": loss, "weight": jnp.sum(w)}
  labels = batch["label"] if "label" in batch else batch["label_ids"]
  if kind == "regression":
    w = (~jnp.isnan(labels)).astype(jnp.float32)
    err = outputs.reshape(labels.shape).astype(jnp.float32) - jnp.nan_to_num(labels)
    return {"loss_sum": jnp.sum(w * jnp.square(err)), "weight": jnp.sum(w)}
  w = batch["label_weights"].astype(jnp.float32) if "label_weights" in batch else (labels >= 0).astype(jnp.float32)
  return {"loss_sum": _cross_entropy_sum(outputs, labels, w), "weight": jnp.sum(w)}


def train_step(state: dict, batch: dict, *, model, tx, kind: str, freeze_encoder: bool):
  """One update of one trial. `state`: {"step", "params", "opt_state", "lr", "rng"}. -> (state, sums)."""
  rng = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])

  def loss_fn(params):
    if freeze_encoder:
      params = {**params, "bert": jax.lax.stop_gradient(params["bert"])}
    outputs = model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                          deterministic=False, rngs={"dropout": rng})
    sums = loss_sums(kind, outputs, batch)
    return sums["loss_sum"] / jnp.maximum(sums["weight"], 1.0), sums

  grads, sums = jax.grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  updates = jax.tree.map(lambda u: (u * state["lr"]).astype(u.dtype), updates)
  params = optax.apply_updates(state["params"], updates)
  return {**state, "step": state["step"] + 1, "params": params, "opt_state": opt_state}, sums


def predict_step(params, batch: dict, *, model):
  return model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                     deterministic=True)
