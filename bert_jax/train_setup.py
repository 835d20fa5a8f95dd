"""The sharded setup of a pretraining run (`setup`): the model, its batch shapes and random keys, and the
train state's shapes and shardings with the jitted init and steps; bert_jax/train.py runs the loop on it.

The train state is never built unsharded: `jax.eval_shape(init)` gives its shapes and logical axis
names, the config's rules map those to the mesh, and `init` is jitted with those out_shardings.
"""

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from bert_jax import objectives
from bert_jax import optimizer as optimizer_lib
from bert_jax import run_checks
from bert_jax import sharding
from bert_jax import steps
from bert_jax.models import dropout_key
from bert_jax.models import flash_dropout

TrainState = steps.TrainState



# ---------------------------------------------------------------------------------------------
# Model, batch shapes and randomness
# ---------------------------------------------------------------------------------------------


def build_model(config: ml_collections.ConfigDict) -> nn.Module:
  """The pretraining model of the config's objective (encoder + heads)."""
  return objectives.get(config).build_model(config)


def abstract_batch(config: ml_collections.ConfigDict, batch_size: int | None = None) -> dict:
  """Global shapes and dtypes of a batch, `global_batch_size` rows by default: the objective's schema."""
  b = config.global_batch_size if batch_size is None else batch_size
  schema = objectives.get(config).batch_schema(config.data, b)
  return {name: jax.ShapeDtypeStruct(f.shape, f.dtype) for name, f in schema.items()}


def rngs(config: ml_collections.ConfigDict) -> tuple[jax.Array, jax.Array]:
  """(parameter init key, dropout key) from `config.seed`; the dropout key of `config.dropout_rng`'s
  implementation. The train step folds the step into the dropout key, so a resume replays it."""
  init_rng, dropout_rng = jax.random.split(jax.random.key(config.seed))
  impl = run_checks.dropout_rng(config)
  if impl != run_checks.DROPOUT_RNGS[0]:
    dropout_rng = jax.random.fold_in(jax.random.key(config.seed, impl=dropout_key.impl(impl)), 1)
  return init_rng, dropout_rng


# ---------------------------------------------------------------------------------------------
# Sharded setup
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FrozenStep:
  """A jitted step whose last argument is the run's frozen variables (`base.Frozen`), called and lowered
  without them: `step(state, batch, rng)`, `step.lower(...)`. `frozen` is {} for most objectives, abstract
  (ShapeDtypeStructs) until `load_frozen`."""
  jitted: Any
  frozen: Any

  def __call__(self, *args):
    return self.jitted(*args, self.frozen)

  def lower(self, *args):
    return self.jitted.lower(*args, self.frozen)


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything the loop (and `aot`, `bench train`) needs, all sharded over `mesh`."""
  objective: Any                      # the module of `config.objective` (bert_jax/objectives/)
  model: nn.Module
  tx: optax.GradientTransformation
  mesh: Mesh
  abstract_state: TrainState          # ShapeDtypeStructs carrying their shardings
  state_shardings: TrainState         # NamedShardings
  batch_shardings: dict[str, NamedSharding]
  init: Callable[[jax.Array], TrainState]        # rng -> state, jitted with out_shardings
  train_step: FrozenStep              # (state, batch, rng) -> (state, metrics); donates state
  eval_step: FrozenStep               # (params, batch) -> loss sums
  frozen_spec: Any = None             # the objective's base.Frozen, or None
  frozen_shardings: Any = dataclasses.field(default_factory=dict)
  # (fresh params, frozen) -> a new run's params (base.Frozen.init_params), jitted; None: keep them.
  init_params: Callable[..., Any] | None = None
  # rng -> frozen variables at random values, sharded (benchmarks and tests: shapes are what matter).
  init_frozen: Callable[..., Any] | None = None

  @property
  def frozen(self):
    """The frozen variables the steps are bound to: {}, abstract, or loaded arrays (`load_frozen`)."""
    return self.train_step.frozen

  def with_frozen(self, frozen) -> "Setup":
    """This Setup with its steps bound to `frozen` (device arrays sharded by `frozen_shardings`)."""
    return dataclasses.replace(self, train_step=dataclasses.replace(self.train_step, frozen=frozen),
                               eval_step=dataclasses.replace(self.eval_step, frozen=frozen))


def _in_mesh_context(fn: Callable, mesh: Mesh, rules) -> Callable:
  """`fn` traced with the logical axis rules and the (abstract) mesh the model's constraints need."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with (jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules),
          flash_dropout.compiling_for(mesh.devices.flat[0].device_kind)):
      return fn(*args, **kwargs)
  return wrapped


def _sharded_abstract(boxed_fn: Callable, mesh: Mesh, rules) -> tuple:
  """(abstract tree with shardings, shardings) of `boxed_fn(rng)`, a tree with logical axis names."""
  rng_shape = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  shardings = sharding.logical_to_shardings(
      nn.get_partition_spec(jax.eval_shape(_in_mesh_context(boxed_fn, mesh, rules), rng_shape)), mesh, rules)
  unboxed = jax.eval_shape(_in_mesh_context(lambda rng: nn.unbox(boxed_fn(rng)), mesh, rules), rng_shape)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), unboxed, shardings)
  return abstract, shardings


def setup(config: ml_collections.ConfigDict, mesh: Mesh) -> Setup:
  """Model, optimizer, abstract sharded state and the jitted init/train/eval functions.

  The steps are bound to the objective's frozen variables as abstract values: `load_frozen` binds the
  real ones before a run steps; `aot` compiles with the abstract ones.
  """
  objective = objectives.get(config)
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
  abstract_state, state_shardings = _sharded_abstract(init_boxed, mesh, rules)
  frozen_spec = objective.frozen(config) if hasattr(objective, "frozen") else None
  abstract_frozen, frozen_shardings = _sharded_abstract(frozen_spec.init, mesh, rules) if frozen_spec else ({}, {})
  batch_shardings = {k: sharding.batch_sharding(mesh) for k in abstract_batch(config)}
  replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())

  train_fn = functools.partial(steps.train_step, model=model, tx=tx, config=config)
  eval_fn = functools.partial(steps.eval_step, model=model, config=config)
  init_params = None
  if frozen_spec is not None and frozen_spec.init_params is not None:
    init_params = jax.jit(_in_mesh_context(frozen_spec.init_params, mesh, rules),
                          in_shardings=(state_shardings.params, frozen_shardings),
                          out_shardings=state_shardings.params)
  return Setup(
      objective=objective, model=model, tx=tx, mesh=mesh, abstract_state=abstract_state,
      state_shardings=state_shardings, batch_shardings=batch_shardings,
      init=jax.jit(init_fn, in_shardings=replicated, out_shardings=state_shardings),
      train_step=FrozenStep(jax.jit(_in_mesh_context(train_fn, mesh, rules),
                                    in_shardings=(state_shardings, batch_shardings, replicated, frozen_shardings),
                                    out_shardings=(state_shardings, replicated), donate_argnums=(0,)),
                            abstract_frozen),
      eval_step=FrozenStep(jax.jit(_in_mesh_context(eval_fn, mesh, rules),
                                   in_shardings=(state_shardings.params, batch_shardings, frozen_shardings),
                                   out_shardings=replicated), abstract_frozen),
      frozen_spec=frozen_spec, frozen_shardings=frozen_shardings, init_params=init_params,
      init_frozen=frozen_spec and jax.jit(_in_mesh_context(lambda rng: nn.unbox(frozen_spec.init(rng)), mesh, rules),
                                          in_shardings=replicated, out_shardings=frozen_shardings),
  )


def load_frozen(s: Setup) -> Setup:
  """`s` with its steps bound to the objective's real frozen variables (a teacher checkpoint), put on the
  mesh with their shardings; `s` itself when the objective has none."""
  if s.frozen_spec is None:
    return s
  host = s.frozen_spec.load()
  want = jax.tree.map(lambda a: (a.shape, jnp.dtype(a.dtype)), s.frozen)
  got = jax.tree.map(lambda a: (tuple(np.shape(a)), jnp.dtype(a.dtype)), host)
  if want != got:
    raise ValueError(f"frozen variables do not match the model:\n expected {want}\n got {got}")
  return s.with_frozen(put_sharded(host, s.frozen_shardings))


def put_sharded(host_tree, shardings):
  """Host arrays (whole on every process) -> global arrays with `shardings`, each device taking its slice."""
  return jax.tree.map(lambda a, sh: jax.make_array_from_callback(a.shape, sh, lambda i: a[i]), host_tree, shardings)
