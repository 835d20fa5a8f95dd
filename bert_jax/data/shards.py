"""Prepared shards -> a host's documents (`instances.Documents`): the shard listing of a prepared directory,
each shard's size and counts checked against its stats.json, the held-out share of the documents.

A prepared directory (`bert-jax prepare`, bert_jax/data/prepare.py) holds TFRecord shards of tokenized
documents and stats.json; `read_stats` is its one reader.
"""

import json
import logging
import os

import numpy as np

from bert_jax import failures, host_env
from bert_jax.data import instances
from bert_jax.data import masking

tf = host_env.import_tensorflow()

_FEATURES = {"token_ids": tf.io.RaggedFeature(tf.int64), "sentence_lengths": tf.io.RaggedFeature(tf.int64)}
STATS_FILE = "stats.json"   # prepare.STATS_FILE: per-shard documents, tokens and bytes
_REPAIR = ("Delete the shard and run the same `bert-jax prepare` command again: it rewrites only the missing "
           "shards (a corpus prepared into <workdir>/data: delete that directory).")


def shard_files(pattern: str, split: str) -> list[str]:
  """A glob, a prepared directory's `<split>-*.tfrecord` or a prefix's `-*.tfrecord`, sorted.

  A directory must hold every shard of the split that its stats.json lists (DataError otherwise), and only
  those are read: a shard it does not list is not the last `prepare` run's (left by an older one).
  """
  if tf.io.gfile.isdir(pattern):
    return _listed_shards(pattern, split, sorted(tf.io.gfile.glob(os.path.join(pattern, f"{split}-*.tfrecord"))))
  return sorted(tf.io.gfile.glob(pattern)) or sorted(tf.io.gfile.glob(pattern + "-*.tfrecord"))


def _is_held_out(file_index: int, record_index: np.ndarray, fraction: float) -> np.ndarray:
  """Whether a document belongs to the held-out eval split; the same on every host."""
  keys = masking.example_keys(0x5EED, file_index, record_index)
  return masking.uniform(keys, 0, 1)[:, 0] < fraction


def load_documents(files: list[str], process_index: int = 0, process_count: int = 1,
                   held_out: bool | None = None, eval_fraction: float = 0.0) -> instances.Documents:
  """The documents of one host, from prepared TFRecord shards.

  Hosts take every `process_count`-th file, or every `process_count`-th document when there are
  fewer files than hosts; either way they are disjoint (a host may hold a file more than another:
  streams are endless, so hosts need not agree on the length of an epoch). `held_out` True/False keeps only/drops
  the `eval_fraction` of documents held out for evaluation; None keeps all.
  """
  by_file = len(files) >= process_count
  tokens, sentence_lengths, sentences_per_doc = [], [], []
  doc_counter = 0
  recorded = _recorded_shards(files)
  for file_index, path in enumerate(files):
    if by_file and file_index % process_count != process_index:
      continue
    expected = recorded.get(path)
    _check_size(path, expected)
    record, num_tokens = 0, 0
    for batch in _read_shard(path):
      doc_tokens, doc_sentences = batch["token_ids"], batch["sentence_lengths"]
      n = int(doc_tokens.nrows())
      num_tokens += int(doc_tokens.flat_values.shape[0])
      keep = np.ones(n, bool) if by_file else (doc_counter + np.arange(n)) % process_count == process_index
      if held_out is not None:
        keep &= _is_held_out(file_index, record + np.arange(n), eval_fraction) == held_out
      sentence_counts = doc_sentences.row_lengths().numpy()
      keep &= sentence_counts > 0
      record, doc_counter = record + n, doc_counter + n
      token_keep = np.repeat(keep, doc_tokens.row_lengths().numpy())
      tokens.append(doc_tokens.flat_values.numpy()[token_keep].astype(np.int32))
      sentence_lengths.append(doc_sentences.flat_values.numpy()[np.repeat(keep, sentence_counts)])
      sentences_per_doc.append(sentence_counts[keep])
    _check_counts(path, expected, {"documents": record, "tokens": num_tokens})
  return _as_documents(tokens, sentence_lengths, sentences_per_doc)


def _read_shard(path: str):
  """The parsed documents of a shard in batches; a damaged file raises DataError naming it."""
  batches = iter(tf.data.TFRecordDataset(path).batch(4096).map(lambda x: tf.io.parse_example(x, _FEATURES)))
  while True:
    try:
      yield next(batches)
    except StopIteration:
      return
    except tf.errors.OpError as e:   # DataLossError: truncated or corrupted record; parse errors
      raise failures.DataError(f"prepared shard {path} cannot be read: {e.message.splitlines()[0]}. "
                               f"{_REPAIR}") from None


def read_stats(directory: str) -> tuple[str, dict | None]:
  """(path, contents) of the stats.json `bert-jax prepare` wrote in `directory`; None without one."""
  path = os.path.join(directory, STATS_FILE)
  if not tf.io.gfile.exists(path):
    return path, None
  with tf.io.gfile.GFile(path) as f:
    return path, json.load(f)


def _recorded_shards(files: list[str]) -> dict[str, tuple[str, dict]]:
  """{path: (stats.json path, its counts)} for the files that `bert-jax prepare` recorded."""
  recorded = {}
  for directory in sorted({os.path.dirname(f) for f in files}):
    stats_path, stats = read_stats(directory)
    if stats is None:
      continue   # shards made by other tools: nothing to check against
    shards = stats.get("shards", {})
    recorded.update({f: (stats_path, shards[os.path.basename(f)]) for f in files
                     if os.path.dirname(f) == directory and os.path.basename(f) in shards})
  return recorded


def _check_size(path: str, expected: tuple[str, dict] | None) -> None:
  """Before reading: a shard's size against the one recorded (stats of older `prepare` runs have none)."""
  if expected is None or "bytes" not in expected[1]:
    return
  size = tf.io.gfile.stat(path).length
  if size != expected[1]["bytes"]:
    raise failures.DataError(f"prepared shard {path} has {size} bytes but {expected[0]} records "
                             f"{expected[1]['bytes']}: it was cut short or replaced. {_REPAIR}")


def _check_counts(path: str, expected: tuple[str, dict] | None, found: dict[str, int]) -> None:
  """After reading: the documents and tokens read against those recorded."""
  if expected is None:
    return
  for key, value in found.items():
    if key in expected[1] and expected[1][key] != value:
      raise failures.DataError(f"prepared shard {path} holds {value} {key} but {expected[0]} records "
                               f"{expected[1][key]}: it was cut short or replaced. {_REPAIR}")


def _listed_shards(directory: str, split: str, files: list[str]) -> list[str]:
  """`files` that a prepared directory's stats.json lists (all of them without one); every `split` shard it
  lists must be there."""
  stats_path, stats = read_stats(directory)
  if stats is None:
    return files
  listed = [name for name in stats.get("shards", {}) if name.startswith(f"{split}-")]
  missing = sorted(set(listed) - {os.path.basename(p) for p in files})
  if missing:
    raise failures.DataError(f"{directory} lacks {len(missing)} of the {len(listed)} {split} shards listed in "
                             f"{stats_path}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. "
                             f"{_REPAIR}")
  unlisted = [p for p in files if os.path.basename(p) not in listed]
  if unlisted:
    logging.warning("%s: %d %s shards are not in %s (an older prepare run's): not read, e.g. %s", directory,
                    len(unlisted), split, STATS_FILE, os.path.basename(unlisted[0]))
  return [p for p in files if os.path.basename(p) in listed]


def _as_documents(tokens, sentence_lengths, sentences_per_doc) -> instances.Documents:
  concat = lambda parts, dtype: np.concatenate([np.zeros(0, dtype)] + parts).astype(dtype)  # noqa: E731
  tokens, sentence_lengths = concat(tokens, np.int32), concat(sentence_lengths, np.int64)
  sentences_per_doc = concat(sentences_per_doc, np.int64)
  if sentence_lengths.sum() != len(tokens):
    raise ValueError("shards are inconsistent: sentence_lengths do not add up to the token_ids")
  return instances.Documents(tokens=tokens,
                             sentence_starts=np.concatenate([[0], np.cumsum(sentence_lengths)]),
                             doc_starts=np.concatenate([[0], np.cumsum(sentences_per_doc)]))
