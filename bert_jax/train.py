"""Pretraining: the sharded setup (`setup`) and the loop (`train_and_evaluate`), the CLI's one call.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny

The train state is never built unsharded: `jax.eval_shape(init)` gives its shapes and logical axis
names, the config's rules map those to the mesh, and `init` is jitted with those out_shardings.
"""

import dataclasses
import functools
import json
import math
import os
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from bert_jax import checkpointing
from bert_jax import heads
from bert_jax import model as model_lib
from bert_jax import optimizer as optimizer_lib
from bert_jax import sharding
from bert_jax import steps

TrainState = steps.TrainState
SENTENCE_FORMATS = ("nsp", "sop")
FORMATS = SENTENCE_FORMATS + ("full_sentences", "doc_sentences")


# ---------------------------------------------------------------------------------------------
# Model, batch shapes and validation
# ---------------------------------------------------------------------------------------------


def bert_config(config: ml_collections.ConfigDict) -> model_lib.BertConfig:
  """`config.model` (a preset plus the fields that are set) and `config.dtype` -> BertConfig."""
  fields = {k: v for k, v in config.model.items() if k != "preset" and v is not None}
  return model_lib.BertConfig.from_preset(config.model.preset, dtype=config.dtype, **fields)


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  return heads.BertForPreTraining(bert_config(config), use_nsp=config.data.format in SENTENCE_FORMATS,
                                  mlm_all_positions=config.mlm_all_positions)


def abstract_batch(config: ml_collections.ConfigDict, batch_size: int | None = None) -> dict:
  """Global shapes and dtypes of a batch (docs/architecture.md), `global_batch_size` rows by default."""
  d = config.data
  b = config.global_batch_size if batch_size is None else batch_size
  l, p, k = d.seq_length, d.max_predictions_per_seq, d.max_examples_per_row
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  batch = {"input_ids": i32(b, l), "input_mask": i32(b, l), "segment_ids": i32(b, l),
           "masked_lm_positions": i32(b, p), "masked_lm_ids": i32(b, p),
           "masked_lm_weights": jax.ShapeDtypeStruct((b, p), jnp.float32)}
  if d.packing:
    batch.update(position_ids=i32(b, l), example_ids=i32(b, l))
  if d.format in SENTENCE_FORMATS:
    if d.packing:
      batch.update(next_sentence_labels=i32(b, k), next_sentence_positions=i32(b, k),
                   next_sentence_weights=jax.ShapeDtypeStruct((b, k), jnp.float32))
    else:
      batch["next_sentence_labels"] = i32(b)
  return batch


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Stops a config that cannot work with a clear message, before anything is compiled."""
  num_devices = jax.device_count() if num_devices is None else num_devices
  d, problems = config.data, []
  cfg = bert_config(config)   # also checks the model fields (e.g. hidden size vs heads)
  if d.format not in FORMATS:
    problems.append(f"data.format {d.format!r} is not one of {FORMATS}")
  if d.seq_length > cfg.max_position_embeddings:
    problems.append(f"data.seq_length {d.seq_length} exceeds the model's {cfg.max_position_embeddings} "
                    "position embeddings (model.max_position_embeddings)")
  if d.max_predictions_per_seq > d.seq_length:
    problems.append(f"data.max_predictions_per_seq {d.max_predictions_per_seq} > seq_length {d.seq_length}")
  if config.optimizer.name not in ("adamw", "lamb"):
    problems.append(f"optimizer.name {config.optimizer.name!r} is not 'adamw' or 'lamb'")
  if config.train_steps <= 0 or config.optimizer.total_steps <= 0:
    problems.append("train_steps and optimizer.total_steps must be positive")
  try:
    shape = dict(zip(sharding.MESH_AXES, sharding.mesh_shape(config.mesh, num_devices)))
    dcn = dict(zip(sharding.MESH_AXES, sharding.dcn_mesh_shape(config.mesh)))
    dp = math.prod(shape[a] * dcn[a] for a in sharding.BATCH_AXES)
    rows = dp * config.micro_batches
    if config.global_batch_size % rows:
      problems.append(f"global_batch_size {config.global_batch_size} is not divisible by data-parallel size "
                      f"{dp} (mesh data x fsdp) x micro_batches {config.micro_batches}")
  except ValueError as e:
    problems.append(f"mesh: {e}")
  if config.global_batch_size % jax.process_count():
    problems.append(f"global_batch_size {config.global_batch_size} not divisible by {jax.process_count()} hosts")
  if problems:
    raise ValueError("invalid config:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------
# Sharded setup
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything the loop (and `aot`, `bench train`) needs, all sharded over `mesh`."""
  model: nn.Module
  tx: optax.GradientTransformation
  mesh: Mesh
  abstract_state: TrainState          # ShapeDtypeStructs carrying their shardings
  state_shardings: TrainState         # NamedShardings
  batch_shardings: dict[str, NamedSharding]
  init: Callable[[jax.Array], TrainState]        # rng -> state, jitted with out_shardings
  train_step: Callable[..., tuple[TrainState, dict]]   # (state, batch, rng); donates state
  eval_step: Callable[..., dict]                 # (params, batch) -> loss sums


def _in_mesh_context(fn: Callable, mesh: Mesh, rules) -> Callable:
  """`fn` traced with the logical axis rules and the (abstract) mesh the model's constraints need."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
      return fn(*args, **kwargs)
  return wrapped


def setup(config: ml_collections.ConfigDict, mesh: Mesh) -> Setup:
  """Model, optimizer, abstract sharded state and the jitted init/train/eval functions."""
  model = build_model(config)
  tx = optimizer_lib.create_optimizer(config.optimizer)
  rules = sharding.logical_rules(config)
  init_batch = {k: jnp.zeros(s.shape, s.dtype) for k, s in abstract_batch(config, batch_size=1).items()}

  def init_boxed(rng):   # params still wrapped with their logical axis names
    params = model.init({"params": rng, "dropout": rng}, init_batch, deterministic=True)["params"]
    zero = jnp.zeros([], jnp.int32)
    return TrainState(step=zero, params=params, opt_state=tx.init(params), nonfinite_count=zero,
                      nonfinite_streak=zero)

  init_fn = _in_mesh_context(lambda rng: nn.unbox(init_boxed(rng)), mesh, rules)
  rng_shape = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  logical_specs = nn.get_partition_spec(jax.eval_shape(_in_mesh_context(init_boxed, mesh, rules), rng_shape))
  state_shardings = sharding.logical_to_shardings(logical_specs, mesh, rules)
  abstract_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                jax.eval_shape(init_fn, rng_shape), state_shardings)
  batch_shardings = {k: sharding.batch_sharding(mesh) for k in abstract_batch(config)}
  replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())

  train_fn = functools.partial(steps.train_step, model=model, tx=tx, config=config)
  eval_fn = functools.partial(steps.eval_step, model=model, config=config)
  return Setup(
      model=model, tx=tx, mesh=mesh, abstract_state=abstract_state, state_shardings=state_shardings,
      batch_shardings=batch_shardings,
      init=jax.jit(init_fn, in_shardings=replicated, out_shardings=state_shardings),
      train_step=jax.jit(_in_mesh_context(train_fn, mesh, rules),
                         in_shardings=(state_shardings, batch_shardings, replicated),
                         out_shardings=(state_shardings, replicated), donate_argnums=(0,)),
      eval_step=jax.jit(_in_mesh_context(eval_fn, mesh, rules),
                        in_shardings=(state_shardings.params, batch_shardings), out_shardings=replicated),
  )
