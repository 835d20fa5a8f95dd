"""Checkpoints of the train state and the data iterator, with orbax: async, keep-K, resume.

A checkpoint is `<dir>/<step>/{state, data}`: `state` the (sharded) TrainState, `data` every host's
input iterator state as JSON (`{"hosts": [...]}`, in process order), so a resumed run continues with the
very next batch on every host. Orbax writes every save
into a temporary directory and renames it when complete: a save interrupted mid-write is never listed,
so it can never become the latest step.

Failures: a save that fails (a full disk ...) raises `failures.SaveFailed` at the next `check()` (the
loop calls it every step) or `save()`, and its temporary directory is removed; the checkpoints
written before are left as they are. A step that cannot be read back (a truncated or garbled file)
is moved aside by `restore_latest` with a warning, and the newest readable one is restored.

A checkpoint saved with its encoder layers laid out otherwise (`model.scan_layers`) is restored through
`checkpoint_layout.py`, in the layout of the run that restores it.
"""

import base64
import json
import os
import sys
import time
from typing import Any

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from bert_jax import checkpoint_layout
from bert_jax import failures
from bert_jax import paths
from bert_jax.models import layouts


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

  def __init__(self, directory: str, *, keep: int | None = 3, async_save: bool = True, read_only: bool = False):
    # Temporary directories of saves cut short by a killed process are removed on creation; `read_only`
    # (another run's directory) creates, removes and saves nothing: that run may be saving right now.
    options = ocp.CheckpointManagerOptions(read_only=True) if read_only else ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=async_save, create=True, cleanup_tmp_directories=True)
    self.directory = epath.Path(paths.absolute(str(directory)))   # orbax refuses relative paths
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))
    self._in_flight = None    # the step of a save still being written in the background
    self._failed, self._failed_step = False, None

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state: Any, data_state: Any = None) -> bool:
    """Starts saving (returns before the write ends when async); False if `step` is already saved.

    Raises `failures.SaveFailed` when this save, or the one before it, failed.
    """
    self.check(wait=True)
    if step in self.manager.all_steps():
      return False
    hosts = _gather_from_hosts(_encode(data_state))
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave({"hosts": hosts}))
    try:
      saved = self.manager.save(step, args=args, force=True)
    except Exception as e:  # pylint: disable=broad-except  (the synchronous part of the write)
      self._fail(step, e)
    self._in_flight = step
    self.check()
    return saved

  def check(self, wait: bool = False) -> None:
    """Raises `failures.SaveFailed` if the last save failed; without `wait`, only once it has ended.

    Cheap (no waiting, no collective) while a save is still being written: call it every step.
    """
    if self._in_flight is None or (not wait and self.manager.is_saving_in_progress()):
      return
    step, self._in_flight = self._in_flight, None
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      self._fail(step, e)

  def _fail(self, step: int, error: Exception) -> None:
    self._failed, self._failed_step = True, step
    if isinstance(error, jax.errors.JaxRuntimeError) and jax.process_count() > 1:
      # A collective of the save failed (orbax's gathers and barriers): a peer is gone, not the disk.
      # The train loop's handler of failed collectives exits for a restart; nothing here to clean up.
      raise error
    self._wait_for_writes()
    removed = self._remove_temporary(step)
    kept = sorted(int(p.name) for p in self.directory.iterdir() if p.name.isdigit())   # on disk, not orbax's list
    message = " ".join(f"{type(error).__name__}: {error}".split())[:400]
    raise failures.SaveFailed(
        f"saving checkpoint {self.directory}/{step} failed ({message}). Training stopped here; "
        f"{len(removed)} temporary director{'y' if len(removed) == 1 else 'ies'} removed; the checkpoints "
        f"written before are intact: {kept or 'none'}. Free space or fix write access to {self.directory}, "
        "then start the same command again: it resumes from the latest of them.") from error

  def _wait_for_writes(self, timeout_s: float = 60.0) -> None:
    """Lets the other writes of a failed save end before their directory is removed under them.

    Orbax stops waiting at the first write that fails; the others are reachable only through its
    internals (hence the getattr: with another orbax version this waits for nothing).
    """
    async_manager = getattr(getattr(self.manager, "_checkpointer", None), "_async_manager", None)
    deadline = time.time() + timeout_s
    for future in getattr(async_manager, "_commit_futures", None) or ():
      try:
        future.result(timeout=max(0.0, deadline - time.time()))
      except Exception:  # pylint: disable=broad-except  (the failure being reported, or one like it)
        pass

  def _remove_temporary(self, step: int) -> list[str]:
    """Removes the step's `*.orbax-checkpoint-tmp*` directories (process 0: the directory is shared)."""
    if jax.process_index() != 0:
      return []
    removed = []
    for path in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
      for attempt in range(20):   # writes still ending (a synchronous save's) may add files meanwhile
        try:
          if path.is_dir():
            path.rmtree()
          elif path.exists():
            path.unlink()
          removed.append(os.fspath(path))
          break
        except OSError as e:
          if attempt == 19:
            logging.warning("could not remove %s: %s", path, e)
          time.sleep(0.25)
    return removed

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, Any]:
    """(state laid out as `abstract_state`'s shardings, data iterator state) at `step` (default latest)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    quiet_late_read_callbacks()
    # Saved in the other layer layout (another run's, or this run's before `scan_layers` changed): read as
    # saved, then laid out as `abstract_state` is.
    saved = checkpoint_layout.saved_params(self.directory, step) if layer_layout(abstract_state) else None
    target = checkpoint_layout.in_saved_layout(abstract_state, saved)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(target or abstract_state), data=ocp.args.JsonRestore())
    restored = self.manager.restore(step, args=args)
    hosts = restored.data["hosts"]
    if len(hosts) != jax.process_count():
      raise failures.UserError(
          f"checkpoint {self.directory}/{step} was written by {len(hosts)} hosts; this job has "
          f"{jax.process_count()}: the data position of each host cannot be carried over")
    state = checkpoint_layout.relaid(restored.state, abstract_state) if target else restored.state
    return state, _decode(hosts[jax.process_index()])

  def restore_latest(self, abstract_state: Any, move_aside: bool = True,
                     at_most: int | None = None) -> tuple[Any, Any, int | None]:
    """(state, data state, step) of the newest step (up to `at_most`) every host can read; (None, None,
    None) when there is no step.

    Steps newer than it that cannot be read (a truncated or garbled file, a missing item) are skipped
    with a warning naming them, and with `move_aside` renamed to `<step>.unreadable-<time>` so that
    they are neither restored nor kept as checkpoints again. When no step can be read, nothing is
    moved: the config more likely differs from the one they were written with (UserError).
    """
    unreadable = []
    for step in sorted((s for s in self.manager.all_steps() if at_most is None or s <= at_most), reverse=True):
      try:
        state, data_state = self.restore(abstract_state, step)
        error = None
      except failures.UserError:
        raise
      except Exception as e:  # pylint: disable=broad-except  (orbax, tensorstore, json: many kinds)
        state = data_state = None
        error = " ".join(f"{type(e).__name__}: {e}".split())[:300]
      errors = [e["error"] for e in _gather_from_hosts({"error": error}) if e["error"]]
      if not errors:
        for bad, why in unreadable:
          self._skip_unreadable(bad, why, move_aside)
        return state, data_state, step
      unreadable.append((step, errors[0]))
    if unreadable:
      step, error = unreadable[0]
      raise failures.UserError(
          f"none of the {len(unreadable)} checkpoints in {self.directory} can be restored; the latest, "
          f"step {step}: {error}. If the model or optimizer config changed since they were written, run "
          "with the config they were written with; if they are damaged, move them away to start over.")
    return None, None, None

  def _skip_unreadable(self, step: int, error: str, move_aside: bool) -> None:
    where = f"{self.directory}/{step}"
    if move_aside:
      where += f", moved to {self._move_aside(step)}"
    logging.warning("checkpoint %s (step %d) is unreadable, skipped (%s)", where, step, error)
    if jax.process_index() == 0:
      print(f"warning: checkpoint {where} (step {step}) is unreadable and was skipped: {error}", flush=True)

  def _move_aside(self, step: int) -> str:
    target = self.directory / f"{step}.unreadable-{time.strftime('%Y%m%dT%H%M%S')}"
    if jax.process_index() == 0:
      (self.directory / str(step)).rename(target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"checkpoint {step} moved aside")
    self.manager.reload()
    return os.fspath(target)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    if self._failed:   # the failure was reported; waiting would raise it again
      self._remove_late_temporary(self._failed_step)
      return
    self.check(wait=True)
    self.manager.close()

  def _remove_late_temporary(self, step: int, timeout_s: float = 10.0) -> None:
    """A write of the failed save that was still ending (on a loaded host) may have made its temporary
    directory again after `_fail` removed it: remove it until none has come back for half a second."""
    deadline, quiet_since = time.time() + timeout_s, time.time()
    while time.time() < deadline and time.time() - quiet_since < 0.5:
      if self._remove_temporary(step):
        quiet_since = time.time()
      time.sleep(0.1)


def quiet_late_read_callbacks() -> None:
  """Drops, for the rest of the process, the tracebacks a failed restore's other reads leave behind.

  When one array of a checkpoint cannot be read (a damaged file, or a shape the config changed), orbax
  ends the restore with that error while its other reads are under way, and Python prints what becomes
  of them as unraisable exceptions, hundreds of lines on stderr after the error or in a run that goes on
  from an older step (`restore_latest`):
  - a read that tensorstore completes after orbax closed the restore's event loop calls
    `call_soon_threadsafe` on the closed loop: `RuntimeError("Event loop is closed")`;
  - a read left unawaited is closed when collected, and its coroutine (orbax's
    `_read_array_index_and_device_put`) reports its own read error: "Exception ignored in: <coroutine ...>".
  Only these two are dropped, whatever restore they come from; the restore's own error is raised as before,
  and every other unraisable exception goes to the hook that was there.
  """
  previous = sys.unraisablehook
  if getattr(previous, "drops_late_read_callbacks", False):
    return

  def hook(unraisable) -> None:
    if not _late_read(unraisable):
      previous(unraisable)

  hook.drops_late_read_callbacks = True
  sys.unraisablehook = hook


def _late_read(unraisable) -> bool:
  """Whether an unraisable exception is one of a failed restore's other reads (`quiet_late_read_callbacks`)."""
  error, tb, where = unraisable.exc_value, unraisable.exc_traceback, unraisable.object
  if (type(error) is RuntimeError and str(error) == "Event loop is closed" and tb is not None
      and tb.tb_frame.f_code.co_name == "call_soon_threadsafe"):
    return True
  code = getattr(where, "cr_code", None)   # a coroutine's
  return (code is not None and code.co_name == "_read_array_index_and_device_put"
          and os.path.join("orbax", "checkpoint") in code.co_filename)


def split_path(path: str) -> tuple[str, int | None]:
  """"<dir>" -> (dir, None = latest); "<dir>/<step>" -> (dir, step)."""
  path = os.fspath(path).rstrip("/")
  base = os.path.basename(path)
  if base.isdigit():
    return os.path.dirname(path) or ".", int(base)   # a bare "<step>": the current directory's
  return path, None


def restore_state(path: str, abstract_state: Any) -> Any:
  """A TrainState from another run's checkpoint (`<dir>` = its latest step, or `<dir>/<step>`), its encoder
  layers stacked or one by one as `abstract_state` has them, whichever way they were saved
  (`checkpoint_layout.relayout`)."""
  directory, step = split_path(path)
  checkpointer = Checkpointer(directory, read_only=True)
  try:
    if step is None:   # the newest readable step; another run's directory is left as it is
      state, _, step = checkpointer.restore_latest(abstract_state, move_aside=False)
      if step is None:
        raise failures.UserError(f"{path} holds no checkpoint")
    else:
      state, _ = checkpointer.restore(abstract_state, step)
  finally:
    checkpointer.close()
  return state


# A run's encoder layers are saved in the layout it ran them in (`models/layouts.py`), the params and every
# tree laid out like them (Adam's moments) alike. A restore (another run started from the checkpoint, phase 2
# from phase 1's; or this run resumed with `scan_layers` changed) takes them in its own layout (`checkpoint_layout`).
layer_layout = layouts.layer_layout


def checkpoint_problem(path: str, items: tuple[str, ...] = ("state", "data")) -> str | None:
  """Why `path` (`<dir>` or `<dir>/<step>`) is not a `bert-jax pretrain` checkpoint; None if it is one."""
  directory, step = split_path(path)
  root = epath.Path(directory)
  if not (root / str(step) if step is not None else root).exists():
    return f"{path} does not exist"
  if step is None:
    steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())
    if not steps:
      hint = f" (a run's checkpoints are in {path}/checkpoints)" if (root / "checkpoints").exists() else ""
      return f"{path} holds no checkpoint steps (numbered directories){hint}"
    step = steps[-1]
  missing = [item for item in items if not (root / str(step) / item).exists()]
  if missing:
    return f"{directory}/{step} has no {' or '.join(missing)}: it is not a `bert-jax pretrain` checkpoint"
  return None


def restore_params(path: str, abstract_params: Any = None) -> Any:
  """Only the parameters of a pretraining checkpoint, e.g. to finetune from it.

  With `abstract_params` (ShapeDtypeStructs with shardings) they are restored sharded; without, as
  host numpy arrays, whatever mesh the checkpoint was written from.
  """
  directory, step = split_path(path)
  manager = checkpoint_layout.reader(directory)
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {directory}")
  quiet_late_read_callbacks()
  with checkpoint_layout.orbax_warnings_off():
    return _restore_params(manager, step, abstract_params)


def _restore_params(manager, step: int, abstract_params: Any) -> Any:
  metadata = manager.item_metadata(step).state
  param_meta = metadata["params"]
  if (target := checkpoint_layout.in_saved_layout(abstract_params, param_meta)) is not None:   # the other layer layout
    return checkpoint_layout.relaid(_restore_params(manager, step, target), abstract_params)
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
