"""A checkpoint's encoder layers in the layout of the run that restores it (`models/layouts.py`: scanned or
unrolled): the layout its params were saved in, read from its metadata, and trees (params, optimizer
moments, abstract restore targets) laid out anew. `checkpointing` restores through it.

`reader` is the read-only orbax manager that this module and `checkpointing.restore_params` read a
checkpoint's params with.
"""

import contextlib
from typing import Any

from absl import logging
import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_jax import failures
from bert_jax import paths
from bert_jax.models import layouts


def relayout(tree: Any, to: str, abstract: bool = False, saved: Any = None) -> Any:
  """Every dict of `tree` (params, optimizer moments) in layout `to`: arrays, or with `abstract`
  ShapeDtypeStructs whose NamedShardings gain or lose the layer axis (unsharded).

  A stack whose layers differ in their params (pre_norm's layer 0, which has no attention norm), in `tree`
  or in the `saved` params it is to match, is not laid out anew: scanned, its layer 0 holds an unused norm
  the unrolled stack lacks (a UserError)."""
  if layouts.uneven_layers(tree) or layouts.uneven_layers(saved):
    raise failures.UserError(
        "the checkpoint's encoder layers and this run's are laid out differently (model.scan_layers), and "
        "its layer 0 has params the others lack (pre_norm): run with scan_layers as it was saved")
  if abstract:
    def stack(*xs):
      return jax.ShapeDtypeStruct((len(xs),) + xs[0].shape, xs[0].dtype,
                                  sharding=NamedSharding(xs[0].sharding.mesh, P(None, *xs[0].sharding.spec)))

    def index(x, _):
      return jax.ShapeDtypeStruct(x.shape[1:], x.dtype,
                                  sharding=NamedSharding(x.sharding.mesh, P(*x.sharding.spec[1:])))
    convert = (lambda d: layouts.scan_params(d, stack=stack, fill=lambda x: x)) if to == layouts.SCANNED else (
        lambda d: layouts.unscan_params(d, index=index))
  else:
    convert = layouts.scan_params if to == layouts.SCANNED else layouts.unscan_params
  return convert(tree)


def in_saved_layout(abstract: Any, saved: Any) -> Any:
  """`abstract` (ShapeDtypeStructs) in the layer layout of the `saved` params' metadata where it differs from
  it, to restore them as saved; None where it does not (or either holds no encoder layers)."""
  stored, wanted = layouts.layer_layout(saved), layouts.layer_layout(abstract)
  return relayout(abstract, stored, abstract=True, saved=saved) if stored and wanted and stored != wanted else None


def relaid(state: Any, abstract_state: Any) -> Any:
  """`state` (restored in the other layout) in `abstract_state`'s layout and shardings."""
  return jax.device_put(relayout(state, layouts.layer_layout(abstract_state)),
                        jax.tree.map(lambda a: a.sharding, abstract_state))


def saved_params(directory: str, step: int | None) -> Any:
  """The metadata of the params saved at `step` (default the latest) in `directory`; None if there is no
  step or the state holds no params."""
  try:
    manager = reader(directory)
  except Exception:  # pylint: disable=broad-except  (the restore that follows reports what is wrong)
    return None
  try:
    with orbax_warnings_off():
      step = manager.latest_step() if step is None else step
      return None if step is None else manager.item_metadata(step).state["params"]
  except (KeyError, TypeError):   # no params in the state: nothing to lay out (a read that fails is raised,
    return None                   # and `restore_latest` takes the step as unreadable on every host)
  finally:
    manager.close()


def reader(directory: str):
  """A read-only orbax manager of `directory` whose `state` item reads as a pytree (whole, or in part)."""
  with orbax_warnings_off():
    return ocp.CheckpointManager(epath.Path(paths.absolute(str(directory))),
                                 item_handlers={"state": ocp.PyTreeCheckpointHandler()},
                                 options=ocp.CheckpointManagerOptions(read_only=True))


@contextlib.contextmanager
def orbax_warnings_off():
  """Orbax warns, on every read-only restore of one item, that the manager is read-only and that the
  other items are not restored: both are what `checkpointing.restore_params` asks for."""
  level = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    yield
  finally:
    logging.set_verbosity(level)
