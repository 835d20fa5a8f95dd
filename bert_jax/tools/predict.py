"""`bert-jax predict`: a finetuned model on new text.

    bert-jax predict --checkpoint=runs/tweets --input=new_tweets.csv --output=predictions.jsonl

The checkpoint is a finetuned workdir (or its `best/`): its `task.json` names the task, its options
and label set, so the input is read as the training files were (the same text columns) and the ids
map back to the same labels. Input: JSON lines, TSV or CSV with the task's text columns (or those named
by `--text_a`/`--text_b`); for tagging, `tokens` (a list of words) or `text` (split on whitespace), or
CoNLL-style lines; for question answering, `question` and `context` (or the columns named by
`--question`/`--context`) and an optional `id`, or a SQuAD JSON file.
Output, one record per input example, as JSON lines (`--output` ending in .jsonl, or with no extension) or
TSV/CSV (.tsv, .csv); another extension is refused:

  classification  {"id", "label", "probabilities": {label: p}}
  regression      {"id", "value"}
  tagging         {"id", "words", "tags"}           one tag per word (a sentence longer than the model's
                                                    window is tagged a window of whole words at a time)
  span            {"id", "answer"}                  the answer text ("" for no answer, SQuAD v2.0)

When every input example has its label, the task's metrics are printed too (the same numbers as the
finetuning's evaluation on that file). `Predictor` is the library call (the Python API uses it).
"""

import csv
import dataclasses
import functools
import json
import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax import metrics_writer
from bert_jax import paths
from bert_jax.models import encoder as model_lib
from bert_jax.finetune import metrics
from bert_jax.finetune import ner
from bert_jax.finetune import readers
from bert_jax.finetune import squad
from bert_jax.finetune import tasks as tasks_lib
from bert_jax.finetune import task_record as task_record_lib
from bert_jax.finetune import task_model
from bert_jax.finetune import trainer

FLAGS = flags.FLAGS
_CHUNK = 2048          # examples featurized at a time: memory stays flat on large files
_PROGRESS_FROM = 2048  # a progress bar on stderr from this many examples on


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it: importing `predict` defines none."""
  flags.DEFINE_string("checkpoint", None, "A finetuned workdir (bert-jax finetune), or its best/.")
  flags.DEFINE_string("input", None, "JSON lines, TSV or CSV (tagging: also CoNLL-style; QA: also SQuAD JSON).")
  flags.DEFINE_string("output", None, "Where the predictions go: .jsonl (or no extension), .tsv or .csv.")
  flags.DEFINE_integer("batch_size", 64, "Examples per forward pass.", lower_bound=1)
  flags.DEFINE_string("text_a", None, "The input's text column, if not the training files' one.")
  flags.DEFINE_string("text_b", None, "The input's second text column (sentence pairs), if not the training files'.")
  flags.DEFINE_string("question", None, "Question answering: the input's question column, if not `question`.")
  flags.DEFINE_string("context", None, "Question answering: the input's context column, if not `context`.")


OUTPUT_FORMATS = {".jsonl": "jsonl", "": "jsonl", ".tsv": "tsv", ".csv": "csv"}   # by the extension of --output
# The options that name an input's text columns, and the kinds of task that read them.
_COLUMN_OPTIONS = {"text_a": ("classification", "regression"), "text_b": ("classification", "regression"),
                   "question": ("span",), "context": ("span",)}
_KIND_WORDS = {"span": "question answering"}


@dataclasses.dataclass
class Predictor:
  """A finetuned model with its task: `read` an input file, `predict` its examples, `score` them."""

  task: tasks_lib.Task
  model_config: model_lib.BertConfig
  params: dict
  tokenizer: object
  max_seq_length: int
  scalar_mix: bool = False

  @classmethod
  def load(cls, path, text_a: str | None = None, text_b: str | None = None, **columns) -> "Predictor":
    """The finetuned checkpoint at `path` (a workdir or its best/); `text_a`/`text_b` (sentence tasks) or
    `question`/`context` (question answering) rename the text columns."""
    record = task_record(path)
    _check_columns(record, dict(columns, text_a=text_a, text_b=text_b))   # before the slow part
    return cls.from_loaded(checkpoint_loader.load(path), record, text_a, text_b, **columns)

  @classmethod
  def from_loaded(cls, loaded: checkpoint_loader.Loaded, record: dict, text_a=None, text_b=None,
                  **columns) -> "Predictor":
    """From what `checkpoint_loader.load` gave and the workdir's task.json (`task_record`)."""
    columns = {k: v for k, v in dict(columns, text_a=text_a, text_b=text_b).items() if v is not None}
    _check_columns(record, columns)
    opts = dict(record.get("task_opts", {}), **columns)
    task = tasks_lib.from_record(dict(record, task_opts=opts))
    return cls(task, loaded.config, loaded.params, loaded.tokenizer, record["max_seq_length"],
               record.get("scalar_mix", False))

  def read(self, path: str) -> list:
    """The examples of an input file (see the module docstring); a DataError when it holds none."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
      raise FileNotFoundError(f"input {path} does not exist")
    examples = self._read(path)
    if not examples:   # rows a reader skipped (a warning says why), or none at all
      columns = "" if self.task.kind in ("tagging", "span") else (
          " named in a header line (--text_a/--text_b name others)")
      raise readers.DataError(f"{path} holds no example to predict: give one a line, with the task's text "
                              f"columns{columns}.")
    return examples

  def _read(self, path: str) -> list:
    if self.task.kind == "tagging":
      # The gold tags as finetuning read them: CoNLL-2003's IOB1 as BIO (its `tag_scheme`).
      scheme = self.task.options.get("tag_scheme", "bio") if self.task.name == "conll2003" else ""
      examples = read_words(path, self.task.options.get("tag_column", -1), scheme)
      self._check_columns_are_tags(examples, path)
      return self._scoreable(examples, path)
    if self.task.kind == "span" and path.endswith((".jsonl", ".tsv", ".csv")):
      question, context = (self.task.options.get(k) or k for k in ("question", "context"))
      return [squad.make_example(r.get("id", str(i)), r[question], r[context], [], [])
              for i, r in enumerate(_rows_with(path, {"question": question, "context": context}))]
    return self._scoreable(self.task.read("predict", path), path)

  def _check_columns_are_tags(self, examples: list, path: str) -> None:
    """A DataError where the lines have different numbers of columns and most lines' tag column holds no tag of
    the model's: they are no CoNLL columns but sentences, a word a column (their first word would be read as
    the word and the rest dropped)."""
    if not path.endswith((".jsonl", ".json", ".tsv", ".csv")):
      tags = [t for e in examples for t in e.tags or ()]
      known = sum(t in self.task.label_names for t in tags)
      widths = {len(line.split()) for line in readers.read_text(path).splitlines() if line.strip()}
      if tags and known < len(tags) / 2 and len(widths) > 1:   # CoNLL columns: as many on every line
        raise readers.DataError(
            f"{path}: most lines' tag column holds no tag the model knows (e.g. {tags[0]!r}), so they are not "
            "the training files' columns (a word, ..., its tag). Give the words one a line (a blank line between "
            "sentences), or JSON lines with `tokens` (a list of words) or `text`")

  def _scoreable(self, examples: list, path: str) -> list:
    """`examples` as read, or without their labels (a tagger's: tags) where some are empty or not the
    model's: those are predicted and not scored (`score` gives None), with a warning naming them."""
    field = {"classification": "label", "tagging": "tags"}.get(self.task.kind)
    if field is None:
      return examples
    gold = [getattr(e, field) for e in examples]
    found = {g for g in gold if g is not None} if field == "label" else {t for tags in gold for t in tags or ()}
    unknown = sorted(str(g) for g in found - set(self.task.label_names))
    if not unknown:
      return examples
    print(f"warning: {path} has {'labels' if field == 'label' else 'tags'} the model does not know "
          f"({', '.join(map(repr, unknown[:5]))}; it knows {list(self.task.label_names)}): predicting without "
          "scoring", file=sys.stderr)
    return [dataclasses.replace(e, **{field: None}) for e in examples]

  def predict(self, examples, batch_size: int = 64, progress: bool = False) -> list[dict]:
    """One record per example (see the module docstring), in input order."""
    run = _forward(task_model.build_model(self.model_config, self.task, self.scalar_mix))
    bar = _progress(len(examples)) if progress else None
    results = []
    for start in range(0, len(examples), _CHUNK):
      chunk = examples[start:start + _CHUNK]
      if self.task.kind == "tagging":   # a sentence longer than the window: tagged a window at a time
        features, meta = self.task.featurize(chunk, self.tokenizer, self.max_seq_length)
        tags = ner.decode(self.task, run_batches(run, self.params, features, batch_size), meta)
        results += [{"id": e.guid, "words": list(e.words), "tags": t} for e, t in zip(chunk, tags)]
      else:
        features, meta = self.task.featurize(chunk, self.tokenizer, self.max_seq_length)
        results += _decode(self.task, run_batches(run, self.params, features, batch_size), chunk, meta)
      if bar is not None:
        bar.update(len(chunk))
    if bar is not None:
      bar.close()
    return results

  def score(self, examples, results) -> dict | None:
    """The task's metrics of `results` when every example has its label, else None."""
    kind = self.task.kind
    if kind == "span":
      # An unanswerable question (SQuAD v2.0's is_impossible) is labelled: its gold answer is "no answer".
      if any(not e.answers and not e.is_impossible for e in examples):
        return None
      gold = {e.qas_id: list(e.answers) for e in examples}
      answers = {e.qas_id: r["answer"] for e, r in zip(examples, results)}
      return metrics.squad_scores(answers, gold, self.task.option("version", {}, "v1.1"))
    if kind == "tagging":
      if any(e.tags is None for e in examples):
        return None
      return ner.score(self.task, [e.tags for e in examples], [r["tags"] for r in results])
    if any(e.label is None for e in examples):
      return None
    outputs = np.array([r["value"] if kind == "regression" else
                        [r["probabilities"][n] for n in self.task.label_names] for r in results])
    return self.task.evaluate(outputs, examples, {"example_index": np.arange(len(examples))})


def task_record(path) -> dict:
  """The task.json of the finetuned workdir holding checkpoint `path`; FileNotFoundError without one, or where
  its run saved no checkpoint yet. A run that did not finish (no results.json) is used with a warning: its best
  checkpoint so far."""
  try:
    record = task_record_lib.read(path)
  except failures.UserError:   # no checkpoint there
    workdir = paths.absolute(str(path))
    if os.path.isfile(os.path.join(workdir, task_record_lib.TASK_FILE)):
      if os.path.isfile(os.path.join(workdir, trainer.RESULTS_FILE)):
        raise FileNotFoundError(f"{path} holds a finetuning run that finished without keeping a checkpoint "
                                "(keep_best_checkpoint False): finetune again with it True") from None
      raise FileNotFoundError(f"{path} holds a finetuning run that saved no checkpoint yet (its best/ comes with "
                              "its first evaluation): run it again with `bert-jax finetune`") from None
    raise
  if record is None:
    raise FileNotFoundError(
        f"{path} is not a finetuned workdir: it has no {task_record_lib.TASK_FILE}. A finetuned model is needed "
        "here: the workdir of `bert-jax finetune` (task.json there names the task, its text columns and label set).")
  workdir = checkpoint_loader.find(path).directory
  # A finetuning run's workdir (its log) without its results; not an export (prune's), which has neither.
  if (os.path.isfile(os.path.join(workdir, metrics_writer.JSONL))
      and not os.path.isfile(os.path.join(workdir, trainer.RESULTS_FILE))):
    print(f"warning: {workdir} holds a finetuning run that did not finish (no {trainer.RESULTS_FILE}): its best "
          "checkpoint so far is used", file=sys.stderr)
  return record


# ------------------------------------------------------------------------------------------------
# Reading, running, decoding.


def _check_columns(record: dict, columns: dict) -> None:
  """A UserError when a column is named (`--text_a`, `--question` ...) that the task does not read."""
  kind = tasks_lib.from_record(record).kind
  wrong = next((o for o, v in columns.items() if v is not None and kind not in _COLUMN_OPTIONS[o]), None)
  if wrong is None:
    return
  uses = [f"--{o}" for o, kinds in _COLUMN_OPTIONS.items() if kind in kinds]
  what = "question answering's input" if "span" in _COLUMN_OPTIONS[wrong] else "a sentence task's input"
  raise failures.UserError(f"--{wrong} names a column of {what}, and the model is for {_KIND_WORDS.get(kind, kind)} "
                           f"({record['task']}): " + (f"name its columns with {'/'.join(uses)}." if uses else
                                                      "it reads no column by that name."))


def _rows_with(path: str, columns: dict) -> list[dict]:
  """The rows of `path`; a DataError unless each has the {option: column} `columns` (options are flags here)."""
  rows = readers.read_rows(path, short_rows="keep")   # a row without its label is still one to predict
  readers.check_columns(path, rows, columns, None, labelled=False, options={o: f"--{o}" for o in columns})
  for i, row in enumerate(rows):   # JSON lines: a column is there when one row has it
    missing = [c for c in columns.values() if row.get(c) is None]
    if missing:
      raise readers.DataError(f"{path}, example {i + 1}: no {missing[0]!r} field; every example needs its text.")
  return rows


def read_words(path: str, tag_column: int = -1, scheme: str = "") -> list[ner.NerExample]:
  """Sentences to tag: CoNLL-style lines (a word per line, or the training files' columns), or JSON lines /
  TSV / CSV rows with `tokens` (a list of words; in a TSV / CSV cell, words split on whitespace) or `text`
  (split on whitespace), and optional `tags` (a list, or a cell of tags split on whitespace). `scheme`
  "bio" reads IOB1 tags as BIO (`ner.parse_conll`), "" as written."""
  if not path.endswith((".jsonl", ".json", ".tsv", ".csv")):
    lines = readers.read_text(path).splitlines()
    if all(len(line.split()) <= 1 for line in lines):   # words only: no gold tags
      lines = [f"{line.strip()} _" if line.strip() else "" for line in lines]
      return [dataclasses.replace(e, tags=None) for e in ner.parse_conll(lines, scheme="", path=path)]
    return ner.parse_conll(lines, scheme=scheme, tag_column=tag_column, path=path,
                           tag_flag="the column the finetuned run read its tags from: give the input its training "
                                    "files' columns, or the words alone")
  rows = readers.read_rows(path, short_rows="keep")
  if not rows or not all("tokens" in r or "text" in r for r in rows):
    raise readers.DataError(f"{path}: every example needs `tokens` (a list of words) or `text` to tag.")
  examples = []
  for i, r in enumerate(rows):
    words = _as_list(r["tokens"]) if "tokens" in r else str(r["text"]).split()
    tags = _as_list(r.get("tags"))
    if tags and len(tags) != len(words):
      raise readers.DataError(f"{path}: example {r.get('id', i)!r} has {len(words)} words and {len(tags)} tags.")
    if tags and scheme == "bio":
      tags = ner.iob1_to_bio(tags)
    examples.append(ner.NerExample(str(r.get("id", i)), tuple(words), tuple(tags) if tags else None))
  return examples


def _as_list(value):
  """A JSON list as it is; a TSV / CSV cell (a string) split on whitespace; None (no column) as None."""
  return value.split() if isinstance(value, str) else value


def _forward(module):
  """Jitted (params, features) -> the head's outputs; params are an argument, not baked-in constants."""
  return jax.jit(functools.partial(task_model.predict_step, model=module))


def run_batches(run, params, features: dict, batch_size: int):
  """`run(params, batch)` on every row of `features` in batches of one shape (the last padded); numpy."""
  n, chunks = len(features["input_ids"]), []
  inputs = {k: features[k] for k in ("input_ids", "input_mask", "segment_ids")}
  for start in range(0, n, batch_size):
    rows = np.arange(start, start + batch_size)
    real = min(batch_size, n - start)
    rows[real:] = start  # pad with copies of the first row: one compiled shape
    out = jax.device_get(run(params, {k: v[rows] for k, v in inputs.items()}))
    chunks.append(jax.tree.map(lambda x, real=real: np.asarray(x)[:real], out))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *chunks)


def _softmax(logits):
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)


def _decode(task, outputs, examples, meta) -> list[dict]:
  kind = task.kind
  if kind == "classification":
    probs = _softmax(np.asarray(outputs, np.float64))
    return [{"id": e.guid, "label": task.label_names[int(p.argmax())],
             "probabilities": {n: float(x) for n, x in zip(task.label_names, p)}} for e, p in zip(examples, probs)]
  if kind == "regression":
    return [{"id": e.guid, "value": float(v)} for e, v in zip(examples, np.asarray(outputs).reshape(-1))]
  answers, _, _ = squad.decode(outputs, examples, meta, **squad.decode_opts(task, {}))
  return [{"id": e.qas_id, "answer": answers[e.qas_id]} for e in examples]


def _progress(total: int):
  if total < _PROGRESS_FROM:
    return None
  try:
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return tqdm(total=total, unit="ex", file=sys.stderr, desc="predict")


# ------------------------------------------------------------------------------------------------
# Writing.


def output_format(path: str) -> str:
  """"jsonl", "tsv" or "csv", by the extension of `path`; a UserError for another extension."""
  ext = os.path.splitext(path)[1].lower()
  if ext not in OUTPUT_FORMATS:
    raise failures.UserError(f"--output={path}: predict writes JSON lines (.jsonl), TSV (.tsv) or CSV (.csv), not "
                             f"{ext}; give one of these extensions.")
  return OUTPUT_FORMATS[ext]


def write(path: str, results: list[dict]) -> None:
  """JSON lines, or TSV/CSV (by extension): a column per field, probabilities as `p_<label>`."""
  fmt = output_format(path)
  if fmt == "jsonl":
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in results)
    return
  rows = [_flat(r) for r in results]
  header = list(rows[0]) if rows else ["id"]
  with open(path, "w", encoding="utf-8", newline="") as f:
    writer = csv.DictWriter(f, header, delimiter="\t" if fmt == "tsv" else ",",
                            **({"quoting": csv.QUOTE_NONE, "escapechar": "\\"} if fmt == "tsv" else {}))
    writer.writeheader()
    writer.writerows(rows)


def _flat(record: dict) -> dict:
  out = {}
  for key, value in record.items():
    if isinstance(value, dict):
      out.update({f"p_{k}": f"{v:.6f}" for k, v in value.items()})
    elif isinstance(value, list):
      out[key] = " ".join(value)
    else:
      out[key] = value
  return out


def main(argv) -> None:
  """`bert-jax predict` (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for name in ("checkpoint", "input", "output"):
    if FLAGS[name].value is None:
      raise app.UsageError(f"--{name} is required")
  try:
    output_format(FLAGS.output)
    output = paths.output_file(FLAGS.output, "output", example="predictions.jsonl")
    predictor = Predictor.load(FLAGS.checkpoint, FLAGS.text_a, FLAGS.text_b, question=FLAGS.question,
                               context=FLAGS.context)
    examples = predictor.read(FLAGS.input)
  except (OSError, ValueError) as e:  # the user's files (readers.DataError ...): say which and why
    failures.say_and_exit(failures.UserError(str(e)), prefix="bert-jax predict")
  results = predictor.predict(examples, FLAGS.batch_size, progress=True)
  write(output, results)
  scores = predictor.score(examples, results)
  summary = {"examples": len(results), "output": output}
  print(json.dumps(summary | ({"metrics": scores} if scores is not None else {}), indent=1))
