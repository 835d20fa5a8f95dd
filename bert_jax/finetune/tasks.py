"""Finetuning tasks: how to read, featurize, score and write predictions for each.

    task = tasks.get_task("mnli")
    examples = task.read("dev_matched", "/data/glue/MNLI")          # or "tfds", data_dir=...
    features, meta = task.featurize(examples, tokenizer, max_seq_length=128)
    logits = ...                                                      # model outputs, feature order
    task.evaluate(logits, examples, meta)                             # {"accuracy": 0.84}
    task.write_predictions("MNLI-m.tsv", logits, examples, meta)      # GLUE submission file

Features are numpy arrays with one row per feature (`input_ids`, `input_mask`, `segment_ids` int32
[N, L] and the labels of the task's kind); `meta["example_index"]` [N] maps features to examples
(one-to-one except SQuAD, whose long contexts give several windows). Predictions are what the model's
head returns for the features, in feature order: logits [N, C] (classification), [N] or [N, 1]
(regression), {"start_logits", "end_logits"} [N, L] (span), [N, L, C] (tagging).
"""

import dataclasses
import functools
from typing import Any, Callable

import numpy as np

from bert_jax.finetune import metrics, ner, readers, squad

KINDS = ("classification", "regression", "span", "tagging")


@dataclasses.dataclass(frozen=True)
class Task:
  """A task: its labels, splits, metrics, and the functions behind `read`/`featurize`/`evaluate`."""

  name: str
  kind: str
  label_names: tuple[str, ...]
  primary_metric: str
  splits: tuple[str, ...]
  reader: Callable[..., list]           # (split, source, data_dir) -> examples
  metric_names: tuple[str, ...] = ()    # classification/regression: what `evaluate` reports
  options: dict = dataclasses.field(default_factory=dict, hash=False)  # kind-specific defaults
  locate: Callable[[str, str], str] | None = None  # (split, source) -> the file read, for messages

  @property
  def num_labels(self) -> int:
    """Outputs of the task's head: 1 for regression, else the number of labels."""
    return 1 if self.kind == "regression" else len(self.label_names)

  @property
  def dev_splits(self) -> tuple[str, ...]:
    """The splits evaluated during finetuning (dev, or dev_matched/dev_mismatched)."""
    return tuple(s for s in self.splits if s.startswith("dev"))

  def read(self, split: str, source: str, data_dir: str | None = None) -> list:
    """Examples of `split` from a local path, or from "tfds" / "tfds:<name>" in a prepared `data_dir`
    (default: the task option `tfds_data_dir`)."""
    return self.reader(split, source, data_dir or self.options.get("tfds_data_dir"))

  def featurize(self, examples, tokenizer, max_seq_length: int, **opts) -> tuple[dict, dict]:
    """(features: dict of numpy arrays [N, ...], meta for `evaluate`); `opts` override task options."""
    return _IMPL[self.kind].featurize(self, examples, tokenizer, max_seq_length, **opts)

  def evaluate(self, predictions, examples, meta, **opts) -> dict[str, float]:
    """The task's official metrics (fractions in [0, 1]) of `predictions` for the featurized examples."""
    return _IMPL[self.kind].evaluate(self, predictions, examples, meta, **opts)

  def write_predictions(self, path: str, predictions, examples, meta, **opts) -> None:
    """GLUE submission TSV (`index<TAB>prediction`), SQuAD JSON {qid: text}, or CoNLL text."""
    _IMPL[self.kind].write_predictions(self, path, predictions, examples, meta, **opts)

  def option(self, key: str, opts: dict, default: Any = None) -> Any:
    """`opts[key]`, else the task option, else `default`."""
    return opts.get(key, self.options.get(key, default))

  def file(self, split: str, source: str) -> str:
    """The file `read(split, source)` reads (`source` when the task cannot tell), for messages."""
    if self.locate is None or readers.is_tfds(source):
      return f"{source} ({split})" if readers.is_tfds(source) else source
    try:
      return self.locate(split, source)
    except (FileNotFoundError, readers.DataError):
      return source

  def with_labels_from(self, examples, path: str) -> "Task":
    """The task, with the sorted label set of `examples` (the training file `path`) when it has none.

    Generic classification and tagging read their labels from the training data; every other task
    keeps its own. Raises DataError when `examples` hold no labels, an empty one, a label outside a
    given set, or a number of labels other than `num_labels`.
    """
    labels = _labels_of(self, examples, path)
    if self.kind not in ("classification", "tagging") or self.label_names:
      self.check_labelled(examples, path)
      return self
    names = _sorted_labels(labels)
    wanted = self.options.get("num_labels") or 0
    if wanted and len(names) != wanted:
      raise readers.DataError(
          f"{path} holds {len(names)} distinct labels {list(names)[:20]} but task_opts.num_labels is {wanted}. "
          "Leave num_labels out (the labels are read from the training file), or name them with "
          "--config.task_opts.labels=" + ",".join(names[:3]) + ("..." if len(names) > 3 else ""))
    if len(names) < 2 and self.kind == "classification":
      raise readers.DataError(f"{path}: every example has label {names[0]!r}; a classifier needs two labels "
                              "or more in its training file.")
    return self.with_label_names(names)

  def with_label_names(self, names) -> "Task":
    """The task with the label set `names` (generic classification and tagging), and the metrics it implies."""
    names, options = tuple(names), dict(self.options)
    if self.kind == "tagging":
      options["span_f1"] = ner.is_bio(names)
      metric_names = ()
      primary = options.get("primary_metric") or ("f1" if options["span_f1"] else "token_accuracy")
    else:
      metric_names = ("accuracy", "f1", "mcc") if len(names) == 2 else ("accuracy",)
      primary = options.get("primary_metric") or "accuracy"
    return dataclasses.replace(self, label_names=names, options=options, metric_names=metric_names,
                               primary_metric=primary)

  def check_labelled(self, examples, path: str) -> None:
    """Raises DataError unless every example of `path` has a label the task knows (training, dev)."""
    labels = _labels_of(self, examples, path)
    if self.kind in ("classification", "tagging") and self.label_names:
      unknown = sorted(set(labels) - set(self.label_names))
      if unknown:
        raise readers.DataError(
            f"{path}: label {unknown[0]!r}" + (f" (and {len(unknown) - 1} more: {unknown[1:6]})" if len(unknown) > 1
                                              else "")
            + f" is not in the label set {list(self.label_names)[:20]}: fix the label (a generic task's set is "
            "its training file's, or every label named with --config.task_opts.labels=a,b,c; a finetuned model's "
            "the one it was trained with).")


# ---------------------------------------------------------------------------------------------
# Sentence and sentence-pair classification / regression.


class _Pairs:
  """featurize / evaluate / write_predictions of classification and regression tasks."""

  @staticmethod
  def featurize(task, examples, tokenizer, max_seq_length, **opts):
    del opts
    n = len(examples)
    input_ids = np.zeros([n, max_seq_length], np.int32)
    segment_ids = np.zeros([n, max_seq_length], np.int32)
    input_mask = np.zeros([n, max_seq_length], np.int32)
    for i, ex in enumerate(examples):
      ids, segs = tokenizer.encode_pair(ex.text_a, ex.text_b, max_length=max_seq_length)
      input_ids[i, :len(ids)], segment_ids[i, :len(ids)], input_mask[i, :len(ids)] = ids, segs, 1
    input_ids[input_mask == 0] = tokenizer.pad_id
    features = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
                "label": _label_array(task, examples)}
    return features, {"example_index": np.arange(n)}

  @staticmethod
  def evaluate(task, predictions, examples, meta, **opts):
    del opts
    preds = _Pairs.decode(task, predictions)[meta["example_index"].argsort()]
    labels = _label_array(task, examples)
    unlabelled = np.isnan(labels) if task.kind == "regression" else labels < 0
    if unlabelled.any():
      raise ValueError(f"{task.name}: cannot evaluate examples without labels (a test split?)")
    return {name: float(_METRICS[name](labels, preds)) for name in task.metric_names}

  @staticmethod
  def decode(task, predictions) -> np.ndarray:
    predictions = np.asarray(predictions, np.float32)
    if task.kind == "regression":
      return predictions.reshape(predictions.shape[0])
    return predictions.argmax(-1)

  @staticmethod
  def write_predictions(task, path, predictions, examples, meta, **opts):
    del opts
    preds = _Pairs.decode(task, predictions)
    with open(path, "w", encoding="utf-8") as f:
      f.write("index\tprediction\n")
      for i, p in zip(meta["example_index"], preds):
        text = f"{p:.3f}" if task.kind == "regression" else task.label_names[p]
        f.write(f"{examples[i].guid}\t{text}\n")


def _label_array(task, examples) -> np.ndarray:
  """Label ids (int32, -1 when unlabelled) or regression targets (float32, NaN when unlabelled)."""
  if task.kind == "regression":
    return np.array([np.nan if e.label is None else e.label for e in examples], np.float32)
  index = {name: i for i, name in enumerate(task.label_names)}
  unknown = {e.label for e in examples if e.label is not None and e.label not in index}
  if unknown:
    raise readers.DataError(f"{task.name}: labels {sorted(unknown)[:5]} not in {task.label_names}")
  return np.array([-1 if e.label is None else index[e.label] for e in examples], np.int32)


def _labels_of(task, examples, path: str) -> list:
  """Every label of `examples` (tagging: every tag); DataError naming the first example without one."""
  if not examples:
    raise readers.DataError(f"{path} holds no examples.")
  if task.kind == "span":
    return []
  if task.kind == "tagging":
    missing = next((i for i, e in enumerate(examples) if e.tags is None), None)
    labels = [t for e in examples if e.tags is not None for t in e.tags]
  else:
    missing = next((i for i, e in enumerate(examples) if e.label is None
                    or (task.kind == "regression" and np.isnan(e.label))), None)
    labels = [e.label for e in examples if e.label is not None]
  if missing is not None:
    raise readers.DataError(f"{path}: example {missing + 1} has no label; training and dev files need one "
                            "on every example.")
  if task.kind == "classification" and "" in labels:
    raise readers.DataError(f"{path}: example {labels.index('') + 1} has an empty label; give every example "
                            "its label.")
  return labels


def _sorted_labels(labels) -> tuple[str, ...]:
  """Distinct labels in order: by value when all are numbers ("2" before "10"), else as text."""
  names = set(labels)
  try:
    return tuple(sorted(names, key=float))
  except ValueError:
    return tuple(sorted(names))


_METRICS = {"accuracy": metrics.accuracy, "f1": metrics.f1_binary, "mcc": metrics.matthews_corrcoef,
            "pearson": metrics.pearson, "spearman": metrics.spearman}
_IMPL = {"classification": _Pairs, "regression": _Pairs, "span": squad, "tagging": ner}


# ---------------------------------------------------------------------------------------------
# Readers behind `Task.read`.


def _read_columns(split, source, data_dir, *, text_a, text_b, label, regression=False, guid=None,
                  skip_labels=(), tfds_name=None, tfds_text=None, label_names=(),
                  special=None, extensions=(".tsv",), stems=("{split}",), short_rows="error"):
  """Local file/dir (by named columns, or a `special` reader), or TFDS `glue/*`.

  Training and dev splits need their label column, and each row its fields (`short_rows`: "error", or "skip"
  for GLUE's QQP, whose release has such rows); other splits (test, new text) may lack it, and a row that
  stops before it is kept in its place.
  """
  if readers.is_tfds(source):
    name = readers.tfds_name(source, tfds_name)
    a, b = tfds_text or (text_a, text_b)
    return readers.read_tfds_glue(name, split, data_dir, a, b, label_names, regression)
  path = readers.resolve_file(source, split, extensions, stems)
  # A task's own format (CoLA's and Quora's files without a header) unless the file names its text column:
  # then it is read by its columns, as any task's TSV, CSV or JSON lines file.
  if special is not None and not path.endswith(".jsonl") and text_a not in readers.header(path):
    return special(path)
  labelled = split.startswith(("train", "dev"))
  rows = readers.read_rows(path, short_rows=short_rows if labelled else "keep")   # predict's rows keep their numbers
  texts = {"text_a": text_a, **({"text_b": text_b} if text_b else {})}
  readers.check_columns(path, rows, texts, label, labelled=labelled)
  return readers.examples_from_rows(rows, text_a, text_b, label, guid, regression, skip_labels, path)


def _glue(name, text_a, text_b, label, label_names=("0", "1"), metric_names=("accuracy",),
          splits=("train", "dev"), tfds_name=None, tfds_text=None, special=None, extensions=(".tsv", ".jsonl"),
          stems=("{split}",), **columns) -> Task:
  regression = not label_names
  reader = functools.partial(
      _read_columns, text_a=text_a, text_b=text_b, label=label, regression=regression,
      tfds_name=tfds_name or f"glue/{name}", tfds_text=tfds_text, label_names=label_names, special=special,
      extensions=extensions, stems=stems, **columns)
  return Task(name=name, kind="regression" if regression else "classification",
              label_names=tuple(label_names), primary_metric=metric_names[0], splits=splits,
              reader=reader, metric_names=metric_names,
              locate=lambda split, source: readers.resolve_file(source, split, extensions, stems))


_NLI = ("contradiction", "entailment", "neutral")  # google-research/bert run_classifier.py order
_ENTAIL = ("entailment", "not_entailment")

_TASKS = {
    "cola": lambda: _glue("cola", "sentence", None, "label", metric_names=("mcc", "accuracy"),
                          special=readers.read_cola, guid="index"),
    "sst2": lambda: _glue("sst2", "sentence", None, "label", guid="index"),
    "mrpc": lambda: _glue("mrpc", "#1 String", "#2 String", "Quality", metric_names=("f1", "accuracy"),
                          tfds_text=("sentence1", "sentence2"), guid="index"),
    "stsb": lambda: _glue("stsb", "sentence1", "sentence2", "score", label_names=(),
                          metric_names=("pearson", "spearman"), guid="index"),
    "qqp": lambda: _glue("qqp", "question1", "question2", "is_duplicate", metric_names=("f1", "accuracy"),
                         special=readers.read_quora, guid="id", short_rows="skip"),
    "mnli": lambda: _glue("mnli", "sentence1", "sentence2", "gold_label", label_names=_NLI,
                          splits=("train", "dev_matched", "dev_mismatched"), guid="index",
                          tfds_text=("premise", "hypothesis"), skip_labels=("-",)),
    "qnli": lambda: _glue("qnli", "question", "sentence", "label", label_names=_ENTAIL, guid="index"),
    "rte": lambda: _glue("rte", "sentence1", "sentence2", "label", label_names=_ENTAIL, guid="index"),
    "wnli": lambda: _glue("wnli", "sentence1", "sentence2", "label", guid="index"),
    # SNLI (Bowman et al. 2015), JSON lines or TSV of the original release; "-" = no consensus.
    "snli": lambda: _glue("snli", "sentence1", "sentence2", "gold_label", label_names=_NLI,
                          splits=("train", "dev"), guid="pairID", skip_labels=("-",),
                          tfds_name="snli", tfds_text=("premise", "hypothesis"),
                          # The release's own names (snli_1.0_dev.txt: a TSV with a header) after GLUE's.
                          extensions=(".tsv", ".jsonl", ".txt"), stems=("{split}", "snli_1.0_{split}")),
}


def _generic(fmt, *, text_a="sentence", text_b=None, label="label", labels=None, num_labels=None,
             guid=None, splits=("train", "dev"), skip_labels=(), primary_metric=None, **options):
  """Classification or regression (`num_labels=1`) from TSV/CSV (with a header) or JSON lines files
  with the named columns.

  Classification labels are `labels` (a sequence, or one comma-separated string) in that order, else
  the training file's distinct labels, sorted (`Task.with_labels_from`; their count must equal
  `num_labels` when that is given).
  """
  labels = parse_labels(labels)
  regression = num_labels == 1
  if regression and labels:
    raise readers.DataError(f"task_opts: labels {list(labels)} and num_labels=1 (regression); give one or the other")
  if labels and num_labels and len(labels) != num_labels:
    raise readers.DataError(f"task_opts: {len(labels)} labels {list(labels)} but num_labels={num_labels}")
  exts = {"tsv": (".tsv",), "csv": (".csv",), "jsonl": (".jsonl",)}.get(fmt, (".tsv", ".csv", ".jsonl"))
  reader = functools.partial(_read_columns, text_a=text_a, text_b=text_b or None, label=label,
                             regression=regression, guid=guid, skip_labels=tuple(skip_labels),
                             label_names=labels, extensions=exts)
  metric_names = ("pearson", "spearman") if regression else (
      ("accuracy", "f1", "mcc") if len(labels) == 2 else ("accuracy",))
  return Task(name=fmt, kind="regression" if regression else "classification", label_names=labels,
              primary_metric=primary_metric or metric_names[0], splits=tuple(splits), reader=reader,
              metric_names=metric_names,
              options={"text_a": text_a, "text_b": text_b or None, "label": label, "num_labels": num_labels,
                       "primary_metric": primary_metric, **options},
              locate=lambda split, source: readers.resolve_file(source, split, exts))


def parse_labels(labels) -> tuple[str, ...]:
  """A label set as the config gives it ("a,b,c", a sequence, "" or None) -> a tuple of names."""
  if not labels:
    return ()
  if isinstance(labels, str):
    labels = labels.split(",")
  names = tuple(str(x).strip() for x in labels)
  if len(set(names)) != len(names) or "" in names:
    raise readers.DataError(f"task_opts.labels {list(names)}: every label once, none empty")
  return names


def _tagging(*, tag_column=-1, labels=None, splits=("train", "dev"), primary_metric=None, **options) -> Task:
  """Token tagging with any tag set from CoNLL-style files (`ner.read_columns`): the training file's
  tags unless `labels` are given; span F1 when they are BIO, token accuracy always."""
  labels = parse_labels(labels)
  span_f1 = ner.is_bio(labels)
  return Task(name="tagging", kind="tagging", label_names=labels,
              primary_metric=primary_metric or ("f1" if span_f1 else "token_accuracy"), splits=tuple(splits),
              reader=functools.partial(ner.read_columns, tag_column=int(tag_column)),
              options={"tag_column": int(tag_column), "span_f1": span_f1, "primary_metric": primary_metric,
                       **options},
              locate=ner.locate)


def _squad(version: str, options: dict) -> Task:
  # v2.0 selects on F1 like v1.1: the no-answer threshold moves EM and F1 together.
  return Task(name="squad_v1" if version == "v1.1" else "squad_v2", kind="span",
              label_names=("start", "end"), primary_metric="f1", splits=("train", "dev"),
              reader=functools.partial(squad.read, version=version),
              options={"version": version, **options},
              locate=lambda split, source: readers.resolve_file(source, split, (".json", f"-{version}.json")))


def get_task(name: str, **options) -> Task:
  """The task called `name`; `options` set task defaults (e.g. `doc_stride`, `tfds_data_dir`).

  Names: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli, snli, squad_v1, squad_v2, conll2003,
  tsv / csv / jsonl / generic (named columns: see `_generic`) and tagging (any tag set: `_tagging`).
  """
  name = name.lower().replace("-", "").replace(".", "").replace("_", "")
  if name in ("tsv", "csv", "jsonl", "generic"):
    return _generic(name, **options)
  if name == "tagging":
    return _tagging(**options)
  if name in _TASKS:
    task = _TASKS[name]()
    # The text and label columns a file names otherwise (`task_opts.text_a`, `predict --text_a`).
    columns = {k: options[k] for k in ("text_a", "text_b", "label") if options.get(k)}
    if columns:
      task = dataclasses.replace(task, reader=functools.partial(task.reader, **columns))
    return dataclasses.replace(task, options=options)
  if name in ("squadv1", "squadv11", "squad"):
    return _squad("v1.1", options)
  if name in ("squadv2", "squadv20"):
    return _squad("v2.0", options)
  if name in ("conll2003", "conll"):
    scheme = options.get("tag_scheme", "bio")
    return Task(name="conll2003", kind="tagging", label_names=ner.label_names(scheme),
                primary_metric="f1", splits=("train", "dev", "test"),
                reader=functools.partial(ner.read, scheme=scheme), options=options, locate=ner.locate)
  raise ValueError(f"unknown task {name!r}; known: {sorted(_TASKS)} + squad_v1, squad_v2, "
                   "conll2003, tsv, csv, jsonl, tagging")


def from_record(record: dict) -> Task:
  """The task a finetuned workdir's task.json describes (`task_record.TASK_FILE`), its label set included."""
  task = get_task(record["task"], **record.get("task_opts", {}))
  if task.kind in ("classification", "tagging") and not task.label_names:
    task = task.with_label_names(record["label_names"])
  return task
