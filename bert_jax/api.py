"""The Python API, for notebooks: any checkpoint as a `Model`, and finetuning on in-memory data.

    import bert_jax
    model = bert_jax.load("workdir/tiny")              # HF, TF, pretraining run or finetuned workdir
    model.encode(["a text", "another"])["pooled_output"]   # [2, hidden]
    model.fill_mask("the king wears the [MASK] .")      # [[(token, probability), ...]] per [MASK]
    metrics, classifier = bert_jax.fit("workdir/tiny", train=(texts, labels), workdir="runs/mine")
    classifier.predict(["new text"])                    # [{"label", "probabilities"}]

`fit` writes the data into `<workdir>/data/` and runs the trainer the CLI runs (`trainer.finetune` with
`configs/finetune/generic.py`), so its workdir is one `bert-jax predict` and `bert-jax export` read.
"""

import dataclasses
import json
import math
import numbers
import os
from typing import Any, NamedTuple

import jax
import numpy as np

from bert_jax import checkpoint_loader
from bert_jax import config_path
from bert_jax import failures
from bert_jax import paths
from bert_jax.tools import fill_mask as fill_mask_lib
from bert_jax.models import encoder as model_lib
from bert_jax.tools import predict as predict_lib
from bert_jax.finetune import ner
from bert_jax.finetune import readers
from bert_jax.finetune import run_results
from bert_jax.finetune import run_workdir
from bert_jax.finetune import squad
from bert_jax.finetune import task_record
from bert_jax.finetune import trainer


@dataclasses.dataclass
class Model:
  """A checkpoint's config, params and tokenizer; `predictor` when it is a finetuned workdir."""

  config: model_lib.BertConfig
  params: dict
  tokenizer: Any
  predictor: predict_lib.Predictor | None = None
  # Whether the checkpoint saved its pooler: a Hugging Face directory of a MaskedLM class (or ELECTRA,
  # DistilBERT) has none, and `load` gives it a newly initialised one, whose output means nothing.
  saved_pooler: bool = True

  def encode(self, texts, texts_b=None, batch_size: int = 32) -> dict:
    """The encoder's outputs for `texts` (and second segments `texts_b`), padded to the longest and cut
    to the longest input the position table holds.

    Returns:
      {"input_ids", "input_mask": int32 [N, L], "sequence_output": [N, L, H], "pooled_output": [N, H], or
      None where the checkpoint has no pooler of its own}.
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    texts_b = [None] * len(texts) if texts_b is None else list(texts_b)
    if not texts:
      raise ValueError("encode: no texts given")
    if len(texts_b) != len(texts):
      raise ValueError(f"encode: {len(texts)} texts but {len(texts_b)} texts_b")
    encoded = [self.tokenizer.encode_pair(a, b, max_length=self.config.max_input_length)
               for a, b in zip(texts, texts_b)]
    length = max(len(ids) for ids, _ in encoded)
    features = {k: np.zeros((len(texts), length), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
    for i, (ids, segments) in enumerate(encoded):
      features["input_ids"][i, :len(ids)], features["segment_ids"][i, :len(ids)] = ids, segments
      features["input_mask"][i, :len(ids)] = 1
    encoder = model_lib.BertEncoder(self.config)
    pool = self.saved_pooler and "pooler" in self.params["bert"]
    run = jax.jit(lambda p, b: {k: v for k, v in encoder.apply(
        {"params": p}, b["input_ids"], b["input_mask"], b["segment_ids"], pool=pool).items() if v is not None})
    out = predict_lib.run_batches(run, self.params["bert"], features, batch_size)
    return {"input_ids": features["input_ids"], "input_mask": features["input_mask"],
            "sequence_output": out["sequence_output"], "pooled_output": out.get("pooled_output")}

  def fill_mask(self, text, top_k: int = 5):
    """The `top_k` (token, probability) pairs at each [MASK] of `text` (a list of texts: one list each)."""
    many = not isinstance(text, str)
    result = fill_mask_lib.predict(self.config, self.params, self.tokenizer, list(text) if many else [text], top_k)
    return result if many else result[0]

  def predict(self, texts, texts_b=None, batch_size: int = 64) -> list[dict]:
    """A finetuned model's predictions (`bert-jax predict`'s records): texts to classify or score,
    sentences to tag (lists of words, or strings split on whitespace), or (question, context) pairs."""
    if self.predictor is None:
      raise ValueError("predict needs a finetuned model (bert_jax.fit, or load() of a finetuning workdir); "
                       "this checkpoint has no task head")
    return self.predictor.predict(_examples(self.predictor.task.kind, texts, texts_b), batch_size)


class Finetuned(NamedTuple):
  metrics: dict  # the best dev evaluation
  model: Model   # its parameters, ready to predict


def load(path, **kwargs) -> Model:
  """Any checkpoint `checkpoint_loader` reads as a Model; `kwargs` go to `checkpoint_loader.load`."""
  loaded = checkpoint_loader.load(path, **kwargs)
  record = task_record.read(path)
  predictor = predict_lib.Predictor.from_loaded(loaded, record) if record else None
  return Model(loaded.config, loaded.params, loaded.tokenizer, predictor,
               checkpoint_loader.saved_pooler(path, loaded.params))


def fit(checkpoint, train, dev=None, *, workdir, task: str | None = None, labels=None, **overrides) -> Finetuned:
  """Finetunes `checkpoint` on in-memory data with the CLI's trainer; returns (dev metrics, Model).

  Args:
    checkpoint: any checkpoint `load` reads (its encoder is finetuned; a new head is added).
    train, dev: (texts, labels) or (texts, texts_b, labels); a list of dicts or a pandas DataFrame with
      columns `text` (and `text_b`) and `label`; for tagging, lists of words and lists of tags (or
      `tokens`/`tags` columns). Without `dev`, the last tenth of `train` is held out.
    workdir: where the data, checkpoints, metrics and task.json go. As `bert-jax finetune`'s: a finished run of
      the same data and config there is not trained again (its results are returned), one that did not finish
      starts over, and a finished run of other data or another config is refused.
    task: "classification", "regression" or "tagging"; default: tagging when the texts are lists of
      words, regression when every label is a non-integer number, else classification.
    labels: the label set in id order; default: the training labels, sorted.
    **overrides: config fields of configs/finetune/common.py (num_epochs=3, learning_rate=2e-5,
      batch_size=32, max_seq_length=128, ...; nested ones as dicts: model={"hidden_dropout": 0.2}).
  Raises:
    failures.Diverged: the training loss or the parameters stopped being finite (its message names the step;
      the workdir keeps the results and the best evaluation before it).
  """
  train_rows = _rows(train)
  if dev is None:
    cut = len(train_rows) - max(1, len(train_rows) // 10)
    train_rows, dev_rows = train_rows[:cut], train_rows[cut:]
  else:
    dev_rows = _rows(dev)
  task = task or _guess_task(train_rows)
  workdir = paths.absolute(workdir)
  data_dir = os.path.join(workdir, "data")
  config = _config(task, train_rows, labels)
  config.init_checkpoint, config.data_dir = str(checkpoint) if checkpoint else "", data_dir
  _override(config, overrides)
  files = {os.path.join(data_dir, f"{split}{_suffix(task)}"): _text(rows, task)
           for split, rows in (("train", train_rows), ("dev", dev_rows))}
  finished = os.path.isfile(os.path.join(workdir, trainer.RESULTS_FILE))
  if finished and any(_read(path) != text for path, text in files.items()):
    raise failures.UserError(f"{workdir} holds a finished finetuning run of other data: give another workdir, or "
                             "remove that directory to run it again")
  results = run_workdir.finished(config, workdir)   # the same data: the same config is the same run
  if results is None:
    os.makedirs(data_dir, exist_ok=True)
    for path, text in files.items():
      with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    results = trainer.finetune(config, workdir)
  run_results.raise_if_diverged(results, workdir)
  return Finetuned(results["best_metrics"], load(workdir))


# ------------------------------------------------------------------------------------------------
# In-memory data -> rows -> the generic task's files.


def _rows(data) -> list[dict]:
  if hasattr(data, "to_dict"):   # a pandas DataFrame
    data = data.to_dict("records")
  if isinstance(data, tuple) and len(data) in (2, 3):
    names = ("text", "label") if len(data) == 2 else ("text", "text_b", "label")
    if len({len(column) for column in data}) != 1:
      raise readers.DataError(f"texts and labels of different lengths: {[len(c) for c in data]}")
    data = [dict(zip(names, values)) for values in zip(*data)]
  rows = [dict(r) for r in data]
  for r in rows:
    if "tokens" in r:
      r["text"], r["label"] = r.pop("tokens"), r.pop("tags", r.get("label"))
  if not rows or any("text" not in r or "label" not in r for r in rows):
    raise readers.DataError("training data: (texts, labels), or rows with `text` and `label` (tagging: `tokens` "
                            "and `tags`), at least one")
  for i, r in enumerate(rows):   # a missing value would train as a class named "None" or "nan"
    for field in ("text", "label"):
      value = r[field]
      if value is None or (isinstance(value, float) and math.isnan(value)):
        raise readers.DataError(f"example {i}: its {field} is {value!r}; every example needs one (drop the rows "
                                "without, e.g. DataFrame.dropna())")
  return rows


def _guess_task(rows) -> str:
  if not isinstance(rows[0]["text"], str):
    return "tagging"
  numbers_only = all(isinstance(r["label"], numbers.Real) and not isinstance(r["label"], bool) for r in rows)
  return "regression" if numbers_only and any(float(r["label"]) % 1 for r in rows) else "classification"


def _config(task: str, rows, labels):
  """configs/finetune/generic.py, from the clone that holds this package."""
  config_path.put_shipped_configs_first()
  from configs.finetune import generic as generic_config  # pylint: disable=g-import-not-at-top
  if task == "tagging":
    config = generic_config.get_config("tagging")
  elif task in ("classification", "regression"):
    config = generic_config.get_config("pair" if any(r.get("text_b") is not None for r in rows) else "single")
    config.task_opts.text_a, config.task_opts.label = "text", "label"
    config.task_opts.text_b = "text_b" if config.task_opts.text_b else ""
    config.task_opts.num_labels = 1 if task == "regression" else 0
  else:
    raise ValueError(f"task {task!r}: classification, regression or tagging")
  if labels is not None:
    config.task_opts.labels = ",".join(str(x) for x in labels)
  return config


def _override(config, overrides: dict) -> None:
  for key, value in overrides.items():
    if key not in config:
      raise ValueError(f"unknown config field {key!r} (configs/finetune/common.py lists them)")
    if isinstance(value, dict):
      _override(config[key], value)
    else:
      setattr(config, key, value)


def _suffix(task: str) -> str:
  return ".txt" if task == "tagging" else ".jsonl"


def _text(rows, task: str) -> str:
  """`rows` as the generic task's file reads them: CoNLL-style lines for tagging, else JSON lines."""
  if task == "tagging":
    return "".join("".join(f"{w} {t}\n" for w, t in zip(r["text"], r["label"], strict=True)) + "\n" for r in rows)
  return "".join(json.dumps({"text": str(r["text"]), "text_b": r.get("text_b"),
                             "label": float(r["label"]) if task == "regression" else str(r["label"])}) + "\n"
                 for r in rows)


def _read(path: str) -> str | None:
  return readers.read_text(path) if os.path.isfile(path) else None


def _examples(kind: str, texts, texts_b=None) -> list:
  """Examples of the task's kind for `Predictor.predict` from plain Python values."""
  texts = [texts] if isinstance(texts, str) else list(texts)
  if kind == "tagging":
    return [ner.NerExample(str(i), tuple(t.split() if isinstance(t, str) else t), None) for i, t in enumerate(texts)]
  if kind == "span":
    return [squad.make_example(str(i), q, c, [], []) for i, (q, c) in enumerate(texts)]
  texts_b = [None] * len(texts) if texts_b is None else list(texts_b)
  return [readers.PairExample(str(i), a, b) for i, (a, b) in enumerate(zip(texts, texts_b))]
