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
    raise ValueError(f"{task.name}: labels {sorted(unknown)[:5]} not in {task.label_names}")
  return np.array([-1 if e.label is None else index[e.label] for e in examples], np.int32)


_METRICS = {"accuracy": metrics.accuracy, "f1": metrics.f1_binary, "mcc": metrics.matthews_corrcoef,
            "pearson": metrics.pearson, "spearman": metrics.spearman}
_IMPL = {"classification": _Pairs, "regression": _Pairs, "span": squad, "tagging": ner}


# ---------------------------------------------------------------------------------------------
# Readers behind `Task.read`.


def _read_columns(split, source, data_dir, *, text_a, text_b, label, regression=False, guid=None,
                  skip_labels=(), tfds_name=None, tfds_text=None, label_names=(),
                  special=None, extensions=(".tsv",)):
  """Local file/dir (by named columns, or a `special` reader), or TFDS `glue/*`."""
  if readers.is_tfds(source):
    name = readers.tfds_name(source, tfds_name)
    a, b = tfds_text or (text_a, text_b)
    return readers.read_tfds_glue(name, split, data_dir, a, b, label_names, regression)
  path = readers.resolve_file(source, split, extensions)
  if special is not None and not path.endswith(".jsonl"):
    return special(path)
  rows = readers.read_rows(path)
  return readers.examples_from_rows(rows, text_a, text_b, label, guid, regression, skip_labels)


def _glue(name, text_a, text_b, label, label_names=("0", "1"), metric_names=("accuracy",),
          splits=("train", "dev"), tfds_name=None, tfds_text=None, special=None, **columns) -> Task:
  regression = not label_names
  reader = functools.partial(
      _read_columns, text_a=text_a, text_b=text_b, label=label, regression=regression,
      tfds_name=tfds_name or f"glue/{name}", tfds_text=tfds_text, label_names=label_names, special=special,
      extensions=(".tsv", ".jsonl"), **columns)
  return Task(name=name, kind="regression" if regression else "classification",
              label_names=tuple(label_names), primary_metric=metric_names[0], splits=splits,
              reader=reader, metric_names=metric_names)


_NLI = ("contradiction", "entailment", "neutral")  # google-research/bert run_classifier.py order
_ENTAIL = ("entailment", "not_entailment")

_TASKS = {
    "cola": lambda: _glue("cola", "sentence", None, None, metric_names=("mcc", "accuracy"),
                          special=readers.read_cola),
    "sst2": lambda: _glue("sst2", "sentence", None, "label", guid="index"),
    "mrpc": lambda: _glue("mrpc", "#1 String", "#2 String", "Quality", metric_names=("f1", "accuracy"),
                          tfds_text=("sentence1", "sentence2"), guid="index"),
    "stsb": lambda: _glue("stsb", "sentence1", "sentence2", "score", label_names=(),
                          metric_names=("pearson", "spearman"), guid="index"),
    "qqp": lambda: _glue("qqp", "question1", "question2", "is_duplicate", metric_names=("f1", "accuracy"),
                         special=readers.read_quora),
    "mnli": lambda: _glue("mnli", "sentence1", "sentence2", "gold_label", label_names=_NLI,
                          splits=("train", "dev_matched", "dev_mismatched"), guid="index",
                          tfds_text=("premise", "hypothesis"), skip_labels=("-",)),
    "qnli": lambda: _glue("qnli", "question", "sentence", "label", label_names=_ENTAIL, guid="index"),
    "rte": lambda: _glue("rte", "sentence1", "sentence2", "label", label_names=_ENTAIL, guid="index"),
    "wnli": lambda: _glue("wnli", "sentence1", "sentence2", "label", guid="index"),
    # SNLI (Bowman et al. 2015), JSON lines or TSV of the original release; "-" = no consensus.
    "snli": lambda: _glue("snli", "sentence1", "sentence2", "gold_label", label_names=_NLI,
                          splits=("train", "dev"), guid="pairID", skip_labels=("-",),
                          tfds_name="snli", tfds_text=("premise", "hypothesis")),
}


def _generic(fmt, *, text_a="sentence", text_b=None, label="label", labels=None, num_labels=None,
             guid=None, splits=("train", "dev"), skip_labels=(), primary_metric=None, **options):
  """Classification (`labels`, or `num_labels` >= 2 -> "0".."n-1") or regression (`num_labels=1`)
  from TSV/CSV (with a header) or JSON lines files with the named columns."""
  if labels is None and num_labels is None:
    raise ValueError("generic task: give `labels` (classification) or `num_labels` (1 = regression)")
  if labels is None:
    labels = () if num_labels == 1 else tuple(str(i) for i in range(num_labels))
  regression = not labels
  exts = {"tsv": (".tsv",), "csv": (".csv",), "jsonl": (".jsonl",)}.get(fmt, (".tsv", ".csv", ".jsonl"))
  reader = functools.partial(_read_columns, text_a=text_a, text_b=text_b or None, label=label,
                             regression=regression, guid=guid, skip_labels=tuple(skip_labels),
                             label_names=tuple(labels), extensions=exts)
  metric_names = ("pearson", "spearman") if regression else (
      ("accuracy", "f1", "mcc") if len(labels) == 2 else ("accuracy",))
  return Task(name=fmt, kind="regression" if regression else "classification",
              label_names=tuple(str(x) for x in labels),
              primary_metric=primary_metric or metric_names[0], splits=tuple(splits), reader=reader,
              metric_names=metric_names, options=options)


def _squad(version: str, options: dict) -> Task:
  # v2.0 selects on F1 like v1.1: the no-answer threshold moves EM and F1 together.
  return Task(name="squad_v1" if version == "v1.1" else "squad_v2", kind="span",
              label_names=("start", "end"), primary_metric="f1", splits=("train", "dev"),
              reader=functools.partial(squad.read, version=version),
              options={"version": version, **options})


def get_task(name: str, **options) -> Task:
  """The task called `name`; `options` set task defaults (e.g. `doc_stride`, `tfds_data_dir`).

  Names: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli, snli, squad_v1, squad_v2, conll2003, and
  tsv / csv / jsonl / generic (named columns: see `_generic`).
  """
  name = name.lower().replace("-", "").replace(".", "").replace("_", "")
  if name in ("tsv", "csv", "jsonl", "generic"):
    return _generic(name, **options)
  if name in _TASKS:
    return dataclasses.replace(_TASKS[name](), options=options)
  if name in ("squadv1", "squadv11", "squad"):
    return _squad("v1.1", options)
  if name in ("squadv2", "squadv20"):
    return _squad("v2.0", options)
  if name in ("conll2003", "conll"):
    scheme = options.get("tag_scheme", "bio")
    return Task(name="conll2003", kind="tagging", label_names=ner.label_names(scheme),
                primary_metric="f1", splits=("train", "dev", "test"),
                reader=functools.partial(ner.read, scheme=scheme), options=options)
  raise ValueError(f"unknown task {name!r}; known: {sorted(_TASKS)} + squad_v1, squad_v2, "
                   "conll2003, tsv, csv, jsonl")
