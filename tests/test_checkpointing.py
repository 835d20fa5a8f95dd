"""Checkpointer: sharded round trip with the data-iterator state, keep-K, restore_params,
a save killed mid-write never becoming the latest checkpoint, a failed save, init_from checks."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_jax import checkpointing
from bert_jax import failures
from bert_jax import sharding
from configs import common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(mesh, scale=1.0):
  w = NamedSharding(mesh, P("fsdp", None))
  return {"params": {"w": jax.device_put(jnp.arange(32.0).reshape(8, 4) * scale, w),
                     "b": jax.device_put(jnp.ones(4) * scale, NamedSharding(mesh, P()))},
          "step": jnp.int32(int(scale))}


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def test_round_trip_keeps_shardings_and_data_state_and_last_k(tmp_path):
  mesh_config = common.mesh_config()
  mesh_config.fsdp = 4
  mesh = sharding.create_mesh(mesh_config)
  ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), keep=2)
  for step in (1, 2, 3):
    assert ckpt.save(step, _state(mesh, step), {"epoch": 0, "batch": step})
  assert not ckpt.save(3, _state(mesh, 3), {})   # already there: not written twice
  ckpt.close()

  ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), keep=2)
  assert ckpt.latest_step() == 3 and list(ckpt.manager.all_steps()) == [2, 3]
  state, data_state = ckpt.restore(_abstract(_state(mesh)))
  assert data_state == {"epoch": 0, "batch": 3}
  np.testing.assert_array_equal(state["params"]["w"], np.arange(32.0).reshape(8, 4) * 3)
  assert state["params"]["w"].sharding.spec == P("fsdp", None)
  state2, data2 = ckpt.restore(_abstract(_state(mesh)), step=2)
  assert int(state2["step"]) == 2 and data2["batch"] == 2
  ckpt.close()


def test_relative_paths_save_and_restore(tmp_path, monkeypatch):
  """A directory as a user types it (relative to the working directory) reaches orbax absolute."""
  monkeypatch.chdir(tmp_path)
  mesh = sharding.create_mesh(common.mesh_config())
  ckpt = checkpointing.Checkpointer("runs/a/checkpoints", async_save=False)
  assert ckpt.save(1, _state(mesh, 1), {"batch": 1})
  ckpt.close()
  assert (tmp_path / "runs/a/checkpoints/1/state").exists()
  ckpt = checkpointing.Checkpointer("runs/a/checkpoints", async_save=False)
  assert ckpt.restore(_abstract(_state(mesh)))[1] == {"batch": 1}
  ckpt.close()
  params = checkpointing.restore_params("runs/a/checkpoints/1")
  np.testing.assert_array_equal(params["w"], np.arange(32.0).reshape(8, 4))


def test_restoring_from_another_run_leaves_its_directory_as_it_is(tmp_path):
  """That run may be writing a checkpoint right now: its temporary directory stays, nothing is created."""
  mesh = sharding.create_mesh(common.mesh_config())
  ckpt = checkpointing.Checkpointer(str(tmp_path / "run"), async_save=False)
  assert ckpt.save(1, _state(mesh, 1))
  ckpt.close()
  in_flight = tmp_path / "run" / "2.orbax-checkpoint-tmp-1234567"
  in_flight.mkdir()
  before = sorted(os.listdir(tmp_path / "run"))
  state = checkpointing.restore_state(str(tmp_path / "run"), _abstract(_state(mesh)))
  np.testing.assert_array_equal(state["params"]["b"], np.ones(4))
  assert sorted(os.listdir(tmp_path / "run")) == before and in_flight.is_dir()


def test_bytes_iterator_state_round_trips(tmp_path):
  ckpt = checkpointing.Checkpointer(str(tmp_path), keep=1, async_save=False)
  ckpt.save(5, {"x": jnp.zeros(2)}, b"\x00\xffserialized")
  assert ckpt.restore({"x": jax.ShapeDtypeStruct((2,), jnp.float32)})[1] == b"\x00\xffserialized"
  ckpt.close()


def test_restore_params_only(tmp_path):
  mesh = sharding.create_mesh(common.mesh_config())
  ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), keep=3)
  ckpt.save(7, _state(mesh, 2.0), {})
  ckpt.close()
  host = checkpointing.restore_params(str(tmp_path / "ckpt"))   # latest step
  assert set(host) == {"w", "b"} and isinstance(host["w"], np.ndarray)
  np.testing.assert_array_equal(host["b"], np.full(4, 2.0))
  abstract = _abstract(_state(mesh))["params"]
  sharded = checkpointing.restore_params(str(tmp_path / "ckpt" / "7"), abstract)
  assert sharded["w"].sharding.spec == P("fsdp", None)
  np.testing.assert_array_equal(sharded["w"], np.arange(32.0).reshape(8, 4) * 2)


def test_save_killed_mid_write_never_becomes_latest(tmp_path):
  directory = str(tmp_path / "ckpt")
  # Step 1 completes; the async save of step 2 (200 MB) is cut short by the process dying.
  script = textwrap.dedent(f"""
      import os, jax.numpy as jnp
      from bert_jax import checkpointing
      ckpt = checkpointing.Checkpointer({directory!r}, keep=3)
      ckpt.save(1, {{"w": jnp.ones((4,))}}, {{"batch": 1}})
      ckpt.wait()
      ckpt.save(2, {{"w": jnp.ones((50_000_000,))}}, {{"batch": 2}})
      # Dies once step 2's temporary directory is there: a loaded machine's background write may not have
      # made it yet when `save` returns.
      while not any(name.startswith("2") for name in os.listdir({directory!r})):
        pass
      os._exit(0)
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, timeout=300)
  leftovers = [name for name in os.listdir(directory) if name.startswith("2")]
  assert leftovers and all("tmp" in name for name in leftovers), os.listdir(directory)   # really interrupted
  ckpt = checkpointing.Checkpointer(directory, keep=3)
  assert ckpt.latest_step() == 1
  state, data_state = ckpt.restore({"w": jax.ShapeDtypeStruct((4,), jnp.float32)})
  assert data_state == {"batch": 1}
  # The next save of step 2 succeeds despite the leftover.
  assert ckpt.save(2, {"w": jnp.zeros((4,))}, {"batch": 2})
  ckpt.close()
  assert checkpointing.Checkpointer(directory).latest_step() == 2


def test_split_path():
  assert checkpointing.split_path("/w/checkpoints/") == ("/w/checkpoints", None)
  assert checkpointing.split_path("/w/checkpoints/900000") == ("/w/checkpoints", 900000)
  assert checkpointing.split_path("3") == (".", 3)   # typed inside the checkpoints directory


def test_failed_save_raises_once_and_leaves_earlier_steps_and_no_temporary_files(tmp_path, monkeypatch):
  from orbax.checkpoint._src.handlers import json_checkpoint_handler  # pylint: disable=g-import-not-at-top
  from bert_jax import failures  # pylint: disable=g-import-not-at-top

  async def disk_full(self, x, directory):
    raise OSError(28, "No space left on device")

  for async_save in (True, False):
    directory = tmp_path / f"async_{async_save}"
    ckpt = checkpointing.Checkpointer(str(directory), keep=1, async_save=async_save)
    ckpt.save(1, {"w": jnp.ones(4)}, {"batch": 1})
    ckpt.wait()
    with monkeypatch.context() as m:
      m.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", disk_full)
      with pytest.raises(failures.SaveFailed, match=r"checkpoint .*/2 failed .*No space left on device.* intact: \[1\]"):
        ckpt.save(2, {"w": jnp.zeros(4)}, {"batch": 2})
        ckpt.check(wait=True)
    ckpt.close()   # the failure was reported: closing does not raise it again
    assert sorted(os.listdir(directory)) == ["1"]   # keep=1 did not drop step 1 for a step 2 that failed


def test_a_save_whose_collective_fails_is_a_lost_peer_not_a_failed_write(tmp_path, monkeypatch):
  """With several processes, a collective of the save that fails (a peer died during it) propagates as the
  runtime error the train loop turns into an exit for a restart; alone, the same error is a failed save."""
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  ckpt = checkpointing.Checkpointer(str(tmp_path / "checkpoints"), keep=1, async_save=False)

  def reset_by_peer():
    raise jax.errors.JaxRuntimeError("UNKNOWN: Gloo AllGather failed: Connection reset by peer")

  monkeypatch.setattr(ckpt.manager, "wait_until_finished", reset_by_peer)
  for processes, raised in ((2, jax.errors.JaxRuntimeError), (1, failures.SaveFailed)):
    monkeypatch.setattr(checkpointing.jax, "process_count", lambda n=processes: n)
    ckpt._in_flight = 8   # pylint: disable=protected-access  (a save under way)
    with pytest.raises(raised, match="Gloo AllGather failed") as caught:
      ckpt.check(wait=True)
    assert type(caught.value) is raised


def test_checkpoint_problem(tmp_path):
  ckpt = checkpointing.Checkpointer(str(tmp_path / "run" / "checkpoints"), keep=1, async_save=False)
  ckpt.save(3, {"w": jnp.ones(2)}, {})
  ckpt.close()
  assert checkpointing.checkpoint_problem(str(tmp_path / "run" / "checkpoints")) is None
  assert checkpointing.checkpoint_problem(str(tmp_path / "run" / "checkpoints" / "3")) is None
  assert "run/checkpoints" in checkpointing.checkpoint_problem(str(tmp_path / "run"))   # the hint
  assert "does not exist" in checkpointing.checkpoint_problem(str(tmp_path / "nowhere"))
  os.makedirs(tmp_path / "other" / "7")
  assert "has no state or data" in checkpointing.checkpoint_problem(str(tmp_path / "other"))


def _layered_state(mesh, scanned: bool, n=3, pre_norm=False):
  """A state with params and an optimizer tree laid out like them: encoder layers stacked or one by one
  (`pre_norm`: layer 0 without the others' norm when unrolled, as pre_norm's)."""
  w, b = NamedSharding(mesh, P("fsdp", None)), NamedSharding(mesh, P())
  layers = [{"kernel": jnp.arange(32.0).reshape(8, 4) + 100 * i, "bias": jnp.full(4, float(i))} for i in range(n)]
  if scanned:
    enc = {"layers": {"kernel": jax.device_put(jnp.stack([l["kernel"] for l in layers]),
                                               NamedSharding(mesh, P(None, "fsdp", None))),
                      "bias": jax.device_put(jnp.stack([l["bias"] for l in layers]), b)}}
    if pre_norm:
      enc["layers"]["norm"] = jax.device_put(jnp.ones((n, 4)), b)
  else:
    enc = {f"layer_{i}": {"kernel": jax.device_put(l["kernel"], w), "bias": jax.device_put(l["bias"], b),
                          **({"norm": jax.device_put(jnp.ones(4), b)} if pre_norm and i else {})}
           for i, l in enumerate(layers)}
  params = {"encoder": enc, "head": {"w": jax.device_put(jnp.ones((8, 4)), w)}}
  return {"params": params, "opt": (jnp.int32(3), jax.tree.map(lambda x: -x, params)), "step": jnp.int32(3)}


@pytest.mark.parametrize("saved_scanned", [True, False])
def test_another_runs_layers_are_restored_in_this_runs_layout(tmp_path, saved_scanned):
  """Phase 2 (unrolled) from phase 1's checkpoint saved scanned, and the other way round: the params and the
  trees laid out like them (Adam's moments) take the restoring run's layout and shardings, values kept."""
  mesh_config = common.mesh_config()
  mesh_config.fsdp = 4
  mesh = sharding.create_mesh(mesh_config)
  ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  ckpt.save(3, _layered_state(mesh, saved_scanned), {})
  ckpt.close()
  want = _layered_state(mesh, not saved_scanned)
  assert checkpointing.layer_layout(want) == ("unrolled" if saved_scanned else "scanned")
  state = checkpointing.restore_state(str(tmp_path / "ckpt"), _abstract(want))
  assert jax.tree.structure(state) == jax.tree.structure(want)
  jax.tree.map(np.testing.assert_array_equal, state, want)
  specs = lambda tree: jax.tree.map(lambda x: x.sharding.spec, (tree["params"], tree["opt"][1]))   # noqa: E731
  assert specs(state) == specs(want)
  params = checkpointing.restore_params(str(tmp_path / "ckpt" / "3"), _abstract(want)["params"])
  jax.tree.map(np.testing.assert_array_equal, params, want["params"])
  # Without an abstract tree the params come back as saved.
  assert checkpointing.layer_layout(checkpointing.restore_params(str(tmp_path / "ckpt"))) == (
      "scanned" if saved_scanned else "unrolled")


def test_a_run_resumed_with_its_layers_scanned_takes_its_own_checkpoint(tmp_path):
  """Resuming (`restore_latest`) after `model.scan_layers` changed lays the run's own checkpoint out anew."""
  mesh = sharding.create_mesh(common.mesh_config())
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(3, _layered_state(mesh, scanned=False), {"batch": 3})
  ckpt.close()
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  want = _layered_state(mesh, scanned=True)
  state, data_state, step = ckpt.restore_latest(_abstract(want))
  ckpt.close()
  assert (step, data_state) == (3, {"batch": 3})
  jax.tree.map(np.testing.assert_array_equal, state, want)


@pytest.mark.parametrize("saved_scanned", [True, False])
def test_a_pre_norm_stack_in_the_other_layout_is_refused_by_name(tmp_path, saved_scanned):
  """Layer 0 of a pre_norm stack has no attention norm unrolled and an unused one scanned: not laid out
  anew, and the error says how to run instead of calling every step unreadable."""
  mesh = sharding.create_mesh(common.mesh_config())
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(3, _layered_state(mesh, saved_scanned, pre_norm=True), {})
  ckpt.close()
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  with pytest.raises(failures.UserError, match="pre_norm.*scan_layers as it was saved"):
    ckpt.restore_latest(_abstract(_layered_state(mesh, not saved_scanned, pre_norm=True)))
  ckpt.close()
  assert sorted(os.listdir(tmp_path)) == ["3"]   # nothing moved aside
