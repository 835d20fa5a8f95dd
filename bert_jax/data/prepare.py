"""`bert-jax prepare`: a corpus -> sharded, tokenized documents for pretraining.

    bert-jax prepare --input=corpus/*.jsonl --output_dir=data/news --vocab_file=vocab.txt
    bert-jax prepare --input=embedded:shakespeare --output_dir=data/shakespeare --vocab_size=8000

Output (read by `input_pipeline.py`):
  DIR/train-00000-of-000NN.tfrecord   one `tf.train.Example` per document: int64 `token_ids` (its
                                      sentences' ids concatenated, no specials) and int64
                                      `sentence_lengths` (tokens per sentence)
  DIR/eval-00000-of-000NN.tfrecord    same, when an eval split is asked for (eval-input-*: the
                                      shards of `--eval_input`)
  DIR/vocab.txt or DIR/spm.model      the tokenizer, so `tokenizer.load_tokenizer(DIR)` works
    or DIR/vocab.json + merges.txt    (byte-level BPE)
  DIR/stats.json                      documents, sentences, tokens, per-shard counts and bytes (the
                                      reader checks every shard against them), bad input
  DIR/.prepare/                       the settings used and one record per finished shard task

Each shard is tokenized by its own worker process (`shard_writing.write_shard`) from its own byte range
of the input (see `corpus.plan`), so the corpus is streamed, never held in memory, and read once; the
shards do not depend on the number of workers. A shard is written under a temporary name and renamed when
complete; a re-run skips the shards already there (and refuses a directory made with other settings).
"""

import collections
import contextlib
import hashlib
import json
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import time

from absl import app
from absl import flags
from absl import logging

from bert_jax import failures
from bert_jax import paths
from bert_jax.data import corpus
from bert_jax.data import instances
from bert_jax.data import shard_writing
from bert_jax.data import tokenizer as tokenization
from bert_jax.data import vocab_training

_INPUT = flags.DEFINE_string("input", None,
                             "Corpus spec: file/glob/dir, tfds:name:split:key or embedded:shakespeare.")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where shards, tokenizer and stats.json go.")
_VOCAB_FILE = flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt, SentencePiece .model, byte-level "
                                  "BPE vocab.json (merges.txt beside it) or a directory holding one; "
                                  "when absent, one is trained on a sample of the corpus.")
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", True, "Lowercase (and strip accents for WordPiece).")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size to train when no --vocab_file.",
                                  lower_bound=1)
_VOCAB_MODEL = flags.DEFINE_enum("vocab_model", "wordpiece", list(vocab_training.VOCAB_MODELS),
                                 "Vocabulary to train when no --vocab_file: wordpiece, SentencePiece "
                                 "unigram or bpe, or byte_bpe (byte-level BPE as RoBERTa; cased, "
                                 "--do_lower_case does not apply).")
_NUM_SHARDS = flags.DEFINE_integer("num_shards", None, "Output shards (default: about 64 MiB of input each).",
                                  lower_bound=1)
_NUM_WORKERS = flags.DEFINE_integer("num_workers", None, "Worker processes (default: all cores).", lower_bound=1)
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", 0.0, "Fraction of documents held out as eval, in [0, 0.99].",
                                    lower_bound=0.0, upper_bound=0.99)
_EVAL_INPUT = flags.DEFINE_string("eval_input", None, "A separate corpus spec for the eval split.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data_dir of tfds: specs (with the dataset prepared).")
_TEXT_KEY = flags.DEFINE_string("text_key", "text", "JSON field holding a document's text.")

STATS_FILE = "stats.json"
_PROGRESS_DIR = ".prepare"         # per-shard stats of finished shards, and the settings they used
_BYTES_PER_SHARD = 64 << 20


def shard_name(split: str, index: int, num_shards: int) -> str:
  return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord"


# ---------------------------------------------------------------------------------------------
# Main process: tokenizer, tasks, progress, stats.


def _ensure_tokenizer(spec, output_dir, vocab_file, do_lower_case, vocab_size, vocab_model,
                      data_dir, text_key, sample_sentences) -> str:
  """The tokenizer file for `output_dir`: a given one copied into a staging folder (`_stage_in` moves it into
  `output_dir` once the settings guard has passed it: a refused run leaves the folder's own), else one reused
  from a previous run, or trained."""
  if vocab_file:
    shutil.rmtree(_staging(output_dir), ignore_errors=True)
    os.makedirs(_staging(output_dir))
    return tokenization.load_tokenizer(vocab_file, do_lower_case).save(_staging(output_dir))
  for name in vocab_training.TRAINED_FILES:
    if os.path.exists(os.path.join(output_dir, name)):
      logging.info("Reusing the tokenizer trained by a previous run: %s", name)
      return os.path.join(output_dir, name)
  logging.info("Training a %s vocabulary of %d on up to %d sentences of %s", vocab_model, vocab_size,
               sample_sentences, spec)
  sample = _sample_sentences(spec, data_dir, text_key, sample_sentences)   # not empty: `_has_text` came first
  return vocab_training.train(vocab_model, sample, vocab_size, output_dir, do_lower_case)


_NO_TEXT = ("{spec} holds no text: no JSON line with a string field '{text_key}' (--text_key) and no non-blank "
            "line of plain text")


def _has_text(spec, data_dir, text_key) -> bool:
  """Whether the corpus holds a document with a sentence (read up to the first one)."""
  parts = [p for group in corpus.plan(spec, 1, data_dir=data_dir, text_key=text_key) for p in group]
  return any(any(corpus.read_part(p, text_key=text_key)) for p in parts)


def _sample_sentences(spec, data_dir, text_key, limit) -> list[str]:
  """Sentences from the corpus's parts in turn, so the sample spans the whole corpus."""
  parts = [p for group in corpus.plan(spec, 16, data_dir=data_dir, text_key=text_key) for p in group]
  readers = [corpus.read_part(p, text_key=text_key) for p in parts]
  sample = []
  while readers and len(sample) < limit:
    for reader in list(readers):
      document = next(reader, None)
      if document is None:
        readers.remove(reader)
      else:
        sample.extend(document)
  return sample[:limit]


def _staging(output_dir: str) -> str:
  """Where a given tokenizer waits for the settings guard (`_ensure_tokenizer`)."""
  return os.path.join(output_dir, _PROGRESS_DIR, "tokenizer")


def _stage_in(tokenizer_file: str, output_dir: str) -> str:
  """Moves the staged tokenizer's files into `output_dir`; returns `tokenizer_file`'s path there."""
  for name in os.listdir(_staging(output_dir)):
    os.replace(os.path.join(_staging(output_dir), name), os.path.join(output_dir, name))
  os.rmdir(_staging(output_dir))
  return os.path.join(output_dir, os.path.basename(tokenizer_file))


def _settings_guard(output_dir: str, settings: dict, *, record: bool = True) -> None:
  """Refuses to mix shards made with different settings in one directory, naming the fields that differ (a
  field a previous version did not record is not compared); `record`: write the settings where none are."""
  path = os.path.join(output_dir, _PROGRESS_DIR, "settings.json")
  if os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
    if previous.get("eval_input") and "://" not in previous["eval_input"]:   # recorded as typed before
      previous["eval_input"] = paths.absolute(previous["eval_input"])
    differ = [k for k in settings if k in previous and previous[k] != settings[k]]
    if differ:
      said = "; ".join(f"{k}: {previous[k]!r} there, {settings[k]!r} now" for k in differ)
      raise ValueError(f"{output_dir} holds shards prepared with other settings ({said}): use a new --output_dir")
  elif record:
    with open(path, "w") as f:
      json.dump(settings, f, indent=1)


def _default_num_shards(spec: str, data_dir: str | None) -> int:
  """About `_BYTES_PER_SHARD` of input per shard (and at least one shard per core)."""
  if spec == corpus.SHAKESPEARE:
    num_bytes = 5 << 20
  elif spec.startswith("tfds:"):
    name, split, _ = corpus.parse_tfds_spec(spec)
    splits = corpus.tfds_builder(name, data_dir).info.splits
    num_bytes = splits[split].num_bytes if split in splits else sum(s.num_bytes for s in splits.values())
  else:
    num_bytes = sum(os.path.getsize(p) for p in corpus.expand_files(spec))
  return max(os.cpu_count() or 1, num_bytes // _BYTES_PER_SHARD + 1)


def _tasks(spec, output_dir, num_shards, eval_fraction, eval_spec, common, counters, data_dir, text_key):
  tasks = []
  splits = [("train", spec, num_shards)]
  if eval_spec:
    splits.append(("eval", eval_spec, max(1, num_shards // 16)))
  for split, split_spec, n in splits:
    parts = corpus.plan(split_spec, n, data_dir=data_dir, text_key=text_key, counters=counters)
    if any(parts) and (empty := sum(not p for p in parts)):
      logging.warning("%d of the %d %s shards get no input: a .gz file is read whole, by one shard; give at "
                      "least as many .gz files as shards, or fewer shards (--num_shards)", empty, n, split)
    for k, task_parts in enumerate(parts):
      # The eval input's shards have a name of their own: held-out train shards are eval-<k>-of-<N> too, and
      # with N = 1 the two first shards would be one file. The reader's eval-* takes both.
      outputs = {split: os.path.join(output_dir, shard_name("eval-input" if split == "eval" else split, k, n))}
      if split == "train" and eval_fraction > 0:
        outputs["eval"] = os.path.join(output_dir, shard_name("eval", k, n))
      tasks.append(dict(common, name=f"{split}-{k:05d}", index=k, parts=task_parts, outputs=outputs,
                        eval_fraction=eval_fraction))
  return tasks


def prepare_corpus(spec: str, output_dir: str, *, vocab_file: str | None = None, do_lower_case: bool = True,
                   train_vocab_size: int | None = None, vocab_model: str = "wordpiece",
                   num_shards: int | None = None, num_workers: int | None = None,
                   eval_fraction: float = 0.0, eval_spec: str | None = None, data_dir: str | None = None,
                   text_key: str = "text", vocab_sample_sentences: int = 1_000_000) -> dict:
  """Tokenizes `spec` into `output_dir` (format in the module docstring); returns the stats.

  Args:
    vocab_file: tokenizer to use; when None one is trained (`train_vocab_size`, default 30522, of
      `vocab_model`) on up to `vocab_sample_sentences` sentences drawn across the corpus, or reused
      from a previous run.
    eval_fraction: documents held out into eval shards (a fixed pseudo-random choice).
    eval_spec: alternatively, a separate corpus for the eval shards.
  """
  start = time.time()
  # The input is found first, whatever `num_shards` (an empty glob or an unprepared TFDS dataset stops here):
  # nothing is written or trained for a corpus that is not there.
  default_shards = _default_num_shards(spec, data_dir)
  num_shards = num_shards or default_shards
  # Before anything is written (a corrected rerun may use the folder), and before a vocabulary is trained on no
  # sentences: one of the special tokens alone, which no worker can build a tokenizer from.
  if not _has_text(spec, data_dir, text_key):
    raise ValueError(_NO_TEXT.format(spec=spec, text_key=text_key))
  os.makedirs(os.path.join(output_dir, _PROGRESS_DIR), exist_ok=True)
  vocab_size = train_vocab_size or 30522
  settings = dict(input=spec, eval_input=eval_spec, eval_fraction=eval_fraction, num_shards=num_shards,
                  do_lower_case=do_lower_case, text_key=text_key,
                  trained_vocab=None if vocab_file else {"model": vocab_model, "size": vocab_size})
  _settings_guard(output_dir, settings, record=False)   # before a vocabulary is reused or trained for them
  tokenizer_file = _ensure_tokenizer(spec, output_dir, vocab_file, do_lower_case, vocab_size, vocab_model,
                                     data_dir, text_key, vocab_sample_sentences)
  with open(tokenizer_file, "rb") as f:
    settings["tokenizer_sha256"] = hashlib.sha256(f.read()).hexdigest()
  try:
    _settings_guard(output_dir, settings)
  except ValueError:
    shutil.rmtree(_staging(output_dir), ignore_errors=True)
    raise
  if vocab_file:   # trained or reused, it is in place already
    tokenizer_file = _stage_in(tokenizer_file, output_dir)
  counters = collections.Counter()
  common = dict(tokenizer_dir=output_dir, do_lower_case=do_lower_case, text_key=text_key)
  tasks = _tasks(spec, output_dir, num_shards, eval_fraction, eval_spec, common, counters, data_dir, text_key)
  results, todo = _finished_results(output_dir, tasks)
  logging.info("%d shard tasks, %d already done", len(tasks), len(tasks) - len(todo))
  results += _run(todo, output_dir, num_workers, do_lower_case)
  stats = _summarize(results, counters, tokenizer_file, do_lower_case, settings)
  if not stats["documents"]:
    bad = {k: v for k, v in stats["bad_input"].items() if v}
    raise ValueError(_NO_TEXT.format(spec=spec, text_key=text_key) + (f" (skipped: {bad})" if bad else ""))
  stats["seconds"] = round(time.time() - start, 3)
  with open(os.path.join(output_dir, STATS_FILE), "w") as f:
    json.dump(stats, f, indent=1)
  bad = {k: v for k, v in stats["bad_input"].items() if v}
  if bad:
    logging.warning("Bad input (skipped or repaired, see %s): %s", STATS_FILE, bad)
  for warning in few_documents(stats["splits"]):
    logging.warning("%s", warning)
  logging.info("%d documents, %d sentences, %d tokens in %.1f s", stats["documents"], stats["sentences"],
               stats["tokens"], stats["seconds"])
  return stats


def few_documents(splits: dict) -> list[str]:
  """What a split of `stats.json` is too small for (`instances.min_documents`), which pretraining would only say
  once it starts on it."""
  said = []
  for name, split in splits.items():
    n = split["documents"]
    short = [f for f in instances.FORMATS if n < instances.min_documents(f)]
    if not n:
      said.append(f"the {name} split holds no document: a pretraining run that reads it stops at its start"
                  + ("; hold out more with --eval_fraction, or give --eval_input" if name == "eval" else ""))
    elif short:
      least = max(instances.min_documents(f) for f in short)
      said.append(f"the {name} split holds {n} document{'s' * (n > 1)}: data.format {' and '.join(map(repr, short))} "
                  f"need{'s' * (len(short) == 1)} at least {least} on each host pretraining runs on (a random next "
                  "sentence comes from another document); the other formats take it")
  return said


def _progress_path(output_dir: str, task_name: str) -> str:
  return os.path.join(output_dir, _PROGRESS_DIR, task_name + ".json")


def _parts_key(task) -> str:
  """What a shard task reads (its parts of the input), as recorded beside its finished shards."""
  return hashlib.sha256(repr(task["parts"]).encode()).hexdigest()


def _finished_results(output_dir, tasks):
  """Results of tasks whose shards exist and whose progress record says they read the parts they read now;
  the other tasks (a record from another cut of the input, or from before cuts were recorded, is redone)."""
  results, todo = [], []
  for task in tasks:
    progress = _progress_path(output_dir, task["name"])
    record = None
    if os.path.exists(progress) and all(os.path.exists(p) for p in task["outputs"].values()):
      with open(progress) as f:
        record = json.load(f)
    if record is not None and record.get("parts") == _parts_key(task):
      results.append(record)
    else:
      todo.append(task)
  return results, todo


def _run(tasks, output_dir, num_workers, do_lower_case) -> list[dict]:
  """Runs the shard tasks on `num_workers` processes (1: in this process), logging progress."""
  if not tasks:
    return []
  num_workers = max(1, min(num_workers or os.cpu_count() or 1, len(tasks)))
  results, tokens, start = [], 0, time.time()
  keys = {task["name"]: _parts_key(task) for task in tasks}
  with contextlib.ExitStack() as stack:
    if num_workers == 1:
      shard_writing.warm_up(output_dir, do_lower_case)
      finished = map(shard_writing.write_shard, tasks)
    else:
      pool = stack.enter_context(_worker_pool(num_workers, output_dir, do_lower_case))
      finished = pool.imap_unordered(shard_writing.write_shard, tasks)
    for result in finished:
      result["parts"] = keys[result["task"]]
      with open(_progress_path(output_dir, result["task"]), "w") as f:
        json.dump(result, f)
      results.append(result)
      tokens += sum(s.get("tokens", 0) for s in result["shards"].values())
      logging.info("[%d/%d shards] %s done; %d tokens so far, %.0f tokens/s", len(results), len(tasks),
                   result["task"], tokens, tokens / max(time.time() - start, 1e-9))
  return results


@contextlib.contextmanager
def _worker_pool(num_workers: int, output_dir: str, do_lower_case: bool):
  """Workers forked from a fresh server process that imported TensorFlow once.

  Not forked from this process (which may run TensorFlow or JAX threads that must not be forked),
  and not spawned either, which would import TensorFlow in each (about 5 CPU-seconds apiece).
  """
  context = multiprocessing.get_context("forkserver")
  context.set_forkserver_preload(["bert_jax.data.quiet_tensorflow", "bert_jax.data.prepare"])
  try:
    with context.Pool(num_workers, shard_writing.warm_up_worker, (output_dir, do_lower_case)) as pool:
      yield pool
  finally:
    # Otherwise the server, and the GB of TensorFlow it holds, lives as long as this process: a
    # whole training run when `train.py` prepares its corpus. It restarts if needed again.
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)  # pylint: disable=protected-access
    if stop is not None:
      stop()


def _summarize(results, counters, tokenizer_file, do_lower_case, settings) -> dict:
  shards = {name: c for r in sorted(results, key=lambda r: r["task"]) for name, c in r["shards"].items()}
  for r in results:
    counters.update(r["counters"])
  tokenizer = tokenization.load_tokenizer(tokenizer_file, do_lower_case)
  splits = {}
  for name, c in sorted(shards.items()):
    split = splits.setdefault(name.split("-")[0], collections.Counter())
    split.update(c)
  total = sum(splits.values(), collections.Counter())
  return {
      "documents": total["documents"], "sentences": total["sentences"], "tokens": total["tokens"],
      "splits": {s: {"documents": c["documents"], "sentences": c["sentences"], "tokens": c["tokens"]}
                 for s, c in splits.items()},
      # What the input pipeline checks every shard against when it reads it (bytes: not in older runs).
      "shards": {n: {k: c.get(k, 0) for k in ("documents", "sentences", "tokens")}
                    | ({"bytes": c["bytes"]} if "bytes" in c else {}) for n, c in shards.items()},
      "bad_input": {k: counters.get(k, 0) for k in corpus.COUNTERS + ("empty_sentences",)},
      "tokenizer": tokenizer.kind,
      "tokenizer_file": os.path.basename(tokenizer_file),
      "vocab_size": tokenizer.vocab_size,
      "do_lower_case": do_lower_case,
      "settings": settings,
      # Time inside shard tasks, summed over workers (excludes process start-up and TF import).
      "worker_seconds": round(sum(r.get("seconds", 0.0) for r in results), 3),
      "worker_cpu_seconds": round(sum(r.get("cpu_seconds", 0.0) for r in results), 3),
  }


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _INPUT.value or not _OUTPUT_DIR.value:
    raise failures.UserError("--input and --output_dir are required")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.INFO)   # this command's own progress lines ([k/n shards] ...)
  # The input, a TFDS dataset, the vocabulary or the output directory: one paragraph, not a traceback.
  with failures.as_user_errors("bert-jax prepare", FileNotFoundError, NotADirectoryError, ValueError), \
       failures.stop_message("bert-jax prepare", "the shard tasks that finished are kept: the same command "
                             "prepares the others", at_once=False):
    stats = prepare_corpus(
        paths.absolute(_INPUT.value), paths.output_dir(_OUTPUT_DIR.value, "output_dir"),
        vocab_file=_VOCAB_FILE.value,
        do_lower_case=_DO_LOWER_CASE.value, train_vocab_size=_VOCAB_SIZE.value, vocab_model=_VOCAB_MODEL.value,
        num_shards=_NUM_SHARDS.value, num_workers=_NUM_WORKERS.value, eval_fraction=_EVAL_FRACTION.value,
        eval_spec=paths.absolute(_EVAL_INPUT.value) if _EVAL_INPUT.value else None, data_dir=_DATA_DIR.value,
        text_key=_TEXT_KEY.value)
  summary = ("documents", "sentences", "tokens", "splits", "bad_input", "seconds")
  print(json.dumps({k: stats[k] for k in summary}))
