"""Each way a pretraining run fails, on the tiny config: one message naming the file, field or step
(before compiling where it can be known), the exit code of its kind, and no checkpoint written before
is lost. A two-process run that loses a host is in test_multihost.py."""

import asyncio
import errno
import gc
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from bert_jax import checkpointing
from bert_jax import failures
from bert_jax import sharding
from bert_jax import train
from bert_jax import train_setup
from conftest import compilation_cache_env
from test_train import REPO, TINY, compilation_cache, data_dir, read_metrics, tiny_config  # noqa: F401

# Token types 2 and 3 never occur: their embedding rows get exactly zero gradient, and Adam with
# optimizer.eps = 0 makes their update 0 / 0 while loss and gradient stay finite.
RUN = {"train_steps": 4, "checkpoint_every": 2, "keep_checkpoints": 3, "eval_steps": 0, "fill_mask_examples": 0,
       "model.type_vocab_size": 4}


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):  # noqa: F811
  """A run of 4 steps with checkpoints at steps 2 and 4; tests break a copy of it."""
  workdir = str(tmp_path_factory.mktemp("trained") / "run")
  train.train_and_evaluate(tiny_config(data_dir, **RUN), workdir)
  return workdir


def _copy(path, tmp_path, name="run") -> str:
  shutil.copytree(path, tmp_path / name, symlinks=True)
  return str(tmp_path / name)


def _checkpoints(workdir) -> list[str]:
  return sorted(os.listdir(os.path.join(workdir, "checkpoints")))


def _params_are_finite(workdir, step) -> bool:
  params = checkpointing.restore_params(os.path.join(workdir, "checkpoints", str(step)))
  return all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def _record_ends(path) -> list[int]:
  """Byte offsets where the records of a TFRecord file end (length, crc, data, crc)."""
  ends, offset, data = [], 0, open(path, "rb").read()
  while offset < len(data):
    offset += 8 + 4 + struct.unpack("<Q", data[offset:offset + 8])[0] + 4
    ends.append(offset)
  return ends


# ---------------------------------------------------------------------------------------------
# Rotten data: every shard is checked against what `prepare` recorded in stats.json.


def _cut_at_record(path, stats=None, inside=0):
  ends = _record_ends(path)
  with open(path, "r+b") as f:
    f.truncate(ends[len(ends) // 2 - 1] + inside)
  if stats:   # stats.json of an older `prepare`, without sizes: the reader itself sees the damage
    with open(stats) as f:
      content = json.load(f)
    for shard in content["shards"].values():
      shard.pop("bytes", None)
    with open(stats, "w") as f:
      json.dump(content, f)


def _garble(path, stats=None):
  del stats
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF   # same size: the record's CRC catches it
  open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("damage, message", [
    (lambda shard, stats: _cut_at_record(shard), r"has \d+ bytes but .*stats.json records \d+: it was cut short"),
    (_cut_at_record, r"holds 18 documents but .*stats.json records 37: it was cut short"),
    (lambda shard, stats: _cut_at_record(shard, stats, inside=30), "cannot be read: .*truncated record"),
    (_garble, "cannot be read: .*corrupted record"),
], ids=["cut_at_a_record", "cut_at_a_record_older_stats", "cut_inside_a_record_older_stats", "garbled"])
@pytest.mark.slow
def test_damaged_shard_is_named_before_training(damage, message, data_dir, trained, tmp_path):  # noqa: F811
  data = _copy(data_dir, tmp_path, "data")
  shard = os.path.join(data, "train-00000-of-00002.tfrecord")
  damage(shard, os.path.join(data, "stats.json"))
  workdir = _copy(trained, tmp_path)
  with pytest.raises(failures.DataError, match=f"prepared shard {shard} {message}") as raised:
    train.train_and_evaluate(tiny_config(data, **dict(RUN, train_steps=6)), workdir)
  assert "Delete the shard and run the same `bert-jax prepare`" in str(raised.value)
  assert raised.value.exit_code == failures.USER_ERROR
  assert _checkpoints(workdir) == ["2", "4"]


def test_shards_prepared_with_another_casing_or_vocabulary_are_named(data_dir, tmp_path):  # noqa: F811
  """Shards hold token ids: read with another vocabulary they are other words, and a checkpoint would record a
  tokenizer (cased or not) that is not its data's. stats.json says how they were prepared."""
  train.check_inputs(tiny_config(data_dir))
  with pytest.raises(failures.UserError, match="do_lower_case is False but .* prepared with do_lower_case=True"):
    train.check_inputs(tiny_config(data_dir, **{"data.do_lower_case": False}))
  words = open(os.path.join(data_dir, "vocab.txt")).read().split("\n")
  (tmp_path / "same.txt").write_text("\n".join(words))
  train.check_inputs(tiny_config(data_dir, **{"data.vocab_file": str(tmp_path / "same.txt")}))
  (tmp_path / "other.txt").write_text("\n".join(words[:5] + words[5:][::-1]))   # same size, other ids
  with pytest.raises(failures.UserError, match="is not the vocabulary .* was prepared with"):
    train.check_inputs(tiny_config(data_dir, **{"data.vocab_file": str(tmp_path / "other.txt")}))
  # Eval shards of another vocabulary: the first evaluation stopped on an id past the table, or gave figures of
  # nothing. Those of the training data's own pass.
  same = _copy(data_dir, tmp_path, "same_vocab")
  train.check_inputs(tiny_config(data_dir, **{"data.eval_files": same}))
  other = _copy(data_dir, tmp_path, "other_vocab")
  (tmp_path / "other_vocab" / "vocab.txt").write_text("\n".join(words[:5] + words[5:][::-1]))
  with pytest.raises(failures.UserError, match=r"data.eval_files .*other_vocab was prepared with another vocabulary "
                                               r"\(vocab.txt there\) than the training data's \(data.train_files\)"):
    train.check_inputs(tiny_config(data_dir, **{"data.eval_files": other}))
  vocab = os.path.join(data_dir, "vocab.txt")   # named as data.vocab_file: the same eval advice, and only once
  with pytest.raises(failures.UserError, match=r"\n  data.eval_files .*other_vocab was prepared with another "
                     rf"vocabulary \(vocab.txt there\) than the training data's \({vocab}\)[^\n]*$"):
    train.check_inputs(tiny_config(data_dir, **{"data.eval_files": other, "data.vocab_file": vocab}))
  train.check_inputs(tiny_config(data_dir, **{"data.eval_files": data_dir}))   # the training folder's own eval split


def test_a_corpus_named_as_the_prepared_data_is_told_to_be_prepared(data_dir, tmp_path):  # noqa: F811
  """Read as a shard it read as a damaged one, and the message said to delete it: the user's own corpus."""
  (tmp_path / "news.jsonl").write_text('{"text": "a king sees the queen ."}\n')
  for field, split in (("train_files", "train"), ("eval_files", "eval")):
    with pytest.raises(failures.UserError, match=rf"data.{field} '.*news.jsonl': it is no prepared shard "
                       rf"\({split}-\*.tfrecord\): name a `bert-jax prepare` output folder .*a corpus is prepared"):
      train.check_inputs(tiny_config(data_dir, **{f"data.{field}": str(tmp_path / "news.jsonl")}))


def test_a_vocab_file_that_is_no_vocabulary_is_named_before_training(data_dir, tmp_path):  # noqa: F811
  """A shard or a text named as the vocabulary stopped the run with a traceback, or a decoding error naming no file."""
  (tmp_path / "notes.txt").write_text("a\nb\n")
  (tmp_path / "shard.tfrecord").write_bytes(bytes(range(128, 256)))
  with pytest.raises(failures.UserError, match=r"data.vocab_file: .*notes.txt is no WordPiece vocabulary: "
                                               r"vocabulary has no \[PAD\]"):
    train.check_inputs(tiny_config(data_dir, **{"data.vocab_file": str(tmp_path / "notes.txt")}))
  with pytest.raises(failures.UserError, match=r"data.vocab_file: .*shard.tfrecord is no vocabulary: not UTF-8 text"):
    train.check_inputs(tiny_config(data_dir, **{"data.vocab_file": str(tmp_path / "shard.tfrecord")}))


def test_missing_shard_is_named(data_dir, tmp_path):  # noqa: F811
  data = _copy(data_dir, tmp_path, "data")
  os.remove(os.path.join(data, "train-00001-of-00002.tfrecord"))
  with pytest.raises(failures.DataError, match=r"lacks 1 of the 2 train shards .*: train-00001-of-00002.tfrecord"):
    train.train_and_evaluate(tiny_config(data, **RUN), str(tmp_path / "run"))


# ---------------------------------------------------------------------------------------------
# Non-finite state: the guard looks at the update and the new parameters too.


@pytest.mark.slow
def test_nan_update_with_finite_loss_and_gradient_is_skipped(data_dir):  # noqa: F811
  config = tiny_config(data_dir, **RUN, **{"optimizer.eps": 0.0})
  s = train_setup.setup(config, sharding.create_mesh(config.mesh))
  state = s.init(jax.random.key(0))
  batch = sharding.global_batch(next(train.create_iterator(config.data, config, "train")), s.mesh)
  before = jax.device_get(state.params)
  new, metrics = s.train_step(state, batch, jax.random.key(1))
  assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
  assert int(new.nonfinite_count) == 1 and int(new.nonfinite_streak) == 1
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(new.params), before)


def test_no_checkpoint_inside_a_nonfinite_streak(data_dir, trained, tmp_path):  # noqa: F811
  """And the stop names the last good checkpoint."""
  workdir = _copy(trained, tmp_path)
  config = tiny_config(data_dir, **dict(RUN, train_steps=20, checkpoint_every=1, max_nonfinite_steps=3),
                       **{"optimizer.eps": 0.0})
  with pytest.raises(failures.Diverged, match=r"stopping at step 7: 3 steps in a row had a non-finite loss, "
                     r"gradient or update .* The last good checkpoint is .*/checkpoints/4; a restart resumes "
                     r"from it") as raised:
    train.train_and_evaluate(config, workdir)
  assert raised.value.exit_code == failures.DIVERGED
  assert _checkpoints(workdir) == ["2", "4"]   # steps 5 and 6, inside the streak, were not saved
  assert _params_are_finite(workdir, 4)
  assert [m["train/nonfinite_count"] for m in read_metrics(workdir) if m["step"] > 4] == [1, 2, 3]


class _PoisonsOneBatch:
  """The training stream with the labels of its `nth` batch (and of that position, if drawn again)
  replaced by [PAD]: that step's loss jumps while staying finite."""

  def __init__(self, iterator, nth: int):
    self.iterator, self.nth, self.poisoned, self.drawn = iterator, nth, None, 0

  def get_state(self):
    return self.iterator.get_state()

  def set_state(self, state):
    self.iterator.set_state(state)

  def __next__(self):
    position = self.get_state()
    self.drawn += 1
    if self.drawn == self.nth:
      self.poisoned = position
    batch = next(self.iterator)
    if position == self.poisoned:
      batch = dict(batch, masked_lm_ids=np.zeros_like(batch["masked_lm_ids"]))
    return batch


@pytest.mark.slow
def test_loss_spike_goes_back_to_the_last_checkpoint_and_skips_its_batches(data_dir, trained, tmp_path,  # noqa: F811
                                                                          monkeypatch, capsys):
  create_iterator, streams = train.create_iterator, []

  def poisoned(data_config, config, split, tokenizer=None):
    it = create_iterator(data_config, config, split, tokenizer)
    if split == "train":
      streams.append(it := _PoisonsOneBatch(it, nth=4))   # the batch of step 8 (resumed at step 4)
    return it

  monkeypatch.setattr(train, "create_iterator", poisoned)
  workdir = _copy(trained, tmp_path)
  config = tiny_config(data_dir, **dict(RUN, train_steps=12, keep_checkpoints=10, loss_spike_factor=1.1))
  train.train_and_evaluate(config, workdir)
  out = capsys.readouterr().out
  assert re.search(r"loss spike 1/3: loss [\d.]+ at step 8 is more than 1.1 x the running mean [\d.]+; back to "
                   f"{workdir}/checkpoints/6, the batches of steps 8-8 will be skipped", out), out
  lines = read_metrics(workdir)
  logged = [(m["step"], m["train/loss"]) for m in lines if "train/loss" in m and m["step"] > 4]
  assert [step for step, _ in logged] == [5, 6, 7, 8, 7, 8, 9, 10, 11, 12]
  assert logged[2] == logged[4] and logged[3][1] > logged[5][1]   # step 7 replayed exactly; 8 without the spike
  assert lines[-1]["train/loss_spikes"] == 1 and lines[-1]["train/spike_skipped_batches"] == 1
  assert streams[0].drawn == 4 + 6   # steps 5-8, then 7-12 again with the batch after the poisoned one for 8
  assert _checkpoints(workdir) == ["10", "12", "2", "4", "6", "8"]


@pytest.mark.slow
def test_a_spike_with_no_checkpoint_to_go_back_to_still_saves(data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
  """The guard goes on where no checkpoint precedes the spiked interval: that step is then saved as any
  other (the last step's checkpoint was skipped)."""
  create_iterator = train.create_iterator

  def poisoned(data_config, config, split, tokenizer=None):
    it = create_iterator(data_config, config, split, tokenizer)
    return _PoisonsOneBatch(it, nth=8) if split == "train" else it

  monkeypatch.setattr(train, "create_iterator", poisoned)
  config = tiny_config(data_dir, **dict(RUN, train_steps=8, checkpoint_every=8, loss_spike_factor=1.1))
  train.train_and_evaluate(config, str(tmp_path / "run"))
  assert "no checkpoint precedes step 8: going on" in capsys.readouterr().out
  assert _checkpoints(str(tmp_path / "run")) == ["8"]


@pytest.mark.parametrize("changes, match", [
    ({"data.masking_budget": "bogus"}, "data.masking_budget must be one of"),
    ({"data.random_token_pool": "bogus"}, "data.random_token_pool must be one of"),
    ({"data.span_masking": True, "data.whole_word_masking": True}, "set at most one of data.whole_word_masking"),
    # These stopped a run with a traceback: some at once, some when the step was traced, some after a step.
    ({"log_every": 0}, "log_every 0 must be at least 1"),
    ({"checkpoint_every": 0}, "checkpoint_every 0 must be at least 1"),
    ({"global_batch_size": 0}, "global_batch_size 0 must be at least 1"),
    ({"optimizer.schedule": "cosine"}, "optimizer.schedule must be 'linear' or 'wsd', got 'cosine'"),
    ({"optimizer.decay_steps": 5}, "optimizer.decay_steps and final_lr_fraction act only with optimizer.schedule"),
    ({"batch_size_warmup_steps": 2, "batch_size_warmup_min_rows": 768}, "batch_size_warmup_min_rows 768 must be in"),
    ({"model.hidden_act": "relu6"}, "model: hidden_act 'relu6' not supported"),
    ({"dtype": "float16x"}, "model: data type 'float16x' not understood"),
])
def test_masking_fields_are_checked_before_compiling(data_dir, changes, match):  # noqa: F811
  """They stopped a run in the input pipeline, after compiling, with a traceback."""
  with pytest.raises(failures.UserError, match=f"invalid config:\n  {match}"):
    train.validate(tiny_config(data_dir, **changes))


def test_a_prediction_cap_below_the_masking_rate_is_said(data_dir, caplog):  # noqa: F811
  """tiny's 5 predictions a sequence fit its 32 tokens; at 128 they mask 0.039 of a sequence, not 0.15."""
  train.validate(tiny_config(data_dir))
  assert "caps the masked tokens" not in caplog.text
  train.validate(tiny_config(data_dir, **{"data.seq_length": 128, "model.max_position_embeddings": 128}))
  assert ("data.max_predictions_per_seq 5 caps the masked tokens of a full sequence below data.masked_lm_prob 0.15 "
          "of its 128 (19): 0.039 of them are masked") in caplog.text


def test_eval_every_is_read_only_with_evaluation_on(data_dir):  # noqa: F811
  train.validate(tiny_config(data_dir, **{"eval_steps": 0, "eval_every": 0}))
  with pytest.raises(failures.UserError,
                     match=r"eval_every 0 must be at least 1 \(eval_steps 0 turns evaluation off\)"):
    train.validate(tiny_config(data_dir, **{"eval_steps": 2, "eval_every": 0}))
  with pytest.raises(failures.UserError, match=r"invalid config:\n  train_steps and optimizer.total_steps must be "
                                               r"positive$"):   # said once, not by the schedule too
    train.validate(tiny_config(data_dir, **{"optimizer.total_steps": 0}))


def test_the_spike_guard_needs_checkpoints_where_the_loss_is_checked(data_dir):  # noqa: F811
  """A checkpoint inside a log interval would hold unchecked steps: an undone spike left it behind, and
  with keep_checkpoints 1 it pushed out the checkpoint to go back to."""
  config = tiny_config(data_dir, **dict(RUN, checkpoint_every=2, log_every=4, loss_spike_factor=1.1))
  with pytest.raises(failures.UserError, match="checkpoint_every 2 must be a multiple of log_every 4"):
    train.validate(config)
  config.loss_spike_factor = 0.0
  train.validate(config)


# ---------------------------------------------------------------------------------------------
# A failed save (a full disk): the run stops at once, earlier checkpoints and no temporary files stay.


def test_failed_async_save_stops_the_run_at_once(data_dir, trained, tmp_path, monkeypatch):  # noqa: F811
  async def disk_full(self, x, directory):
    raise OSError(errno.ENOSPC, "No space left on device")

  # The iterator position (the checkpoint's "data" item) is written in the background, like the state.
  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", disk_full)
  workdir = _copy(trained, tmp_path)
  config = tiny_config(data_dir, **dict(RUN, train_steps=40, keep_checkpoints=2))
  with pytest.raises(failures.SaveFailed, match=r"saving checkpoint .*/checkpoints/6 failed \(.*No space left on "
                     r"device.*\)\. Training stopped here; 1 temporary directory removed; the checkpoints "
                     r"written before are intact: \[2, 4\]"):
    train.train_and_evaluate(config, workdir)
  # keep_checkpoints=2 would have dropped step 2 once step 6 was complete: it never was.
  assert _checkpoints(workdir) == ["2", "4"]
  assert max(m["step"] for m in read_metrics(workdir)) <= 8   # at once, not at the next save (step 8)
  assert _params_are_finite(workdir, 4)


@pytest.mark.slow
def test_failed_save_from_the_cli_is_one_paragraph_without_tracebacks(data_dir, trained, tmp_path,  # noqa: F811
                                                                      compilation_cache):  # noqa: F811
  workdir = _copy(trained, tmp_path)
  overrides = [f"--config.{k}={v}" for k, v in {**TINY, **RUN, "data.train_files": data_dir, "train_steps": 40}.items()]
  script = f"""
import errno, sys
from absl import app
from orbax.checkpoint._src.handlers import json_checkpoint_handler
async def disk_full(self, x, directory):
  raise OSError(errno.ENOSPC, "No space left on device")
json_checkpoint_handler.JsonCheckpointHandler._save_fn = disk_full
from bert_jax import main
sys.argv = ["bert-jax pretrain", "--config={REPO}/configs/tiny.py", "--workdir={workdir}", *{overrides!r}]
app.run(main.main, flags_parser=main.parse_flags)
"""
  # The step `trained` compiled, loaded from the cache.
  done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, **compilation_cache_env(compilation_cache)))
  assert done.returncode == 1, done.stderr[-3000:]
  ours = [line for line in done.stderr.splitlines() if line.startswith("bert-jax pretrain:")]
  assert len(ours) == 1 and f"saving checkpoint {workdir}/checkpoints/6 failed" in ours[0], done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  assert _checkpoints(workdir) == ["2", "4"]


# ---------------------------------------------------------------------------------------------
# An unreadable latest checkpoint: skipped with a warning, the newest readable one restored.


def _truncate_a_state_file(step_dir):
  path, = glob.glob(os.path.join(step_dir, "state", "d", "*"))   # the arrays, after orbax merged the hosts' files
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage", [
    _truncate_a_state_file,
    lambda step_dir: shutil.rmtree(os.path.join(step_dir, "state")),
    lambda step_dir: open(os.path.join(step_dir, "data", "metadata"), "w").write('{"hosts": [{"js'),
], ids=["truncated_state_file", "deleted_state", "garbled_data_metadata"])
def test_unreadable_latest_checkpoint_is_skipped(damage, data_dir, trained, tmp_path, capsys,  # noqa: F811
                                                 monkeypatch):
  workdir = _copy(trained, tmp_path)
  damage(os.path.join(workdir, "checkpoints", "4"))
  unraisable = []   # what Python would print to stderr as tracebacks
  monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.exc_value)))
  train.train_and_evaluate(tiny_config(data_dir, **dict(RUN, train_steps=6)), workdir)
  gc.collect()
  assert not unraisable, (len(unraisable), unraisable[:3])   # the failed restore's late reads print nothing
  out = capsys.readouterr().out
  assert f"warning: checkpoint {workdir}/checkpoints/4, moved to {workdir}/checkpoints/4.unreadable-" in out
  assert "(step 4) is unreadable and was skipped" in out
  assert f"resumed from {workdir}/checkpoints/2 at step 2" in out
  assert [m["step"] for m in read_metrics(workdir)][-4:] == [3, 4, 5, 6]
  assert [c for c in _checkpoints(workdir) if c.isdigit()] == ["2", "4", "6"]
  assert len([c for c in _checkpoints(workdir) if c.startswith("4.unreadable-")]) == 1   # kept, for a look


def test_only_the_failed_restores_late_reads_are_silenced(monkeypatch):
  passed = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: passed.append(repr(u.exc_value)))
  checkpointing.quiet_late_read_callbacks()
  checkpointing.quiet_late_read_callbacks()   # a second restore does not wrap the hook again
  loop = asyncio.new_event_loop()
  loop.close()
  try:
    loop.call_soon_threadsafe(print)
  except RuntimeError as e:
    closed = e
  late = closed.__traceback__.tb_next   # as tensorstore's thread calls it: the traceback starts in asyncio

  def report(error, tb):
    sys.unraisablehook(types.SimpleNamespace(exc_type=type(error), exc_value=error, exc_traceback=tb,
                                             err_msg=None, object=None))

  report(closed, late)
  try:
    raise RuntimeError("Event loop is closed")
  except RuntimeError as e:
    report(e, e.__traceback__)   # raised elsewhere: not a late read
  report(ValueError("Event loop is closed"), late)

  async def _read_array_index_and_device_put():   # orbax's read's name, but not orbax's
    pass

  read = _read_array_index_and_device_put()
  sys.unraisablehook(types.SimpleNamespace(exc_type=OSError, exc_value=OSError("elsewhere"), exc_traceback=None,
                                           err_msg=None, object=read))
  read.close()
  assert passed == ["RuntimeError('Event loop is closed')", "ValueError('Event loop is closed')",
                    "OSError('elsewhere')"]


def test_checkpoints_of_another_config_are_not_taken_for_damaged_ones(data_dir, trained, tmp_path,  # noqa: F811
                                                                     monkeypatch):
  workdir = _copy(trained, tmp_path)
  # The same model (another one stops before, checkpoint_loader.check_run_model), another optimizer's state.
  config = tiny_config(data_dir, **dict(RUN, train_steps=6), **{"optimizer.name": "lamb"})
  written = os.stat(tmp_path / "run" / "bert_config.json").st_mtime_ns
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u.object)))
  with pytest.raises(failures.UserError, match=r"none of the 2 checkpoints in .* can be restored; the latest, step "
                     r"4: .* If the model or optimizer config changed"):
    train.train_and_evaluate(config, workdir)
  gc.collect()
  assert not unraisable, (len(unraisable), unraisable[:3])   # the message alone, not each read's traceback
  assert _checkpoints(workdir) == ["2", "4"]   # nothing moved aside
  # The run record (model config, tokenizer) is written once a checkpoint is restored: not here.
  assert os.stat(tmp_path / "run" / "bert_config.json").st_mtime_ns == written


# ---------------------------------------------------------------------------------------------
# Config errors: one line from the CLI, exit code 2, before compiling, the workdir untouched.


@pytest.mark.slow
def test_config_errors_are_one_line_before_compiling(data_dir, trained, tmp_path):  # noqa: F811
  unrelated = tmp_path / "unrelated"
  (unrelated / "notes").mkdir(parents=True)
  cases = {
      "--config.train_stepz=3": 'unknown config field \'train_stepz\'. Did you mean "train_steps"',
      "--config.data.train_files=": "data.train_files is empty: set --config.data.train_files",
      f"--config.data.train_files={tmp_path}/nowhere":
          f"data.train_files '{tmp_path}/nowhere' holds no prepared shards",
      f"--config.init_from={unrelated}": f"init_from: {unrelated} holds no checkpoint steps",
  }
  workdir = _copy(trained, tmp_path)
  before = _checkpoints(workdir)
  overrides = [f"--config.{k}={v}" for k, v in {**TINY, **RUN, "data.train_files": data_dir}.items()]
  procs = {flag: subprocess.Popen(
      [sys.executable, "-m", "bert_jax.main", f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}",
       *overrides, flag], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for flag in cases}
  for flag, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == failures.USER_ERROR, (flag, out, err)
    assert cases[flag] in err and "Traceback" not in err + out, (flag, err)
    assert "mesh" not in out, (flag, out)   # stopped before the setup line, hence before compiling
  assert _checkpoints(workdir) == before


def test_a_config_file_that_is_not_there_is_a_user_error(tmp_path):
  """ml_collections loads --config when main first reads it: a mistyped path, or one on another machine, is a
  one-line exit 2 (a supervisor does not restart it), not two tracebacks and exit 1."""
  for command in (["pretrain", "--config=configs/bert_lage.py:phase1"],
                  ["finetune", "--config=configs/finetune/sst3.py"]):
    proc = subprocess.run([sys.executable, "-m", "bert_jax.cli", *command, f"--workdir={tmp_path}/run"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == failures.USER_ERROR, proc.stderr
    assert "cannot load --config" in proc.stderr and "Traceback" not in proc.stderr


def test_supervisor_restarts_after_a_lost_peer_and_not_after_a_user_error():
  from launch import supervisor  # pylint: disable=g-import-not-at-top
  from test_launch_supervisor import SINGLE, V3, FakeGcloud, make  # pylint: disable=g-import-not-at-top
  assert supervisor.RESTART_EXIT_CODE == failures.RESTART
  assert set(supervisor.FINAL_EXIT_CODES) == {failures.USER_ERROR, failures.DIVERGED}

  fake = FakeGcloud(states=["READY"] * 4, jobs=["running", f"exit {failures.RESTART}", "running", "exit 0"])
  sup, _, logs = make(SINGLE, V3, fake)
  assert sup.supervise() == 0
  assert f"job train ended (exit {failures.RESTART}: a peer host died) on a live slice: restart 1/20" in logs
  for code in (failures.USER_ERROR, failures.DIVERGED):
    fake = FakeGcloud(states=["READY"] * 2, jobs=["running", f"exit {code}"])
    sup, _, logs = make(SINGLE, V3, fake)
    assert sup.supervise() == code and sup.restarts == 0
    assert "a restart would fail the same way: not restarting" in logs[-1]
  # `stop` (SIGTERM to the job, not the VM's shutdown): saved and stopped, not restarted, not "finished".
  assert supervisor.STOPPED_EXIT_CODE == failures.STOPPED
  # Every worker asked: none was preempted.
  fake = FakeGcloud(states=["READY"] * 2, jobs=["running", f"exit {failures.STOPPED}", f"exit {failures.STOPPED}"])
  sup, _, logs = make(SINGLE, V3, fake)
  assert sup.supervise() == failures.STOPPED and sup.restarts == 0
  assert "`run` again resumes it): not restarting" in logs[-1]


# How JAX's client ends a process whose coordinator died (the lines as jaxlib 0.10.2 logs them).
_ABORT = r'''
sys.stderr.write("E1123 04:15:47.256405    7232 coordination_service_agent.cc:289] Polled an error from "
                 "coordination service (this can be an error from this or another task).\n"
                 "F1123 04:15:47.256410    7232 client.h:80] Terminating process because the JAX distributed "
                 "service detected fatal errors.\nAdditional GRPC error information from remote target "
                 "coordination_service while calling /xla.coordination.CoordinationService/PollForError:\n"
                 "*** Check failure stack trace: ***\n"
                 "    @     0x7ff801d040ee  xla::CoordinationServiceAgent::SetError()\n")
sys.stderr.flush()
os.abort()
'''
_LOST = ("bert-jax pretrain (process 1): a peer host of this job is gone: this process lost the coordination "
         "service, which runs in process 0 (its PollForError call failed), and JAX ended it with SIGABRT. Exiting "
         "with code 75 so that the supervisor restarts the whole job; it resumes from the latest checkpoint.\n")
_WARNING = "W0 preemption_sync_manager.cc:147] Failed\n"
_CHILDREN = {   # the child's code after `run_in_child_process`: (it, the command's exit code, its stderr)
    "aborted by the client": (_ABORT, failures.RESTART, _LOST),
    "fails": ("print('bert-jax: a user error', file=sys.stderr); sys.exit(2)", 2, "bert-jax: a user error\n"),
    "warns about the service, lives on": (f"sys.stderr.write({_WARNING!r}); sys.exit(0)", 0, _WARNING),
    "killed": ("print('oom', file=sys.stderr, flush=True); os.kill(os.getpid(), signal.SIGKILL)", 128 + 9, "oom\n"),
    "gets the parent's SIGTERM": ("signal.signal(signal.SIGTERM, lambda *_: (print('saved', file=sys.stderr), "
                                  "sys.exit(0)))\nprint('ready', flush=True)\ntime.sleep(60)", 0, "saved\n"),
}


@pytest.mark.parametrize("child", list(_CHILDREN))
def test_a_job_in_a_child_process_ends_as_the_child_did_and_an_abort_by_jax_is_a_restart(child):
  """`bert-jax pretrain` runs a multi-process job as a child; its parent relays stderr and the exit code,
  turns the C++ abort of a lost coordinator into one message and RESTART, and passes SIGTERM on."""
  body, code, stderr = _CHILDREN[child]
  script = ("import os, signal, sys, time\nfrom bert_jax import failures\n"
            "failures.run_in_child_process(prefix='bert-jax pretrain (process 1)')\n" + body)
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  if "SIGTERM" in child:
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=60)
  assert (proc.returncode, err) == (code, stderr)


def test_sigterm_or_ctrl_c_in_a_command_that_saves_nothing_says_so_in_one_line(capsys, monkeypatch):
  def exit_now(code):
    raise SystemExit(code)

  monkeypatch.setattr(failures.os, "_exit", exit_now)   # os._exit would end pytest too
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(SystemExit) as stopped:
    with failures.stop_message("bert-jax finetune", "the same command starts it over"):
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(100):   # the handler runs between two bytecodes
        pass
      raise AssertionError("SIGTERM did not stop the block")
  assert stopped.value.code == 143
  assert capsys.readouterr().err == "bert-jax finetune: stopped by SIGTERM; the same command starts it over\n"
  assert signal.getsignal(signal.SIGTERM) == before   # the handler it found, again
  with pytest.raises(SystemExit) as stopped:
    with failures.stop_message("bert-jax sweep", "the finished trials are kept"):
      raise KeyboardInterrupt
  assert stopped.value.code == 130
  assert capsys.readouterr().err == "bert-jax sweep: stopped by Ctrl-C; the finished trials are kept\n"
  with pytest.raises(SystemExit) as stopped:   # sys.exit: the interpreter's exit runs
    with failures.stop_message("bert-jax prepare", "kept", at_once=False):
      raise KeyboardInterrupt
  assert stopped.value.code == 130 and capsys.readouterr().err == "bert-jax prepare: stopped by Ctrl-C; kept\n"
  with failures.stop_message("bert-jax sweep", "kept"):
    pass   # nothing else changes
  assert signal.getsignal(signal.SIGTERM) == before and capsys.readouterr().err == ""
  # A finished run's report, cut short by SIGTERM: one line, and the command goes on (to exit 0); a command that
  # has more to do after it (ablate) sees that it came.
  monkeypatch.setattr(failures, "_SIGTERM_CUT_SHORT", threading.Event())
  assert not failures.sigterm_cut_short()
  with failures.stop_message("bert-jax pretrain", "kept"):
    with failures.cut_short_by_sigterm("bert-jax pretrain", "the run is done"):
      os.kill(os.getpid(), signal.SIGTERM)
      for _ in range(100):
        pass
      raise AssertionError("SIGTERM did not end the block")
    went_on = True
  assert went_on and capsys.readouterr().err == "bert-jax pretrain: SIGTERM; the run is done\n"
  assert failures.sigterm_cut_short()
  with pytest.raises(SystemExit) as stopped:   # Ctrl-C there still stops the command
    with failures.stop_message("bert-jax pretrain", "kept"):
      with failures.cut_short_by_sigterm("bert-jax pretrain", "the run is done"):
        raise KeyboardInterrupt
  assert stopped.value.code == 130
