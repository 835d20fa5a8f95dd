"""The stacked, sharded state of the trials that train together (bert_jax/finetune/trainer.py): its layout
on the mesh, its initialisation from a pretrained encoder, and each trial's `last/` checkpoint.
"""

import os

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpointing
from bert_jax import sharding

Config = ml_collections.ConfigDict


# ------------------------------------------------------------------------------------------------
# Sharded state of T stacked trials.


def _stacked(shardings, trial_axis):
  """Shardings of one trial -> shardings with a leading trial axis (replicated, or over `trial_axis`)."""
  return jax.tree.map(lambda s: NamedSharding(s.mesh, PartitionSpec(trial_axis, *s.spec)), shardings)


def layout(config: Config, mesh, num_trials: int):
  """(logical rules, mesh axis of the trial dimension, mesh axes of a trial's batch dimension).

  By default every trial is data parallel over all devices. With `trials_over_devices` the trial axis
  is split over the mesh's `data` axis, so each group of devices holds whole trials and splits their
  batches over `fsdp` only.
  """
  rules = sharding.logical_rules(config)
  if not config.trials_over_devices:
    return rules, None, sharding.BATCH_AXES
  if num_trials % mesh.shape["data"]:
    raise ValueError(f"{num_trials} trials cannot be split over data={mesh.shape['data']} device groups")
  rules = tuple((name, "fsdp" if name == "activation_batch" else axes) for name, axes in rules)
  return rules, "data", ("fsdp",)


def init_state(model, tx, configs, encoder_params, mesh, rules, seq_len: int, trial_axis=None):
  """The stacked state, built sharded (never whole on one device); returns (state, its shardings)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  init_one = lambda rng: model.init({"params": rng, "dropout": rng}, ids, ids, ids)["params"]
  abstract = jax.eval_shape(init_one, jax.random.key(0))
  param_shardings = _stacked(sharding.logical_to_shardings(nn.get_partition_spec(abstract), mesh, rules),
                             trial_axis)
  if encoder_params is not None:
    expected = jax.eval_shape(lambda r: nn.unbox(init_one(r)), jax.random.key(0))["bert"]
    check_encoder_shapes(expected, encoder_params)
    encoder_params = without_unused_pooler(expected, encoder_params)

  def init_params(rngs, encoder):
    params = jax.vmap(lambda r: nn.unbox(init_one(r)))(rngs)
    if encoder is not None:  # a pooler the checkpoint lacks stays as initialised
      loaded = jax.tree.map(lambda e, p: jnp.broadcast_to(e.astype(p.dtype), p.shape), encoder,
                            {k: params["bert"][k] for k in encoder})
      params["bert"] = {**params["bert"], **loaded}
    return params

  keys = [jax.random.split(jax.random.key(c.seed)) for c in configs]
  params = jax.jit(init_params, out_shardings=param_shardings)(jnp.stack([k[0] for k in keys]), encoder_params)
  opt_state = jax.jit(jax.vmap(tx.init))(params)
  replicated = NamedSharding(mesh, PartitionSpec())
  state = {"step": jnp.zeros(len(configs), jnp.int32), "params": params, "opt_state": opt_state,
           "lr": jnp.asarray([c.learning_rate for c in configs], jnp.float32),
           "rng": jnp.stack([jax.random.key_data(k[1]) for k in keys])}  # raw uint32: checkpointable
  state = {k: (v if k in ("params", "opt_state") else jax.device_put(v, replicated)) for k, v in state.items()}
  return state, jax.tree.map(lambda x: x.sharding, state)


def check_encoder_shapes(expected, encoder_params) -> None:
  """Raises ValueError unless the checkpoint's encoder has the model's shapes; a missing pooler (ELECTRA and
  DistilBERT save none) is allowed and is then newly initialised, as transformers does."""
  expected = jax.tree.map(lambda x: tuple(x.shape), expected)
  got = jax.tree.map(lambda x: tuple(np.shape(x)), without_unused_pooler(expected, encoder_params))
  if "pooler" in expected and "pooler" not in got:
    logging.warning("the checkpoint's encoder has no pooler: it is newly initialised")
    expected = {k: v for k, v in expected.items() if k != "pooler"}
  if expected != got:
    raise ValueError(f"checkpoint encoder does not match the model:\n expected {expected}\n got {got}")


def without_unused_pooler(expected, encoder_params: dict) -> dict:
  """The checkpoint's encoder less its pooler when the model has none (a head on "cls" or "mean")."""
  if "pooler" in encoder_params and "pooler" not in expected:
    return {k: v for k, v in encoder_params.items() if k != "pooler"}
  return encoder_params


def trial(tree, t: int):
  return jax.tree.map(lambda x: x[t], tree)


def save_last(state, workdirs) -> None:
  for t, w in enumerate(workdirs):
    ckpt = checkpointing.Checkpointer(os.path.join(w, "last"), keep=1, async_save=False)
    ckpt.save(int(jax.device_get(state["step"][t])), trial(state, t))
    ckpt.close()


def restore_last(state, shardings, workdirs):
  """The stacked state from every trial's `last/`, or None when any trial has none."""
  dirs = [os.path.join(w, "last") for w in workdirs]
  if not all(os.path.isdir(d) and checkpointing.Checkpointer(d, keep=1).latest_step() is not None for d in dirs):
    return None
  one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), state)
  trials = [checkpointing.Checkpointer(d, keep=1).restore(one)[0] for d in dirs]
  return jax.tree.map(lambda s, *xs: jax.device_put(np.stack(xs), s), shardings, *trials)
