"""The pretraining input pipeline: prepared shards -> host-local numpy batches, resumable.

Each host loads its documents once into flat arrays (`instances.Documents`). Every epoch is
planned with vectorised numpy from a generator seeded by (seed, epoch, host) and shuffled; batch
`b` of epoch `e` is then a pure function of (seed, e, host, b): its rows are built, masked
(`masking`, keyed by each example's index) and, optionally, packed. tf.data only runs that function
ahead of the consumer, on `num_parallel_calls` threads, so a restored `{"epoch", "batch"}` state
replays the stream exactly.

    it = create_pretrain_iterator(config.data, global_batch_size=256)
    batch = next(it)                      # dict of numpy arrays (docs/architecture.md, "Batches")
    state = it.get_state()                # small JSON-able dict, saved with the checkpoint
    it.set_state(state)                   # in a fresh process: the same next batches
"""

import hashlib
import os
import threading

import jax
import numpy as np

from bert_jax import failures, host_env
from bert_jax.data import instances
from bert_jax.data import masking
from bert_jax.data import shards

tf = host_env.import_tensorflow()

_EVAL_EPOCH = 1 << 40  # eval draws use an "epoch" no training run reaches


# ---------------------------------------------------------------------------------------------
# Epoch plans and batches: pure functions of (seed, epoch, host, rows).


# What each field of a pipeline's saved position depends on, as a user sets it.
_STATE_FIELDS = {"seed": "data.seed", "process_index": "the process index",
                 "rows_per_batch": "the rows a process reads a step (global_batch_size over the processes)"}


class BatchMaker:
  """Plans the epochs of one host's documents and builds any batch of them."""

  def __init__(self, docs: instances.Documents, tokenizer, data_config, rows_per_batch: int,
               process_index: int = 0, objective: str = "bert"):
    c = data_config
    # The objective's batch schema (bert_jax/objectives/) names the fields; this makes exactly those.
    from bert_jax import objectives  # pylint: disable=g-import-not-at-top
    self.schema = objectives.get(objective).batch_schema(c, rows_per_batch)
    self.format, self.seq_length, self.rows_per_batch = c.format, c.seq_length, rows_per_batch
    self.separator_id = tokenizer.sep_id if c.format == "full_sentences" else None
    self.docs = docs.joined(tokenizer.sep_id) if self.separator_id is not None else docs
    self.spec = masking.MaskingSpec.from_config(c, tokenizer)
    self.short_seq_prob, self.seed, self.process_index = c.short_seq_prob, c.seed, process_index
    self.dupe_factor = c.get("dupe_factor", 0)
    self.packing, self.max_per_row = c.packing, c.max_examples_per_row
    self.special = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)
    self._plans, self._lock = {}, threading.Lock()

  def _static(self, epoch: int) -> bool:
    return bool(self.dupe_factor) and epoch < _EVAL_EPOCH

  def copy(self, epoch: int) -> int:
    """The data copy an epoch trains on: the epoch itself (dynamic masking) or epoch % dupe_factor (static)."""
    return epoch % self.dupe_factor if self._static(epoch) else epoch

  def plan(self, epoch: int):
    """(instances in shuffled order, row starts [R + 1], each instance's index in its copy or None when
    that is its position) of an epoch; the last few are cached."""
    with self._lock:
      if epoch not in self._plans:
        copy = self.copy(epoch)
        rng = np.random.default_rng([self.seed, copy, self.process_index])
        inst = instances.plan(self.docs, self.format, self.seq_length, self.short_seq_prob, rng,
                              self.separator_id)
        if not self._static(epoch):
          ids, order = None, rng.permutation(len(inst))
        else:   # the copy's instances, in this epoch's own order
          ids = order = np.random.default_rng([self.seed, epoch, self.process_index, 1]).permutation(len(inst))
        inst = inst.take(order)
        rows = (instances.pack(inst.lengths(), self.seq_length, self.max_per_row) if self.packing
                else np.arange(len(inst) + 1))
        if len(self._plans) >= 3:
          del self._plans[min(self._plans)]
        self._plans[epoch] = (inst, rows, ids)
      return self._plans[epoch]

  def num_rows(self, epoch: int) -> int:
    """Rows (batch rows, packed or not) in an epoch's plan."""
    return len(self.plan(epoch)[1]) - 1

  def output_spec(self) -> dict:
    """{name: (numpy dtype, shape)} of a batch: the objective's schema."""
    return {name: (f.dtype, f.shape) for name, f in self.schema.items()}

  def batch(self, epoch: int, rows: np.ndarray) -> dict:
    """The batch made of the given rows of an epoch's plan."""
    inst, row_starts, ids = self.plan(epoch)
    counts = row_starts[rows + 1] - row_starts[rows]
    local_starts = np.concatenate([[0], np.cumsum(counts)])
    index = np.repeat(row_starts[rows] - local_starts[:-1], counts) + np.arange(local_starts[-1])
    chosen = inst.take(index)
    fields = instances.build_rows(self.docs.tokens, chosen, self.seq_length, *self.special)
    # Static masking keys an instance by its copy and its index there, so each epoch of a copy masks it alike.
    keys = masking.example_keys(self.seed, self.copy(epoch), self.process_index, index if ids is None else ids[index])
    if "masked_lm_positions" in self.schema:
      corrupted, is_masked = masking.mask_batch(fields["input_ids"], fields["input_mask"], keys, self.spec)
    else:   # objectives without masking (left-to-right) see the text as it is
      corrupted, is_masked = fields["input_ids"], np.zeros(fields["input_ids"].shape, bool)
    labels = chosen.label
    out = {}
    if self.packing:
      lengths = chosen.lengths()
      row, slot, offset = instances.packed_layout(local_starts, lengths)
      packed = instances.scatter_packed(dict(fields, corrupted=corrupted, is_masked=is_masked), lengths,
                                        row, slot, offset, len(rows), self.seq_length)
      fields, corrupted, is_masked = packed, packed.pop("corrupted"), packed.pop("is_masked")
      out.update(position_ids=packed["position_ids"], example_ids=packed["example_ids"])
      shape = (len(rows), self.max_per_row)
      out["next_sentence_positions"] = np.zeros(shape, np.int32)
      out["next_sentence_weights"] = np.zeros(shape, np.float32)
      out["next_sentence_positions"][row, slot] = offset
      out["next_sentence_weights"][row, slot] = 1.0
      labels = np.zeros(shape, np.int32)
      labels[row, slot] = chosen.label
    out.update(input_ids=corrupted, input_mask=fields["input_mask"], segment_ids=fields["segment_ids"])
    if "masked_lm_positions" in self.schema:
      out.update(masking.gather_predictions(corrupted, fields["input_ids"], is_masked, self.spec.max_predictions))
    if "masked_lm_span_left" in self.schema:   # SpanBERT's boundary objective
      edges = np.isin(fields["input_ids"], self.special[:2])   # [CLS] and [SEP]: no boundary targets
      out.update(masking.span_boundaries(out["masked_lm_positions"], out["masked_lm_weights"], fields["input_mask"],
                                         max_offset=self.spec.max_predictions - 1, edges=edges))
    if "next_sentence_labels" in self.schema:
      out["next_sentence_labels"] = labels.astype(np.int32)
    return {name: out[name] for name in self.schema}


# ---------------------------------------------------------------------------------------------
# The resumable iterator.


class PretrainIterator:
  """Batches of a `BatchMaker`, computed ahead by tf.data; `get_state`/`set_state` resume exactly.

  Training (`num_batches` None) runs epoch after epoch, forever, each epoch's remainder dropped.
  Evaluation (`eval_mode`) is one fixed plan and fixed masks; it yields `num_batches` batches,
  by default one pass (the last batch completed with rows from the start).
  """

  def __init__(self, maker: BatchMaker, num_parallel_calls: int = 1, prefetch: int = 2,
               eval_mode: bool = False, num_batches: int | None = None):
    self.maker, self.eval_mode = maker, eval_mode
    self.num_parallel_calls, self.prefetch = max(1, num_parallel_calls), prefetch
    self.num_batches = num_batches
    if eval_mode and not maker.num_rows(_EVAL_EPOCH):
      raise failures.UserError("this host has no eval documents: add eval shards or raise data.eval_fraction")
    if not eval_mode and maker.num_rows(0) < maker.rows_per_batch:
      raise failures.UserError(f"an epoch of this host holds {maker.num_rows(0)} rows, fewer than a batch "
                               f"({maker.rows_per_batch}): too little data")
    if eval_mode and num_batches is None:
      self.num_batches = -(-maker.num_rows(_EVAL_EPOCH) // maker.rows_per_batch)
    self._position = (_EVAL_EPOCH if eval_mode else 0, 0)
    self._iterator = None

  def __iter__(self):
    return self

  def get_state(self) -> dict:
    """The position of the next batch, and what it must be restored into (JSON-able)."""
    epoch, batch = self._position
    m = self.maker
    return {"epoch": int(epoch), "batch": int(batch), "seed": int(m.seed),
            "process_index": int(m.process_index), "rows_per_batch": int(m.rows_per_batch)}

  def set_state(self, state: dict) -> None:
    """Continues from a `get_state()` of the same pipeline (seed, host, batch size)."""
    m = self.maker
    expected = {"seed": m.seed, "process_index": m.process_index, "rows_per_batch": m.rows_per_batch}
    mismatch = {k: (state[k], v) for k, v in expected.items() if k in state and state[k] != v}
    if mismatch:
      changed = "; ".join(f"{_STATE_FIELDS[k]} was {saved}, now {now}" for k, (saved, now) in mismatch.items())
      raise failures.UserError(
          f"the checkpoint's data position belongs to another input pipeline ({changed}). A run resumes with the "
          "data order it started with: set it back, or continue from its weights in a new --workdir with "
          "--config.init_from=<its checkpoint>.")
    self._position = (int(state["epoch"]), int(state["batch"]))
    self._iterator = None

  def __next__(self) -> dict:
    if self._iterator is None:
      self._iterator = iter(self._dataset(*self._position))
    element = next(self._iterator)
    epoch, batch = element.pop("_position").numpy().tolist()
    self._position = (epoch, batch + 1)
    return {k: v.numpy() for k, v in element.items()}

  def _positions(self, epoch: int, batch: int):
    """(epoch, batch) from a position on; a batch index past an epoch's end moves to the next."""
    if self.eval_mode:
      yield from ((epoch, b) for b in range(batch, self.num_batches))
      return
    while True:
      n = self.maker.num_rows(epoch) // self.maker.rows_per_batch
      yield from ((epoch, b) for b in range(batch, n))
      epoch, batch = epoch + 1, 0

  def _numpy_batch(self, position):
    epoch, batch = (int(x) for x in position)
    n = self.maker.rows_per_batch
    rows = batch * n + np.arange(n)
    if self.eval_mode:
      rows %= self.maker.num_rows(epoch)
    out = self.maker.batch(epoch, rows)
    return [out[k] for k in self.maker.output_spec()]

  def _dataset(self, epoch: int, batch: int) -> tf.data.Dataset:
    spec = self.maker.output_spec()

    def to_batch(position):
      values = tf.numpy_function(self._numpy_batch, [position], [tf.as_dtype(d) for d, _ in spec.values()])
      out = {k: tf.ensure_shape(v, shape) for (k, (_, shape)), v in zip(spec.items(), values)}
      out["_position"] = position
      return out

    ds = tf.data.Dataset.from_generator(lambda: self._positions(epoch, batch),
                                        output_signature=tf.TensorSpec([2], tf.int64))
    if self.num_parallel_calls > 1:
      ds = ds.map(to_batch, num_parallel_calls=self.num_parallel_calls, deterministic=True)
    else:
      ds = ds.map(to_batch)
    ds = ds.prefetch(self.prefetch)
    options = tf.data.Options()
    # The other cores belong to the train step: a small host must not lose one to tf.data.
    options.threading.private_threadpool_size = self.num_parallel_calls
    options.threading.max_intra_op_parallelism = 1
    options.autotune.enabled = False
    return ds.with_options(options)


# ---------------------------------------------------------------------------------------------
# Entry points.


def _host(process_index, process_count):
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  return index, count


def _split_documents(data_config, split: str, process_index: int, process_count: int):
  """Documents of `split` for this host: eval shards if there are any, else a held-out fraction."""
  c = data_config
  if c.train_files.startswith("embedded:"):
    raise failures.UserError(f"{c.train_files!r} must be prepared first (`bert-jax prepare`); pass the directory")
  eval_files = shards.shard_files(c.eval_files, "eval") if c.eval_files else []
  if not eval_files and tf.io.gfile.isdir(c.train_files):
    eval_files = shards.shard_files(c.train_files, "eval")
  if split == "eval" and eval_files:
    return shards.load_documents(eval_files, process_index, process_count)
  train_files = shards.shard_files(c.train_files, "train")
  if not train_files:
    raise failures.UserError(f"no prepared shards match data.train_files {c.train_files!r}")
  if eval_files or c.eval_fraction <= 0:
    if split == "eval":
      raise failures.UserError("no eval data: set data.eval_files or data.eval_fraction > 0")
    return shards.load_documents(train_files, process_index, process_count)
  return shards.load_documents(train_files, process_index, process_count, held_out=split == "eval",
                        eval_fraction=c.eval_fraction)


def preparation_problems(data_config) -> list[str]:
  """The data config against what `bert-jax prepare` recorded beside the shards (stats.json): its lowercasing
  and, with `data.vocab_file`, its vocabulary; the eval shards' (`data.eval_files`) against the training
  data's vocabulary too. Shards hold token ids: read with another vocabulary they are other words (an id past
  it stops the first evaluation, one inside it gives figures of nothing), and a checkpoint would record a
  tokenizer (cased or not) that is not the one of its data."""
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  c, problems = data_config, []
  ours = None
  directories = [("train", d) for d in sorted({os.path.dirname(f) for f in shards.shard_files(c.train_files, "train")})]
  if c.eval_files:   # those of the training data's folders already checked
    directories += [("eval", d) for d in sorted({os.path.dirname(f) for f in shards.shard_files(c.eval_files, "eval")})
                    if ("train", d) not in directories]
  for split, directory in directories:
    _, stats = shards.read_stats(directory)
    if stats is None:
      continue
    if "do_lower_case" in stats and stats.get("tokenizer") != "byte_bpe" and stats["do_lower_case"] != c.do_lower_case:
      problems.append(f"data.do_lower_case is {c.do_lower_case} but {directory} was prepared with do_lower_case="
                      f"{stats['do_lower_case']} ({shards.STATS_FILE}): set --config.data.do_lower_case="
                      f"{stats['do_lower_case']}, or prepare the corpus again with --do_lower_case={c.do_lower_case}")
    recorded = stats.get("settings", {}).get("tokenizer_sha256")
    own = stats.get("tokenizer_file") and os.path.join(directory, stats["tokenizer_file"])
    if recorded and own and tf.io.gfile.exists(own):
      with tf.io.gfile.GFile(own, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != recorded:
          problems.append(f"{own} is not the vocabulary {directory}'s shards were prepared with ({shards.STATS_FILE} "
                          "records another): its shards hold that one's token ids. Prepare the corpus again into a "
                          "new folder")
    given = c.vocab_file and tf.io.gfile.exists(c.vocab_file)
    if stats.get("tokenizer_file") and (given or split == "eval"):
      ours = ours or load_tokenizer(c)   # data.vocab_file, else the training shards' own
      theirs = tokenizer_lib.load_tokenizer(directory, c.do_lower_case)
      if (ours.vocab_size != theirs.vocab_size or ours.convert_ids_to_tokens(range(ours.vocab_size))
          != theirs.convert_ids_to_tokens(range(theirs.vocab_size))):
        problems.append(
            f"data.eval_files {directory} was prepared with another vocabulary ({stats['tokenizer_file']} there) "
            f"than the training data's ({c.vocab_file or 'data.train_files'}): its shards hold that one's token "
            "ids. Prepare the eval corpus with the training data's vocabulary (bert-jax prepare --vocab_file=...), "
            "or leave data.eval_files empty to hold out data.eval_fraction of the training corpus"
            if split == "eval" else
            f"data.vocab_file {c.vocab_file!r} is not the vocabulary {directory} was prepared with "
            f"({stats['tokenizer_file']} there): its shards hold that one's token ids. Leave data.vocab_file empty "
            "to use it, or prepare the corpus again with this vocabulary")
  return problems


def load_tokenizer(data_config):
  """The tokenizer of `data_config`: `vocab_file`, else the one `prepare` saved beside the shards."""
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  where = data_config.vocab_file or data_config.train_files
  if not tf.io.gfile.isdir(where) and not data_config.vocab_file:
    where = os.path.dirname(where) or "."   # a glob or shard name in the current directory
  return tokenizer_lib.load_tokenizer(where, data_config.do_lower_case)


def _make_batch_maker(data_config, global_batch_size, process_index, process_count, split, tokenizer, objective):
  process_index, process_count = _host(process_index, process_count)
  if global_batch_size % process_count:
    raise failures.UserError(f"global batch {global_batch_size} is not divisible by {process_count} hosts")
  tokenizer = load_tokenizer(data_config) if tokenizer is None else tokenizer
  docs = _split_documents(data_config, split, process_index, process_count)
  if docs.num_documents < (least := instances.min_documents(data_config.format)):
    raise failures.UserError(
        f"data.format {data_config.format!r} needs {'two documents' if least == 2 else 'a document'} on each "
        f"host, and host {process_index}'s share of the {split} split holds {docs.num_documents}: give that "
        "split more documents (for the eval split, a larger data.eval_fraction where it is held out at training, "
        "a larger --eval_fraction of `bert-jax prepare` where it is prepared, or data.eval_files), or run on "
        "fewer hosts")
  return BatchMaker(docs, tokenizer, data_config, global_batch_size // process_count, process_index, objective)


def create_pretrain_iterator(data_config, *, global_batch_size: int, process_index: int | None = None,
                             process_count: int | None = None, split: str = "train",
                             tokenizer=None, objective: str = "bert") -> PretrainIterator:
  """The endless, resumable training stream of this host (`global_batch_size / hosts` rows a batch).

  `tokenizer` defaults to `tokenizer.load_tokenizer(data_config.vocab_file or the shards' directory)`;
  `objective` names the batch schema (bert_jax/objectives/).
  """
  maker = _make_batch_maker(data_config, global_batch_size, process_index, process_count, split, tokenizer,
                            objective)
  return PretrainIterator(maker, data_config.num_parallel_calls, data_config.prefetch)


def create_eval_iterator(data_config, *, global_batch_size: int, num_batches: int | None = None,
                         process_index: int | None = None, process_count: int | None = None,
                         tokenizer=None, objective: str = "bert") -> PretrainIterator:
  """A finite eval stream with fixed instances and masks, the same on every call.

  Pass `num_batches` (e.g. `config.eval_steps`) on several hosts so that all yield as many batches;
  a host with fewer rows wraps around its eval data.
  """
  maker = _make_batch_maker(data_config, global_batch_size, process_index, process_count, "eval", tokenizer,
                            objective)
  return PretrainIterator(maker, data_config.num_parallel_calls, data_config.prefetch, eval_mode=True,
                          num_batches=num_batches)
