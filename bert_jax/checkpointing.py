"""Checkpoints of the train state and the data iterator, with orbax: async, keep-K, resume, preemption.

A checkpoint is `<dir>/<step>/{state, data}`: `state` the (sharded) TrainState, `data` every host's
input iterator state as JSON (`{"hosts": [...]}`, in process order), so a resumed run continues with the
very next batch on every host. Orbax writes every save
into a temporary directory and renames it when complete: a save interrupted mid-write is never listed,
so it can never become the latest step.
"""

import base64
import json
import os
import signal
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils


def _encode(data_state: Any) -> dict:
  """The iterator state as a JSON object (bytes, e.g. a serialized tf.data iterator, as base64)."""
  if isinstance(data_state, bytes):
    return {"b64": base64.b64encode(data_state).decode("ascii")}
  return {"json": data_state}


def _decode(item: dict) -> Any:
  return base64.b64decode(item["b64"]) if "b64" in item else item["json"]


def _gather_from_hosts(item: dict) -> list[dict]:
  """Every host's JSON item, in process order (a collective: all hosts call it at the same step).

  Each host reads its own share of the data, so each has its own iterator position to save.
  """
  if jax.process_count() == 1:
    return [item]
  encoded = np.frombuffer(json.dumps(item).encode("utf-8"), np.uint8)
  longest = int(np.max(multihost_utils.process_allgather(np.array([encoded.size], np.int32))))
  padded = np.zeros(longest, np.uint8)
  padded[:encoded.size] = encoded
  rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(jax.process_count(), longest)
  return [json.loads(bytes(row).rstrip(b"\0").decode("utf-8")) for row in rows]


class Checkpointer:
  """`CheckpointManager` for items `state` (pytree) and `data` (JSON) under `directory`."""

  def __init__(self, directory: str, *, keep: int | None = 3, async_save: bool = True):
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    self.directory = epath.Path(directory)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: Any = None) -> bool:
    """Starts saving (returns before the write ends when async); False if `step` is already saved."""
    if step in self.manager.all_steps():
      return False
    hosts = _gather_from_hosts(_encode(data_state))
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave({"hosts": hosts}))
    return self.manager.save(step, args=args, force=True)

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, Any]:
    """(state laid out as `abstract_state`'s shardings, data iterator state) at `step` (default latest)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
    restored = self.manager.restore(step, args=args)
    hosts = restored.data["hosts"]
    if len(hosts) != jax.process_count():
      raise ValueError(f"checkpoint {self.directory}/{step} was written by {len(hosts)} hosts; this job has "
                       f"{jax.process_count()}: the data position of each host cannot be carried over")
    return restored.state, _decode(hosts[jax.process_index()])

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def split_path(path: str) -> tuple[str, int | None]:
  """"<dir>" -> (dir, None = latest); "<dir>/<step>" -> (dir, step)."""
  path = os.fspath(path).rstrip("/")
  base = os.path.basename(path)
  if base.isdigit():
    return os.path.dirname(path), int(base)
  return path, None


def restore_state(path: str, abstract_state: Any) -> Any:
  """A TrainState from another run's checkpoint (`<dir>` = its latest step, or `<dir>/<step>`)."""
  directory, step = split_path(path)
  checkpointer = Checkpointer(directory, keep=None, async_save=False)
  try:
    state, _ = checkpointer.restore(abstract_state, step)
  finally:
    checkpointer.close()
  return state


def restore_params(path: str, abstract_params: Any = None) -> Any:
  """Only the parameters of a pretraining checkpoint, e.g. to finetune from it.

  With `abstract_params` (ShapeDtypeStructs with shardings) they are restored sharded; without, as
  host numpy arrays, whatever mesh the checkpoint was written from.
  """
  directory, step = split_path(path)
  manager = ocp.CheckpointManager(epath.Path(directory), item_handlers={"state": ocp.PyTreeCheckpointHandler()},
                                  options=ocp.CheckpointManagerOptions(read_only=True))
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  metadata = manager.item_metadata(step).state
  param_meta = metadata["params"]
  if abstract_params is None:
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), param_meta)
  else:
    restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_params)
  # Restore only `params`: the other entries of the state (optimizer moments, counters) are skipped.
  target = {"params": param_meta if abstract_params is None else abstract_params}
  args = ocp.args.PyTreeRestore(item=target, restore_args={"params": restore_args}, partial_restore=True)
  restored = manager.restore(step, args=ocp.args.Composite(state=args))
  manager.close()
  return restored.state["params"]


class PreemptionWatcher:
  """Tells the loop when to save and stop after SIGTERM, at a step boundary agreed by all hosts.

  One process: a SIGTERM handler sets a flag. Several processes: JAX's preemption service (started
  by `jax.distributed.initialize`) spreads the notice and picks the same step on every host.
  """

  def __init__(self):
    self._signalled = False
    self._multihost = jax.process_count() > 1
    if not self._multihost:
      signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame):
    del signum, frame
    self._signalled = True

  def reached(self, step: int) -> bool:
    """True at the step where every host should save and exit. Call it at every step."""
    if self._multihost:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._signalled

  def close(self) -> None:
    if not self._multihost:
      signal.signal(signal.SIGTERM, signal.SIG_DFL)
