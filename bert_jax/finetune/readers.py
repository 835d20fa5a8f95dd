"""Readers of sentence and sentence-pair tasks: GLUE TSVs, generic TSV/CSV/JSON lines, TFDS `glue/*`.

Each returns a list of `PairExample`. Local sources are a file, or a directory holding
`<split>.<ext>` (GLUE's layout: `train.tsv`, `dev.tsv`, `dev_matched.tsv`, `test.tsv`, ...).
TFDS sources are read only from an explicit, already prepared `data_dir`: nothing is downloaded.
"""

import csv
import dataclasses
import io
import json
import logging
import os
import sys

from bert_jax.data import corpus
from bert_jax import failures

csv.field_size_limit(sys.maxsize)  # some GLUE/QQP fields exceed the 128 KiB default


class DataError(failures.UserError):
  """A data file or a task option that cannot be used; the message names it and says what to do.

  A ValueError, and a `failures.UserError`: the command prints it as one paragraph and exits 2.
  """


@dataclasses.dataclass(frozen=True)
class PairExample:
  """One sentence (text_b None) or sentence pair; label is a label name, a float, or None (test)."""

  guid: str
  text_a: str
  text_b: str | None = None
  label: str | float | None = None


def resolve_file(source: str, split: str, extensions=(".tsv",), stems=("{split}",)) -> str:
  """`source` itself if a file, else `source/<stem><ext>` for the first stem (`{split}` in it replaced) and
  extension that exists."""
  if os.path.isfile(source):
    return source
  for stem in stems:
    for ext in extensions:
      path = os.path.join(source, stem.format(split=split) + ext)
      if os.path.isfile(path):
        return path
  names = " or ".join(stem.format(split=split) + ext for stem in stems for ext in extensions)
  if not source:
    raise DataError(f"no data: set --config.data_dir to the directory holding {names} (or to the file itself)")
  if not os.path.isdir(source):
    raise FileNotFoundError(f"{source} does not exist: set --config.data_dir to the directory holding {names} "
                            "(or to the file itself)")
  held = ", ".join(sorted(os.listdir(source))[:10]) or "nothing"
  raise FileNotFoundError(f"no {split}{'|'.join(extensions)} in {source!r} (it holds {held})")


def read_text(path: str) -> str:
  """The whole file as text: UTF-8, a byte-order mark dropped; other encodings are a DataError naming
  the file, the line and the byte."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise DataError(
        f"{path}, line {line}: byte 0x{data[e.start]:02x} is not UTF-8 (the file was saved in another "
        "encoding, e.g. Latin-1 or Windows-1252). Save it as UTF-8, e.g. `iconv -f latin1 -t utf-8 "
        f"{os.path.basename(path)} > fixed{os.path.splitext(path)[1]}`.") from None


def header(path: str) -> list[str]:
  """The first line's fields of a TSV (a tab between them) or a CSV (a comma, quotes as CSV has them)."""
  first = read_text(path).split("\n", 1)[0].rstrip("\r")
  if path.endswith(".csv"):
    return next(csv.reader([first]), [])
  return first.split("\t")


def read_rows(path: str, delimiter: str | None = None, short_rows: str = "error") -> list[dict]:
  """Rows of a TSV/CSV with a header (as dicts), or of a JSON lines file.

  TSVs are read without quote handling, as google-research/bert `run_classifier.py` does for GLUE
  (sentences there contain unbalanced quotes). A UTF-8 byte-order mark (Windows and spreadsheet
  exports) is dropped, so that it does not become part of the first column's name. An empty file, a
  line that is not JSON, a row with more (non-empty) fields than the header and a file that is not UTF-8
  are DataErrors naming the file. A row with fewer fields than the header is, by `short_rows`: "error" a
  DataError naming its line; "skip" left out, counted in a warning (GLUE's QQP, as Hugging Face's
  QqpProcessor); "keep" kept with the fields it has (new text to predict, whose rows keep their numbers).
  """
  text = read_text(path)
  if not text.strip():
    raise DataError(f"{path} is empty: it needs a header line naming the columns, then one example a "
                    "line (JSON lines: one object a line).")
  if path.endswith((".jsonl", ".json")):
    # Lines end at "\n" only: str.splitlines also splits at U+2028 and U+0085, which JSON strings may hold.
    return [json_row(path, n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
  if delimiter is None:
    delimiter = "," if path.endswith(".csv") else "\t"
  f = io.StringIO(text, newline="")
  if delimiter == "\t":
    reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
  else:
    reader = csv.reader(f, delimiter=delimiter)
  header = next(reader)
  rows, malformed = [], 0
  for row in reader:
    if not any(field.strip() for field in row):   # a blank line: no example
      continue
    if len(row) < len(header) and short_rows != "keep":
      if short_rows == "error":
        raise DataError(f"{path}, line {reader.line_num}: {len(row)} field{'s' * (len(row) != 1)} under a header of "
                        f"{len(header)} ({', '.join(header)}): every example needs each column, its label too")
      malformed += 1
      continue
    if any(field.strip() for field in row[len(header):]):   # trailing empty fields are harmless
      hint = "a text field may not hold a tab" if delimiter == "\t" else "quote a field that holds the delimiter"
      raise DataError(f"{path}, line {reader.line_num}: {len(row)} fields under a header of {len(header)} "
                      f"({hint}); the extra ones would be dropped or shift the label")
    rows.append(dict(zip(header, row)))
  if malformed:
    logging.warning("%s: skipped %d rows with fewer than %d fields", path, malformed, len(header))
  return rows


def json_row(path: str, n: int, line: str) -> dict:
  """Line `n` of the JSON lines file `path` as an object; a DataError naming the file and line otherwise."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError as e:
    raise DataError(f"{path}, line {n}: not JSON ({e.msg}); a JSON lines file holds one object a line.") from None
  if not isinstance(row, dict):
    raise DataError(f"{path}, line {n}: a JSON {type(row).__name__}, not an object with named fields.")
  return row


def json_text(path: str, n: int, line: str, field: str, flag: str) -> str:
  """The text in `field` of line `n` of the JSON lines file `path`; a DataError naming the file, the line and
  `flag` (the option that names the field, e.g. "--text_key") when the line has no such text."""
  row = json_row(path, n, line)
  if field not in row:
    raise DataError(f"{path}, line {n}: no {field!r} field (its fields: {', '.join(sorted(row)) or 'none'}). "
                    f"Name the field that holds the text with {flag}=FIELD.")
  if not isinstance(row[field], str):
    raise DataError(f"{path}, line {n}: {field!r} is a JSON {type(row[field]).__name__}, not a text.")
  return row[field]


def check_columns(path: str, rows, columns: dict, label: str | None, labelled: bool,
                  options: dict | None = None) -> None:
  """Raises a DataError when `rows` (of `path`) is empty or lacks a named column.

  Args:
    columns: {task option: column name} of the text columns every row needs (e.g. {"text_a": "sentence"}).
    label: the label column; needed when `labelled` (training and dev files), optional otherwise.
    options: {task option: the flag that names its column} where a command names columns otherwise (say
      {"context": "--context"}); by default finetuning's `--config.task_opts.<option>` and predict's `--<option>`.
  """
  if not rows:
    raise DataError(f"{path} has a header line but no examples: give it at least one example a line.")
  present = set().union(*(r.keys() for r in rows)) if path.endswith((".jsonl", ".json")) else set(rows[0])
  need = dict(columns, **({"label": label} if label and labelled else {}))
  for option, name in need.items():
    if name not in present:
      what = "label" if option == "label" else "text"
      how = (f"{options[option]}=COLUMN." if options else f"--config.task_opts.{option}=COLUMN"
             + (", or give a file with its labels: training and dev files need them." if what == "label" else
                f" (`bert-jax predict` and `analyze prune`: --{option}=COLUMN)."))
      raise DataError(f"{path} has no {what} column {name!r} (its columns: {', '.join(sorted(present))}). Name "
                      f"the column that holds the {what} with {how}")


def examples_from_rows(rows, text_a: str, text_b: str | None, label: str | None,
                       guid: str | None = None, regression: bool = False,
                       skip_labels=(), path: str = "") -> list[PairExample]:
  """PairExamples from dict rows with the named columns; rows whose label is in `skip_labels` are
  dropped (SNLI/MNLI mark examples without annotator consensus "-"). A missing label column
  (test files) gives label None; a missing text or a label that is not a number (regression) is a
  DataError naming the row of `path`."""
  examples = []
  for i, row in enumerate(rows):
    value = row.get(label) if label else None
    if value is not None and str(value) in skip_labels:
      continue
    if value is not None:
      value = _regression_target(path, i, value) if regression else str(value)
    missing = [c for c in (text_a, text_b) if c and row.get(c) is None]
    if missing:
      raise DataError(f"{path}, example {i + 1}: no {missing[0]!r} field; every example needs its text.")
    examples.append(PairExample(
        guid=str(row.get(guid, i)) if guid else str(i), text_a=str(row[text_a]),
        text_b=str(row[text_b]) if text_b else None, label=value))
  return examples


def _regression_target(path: str, i: int, value) -> float:
  try:
    return float(value)
  except ValueError:
    raise DataError(f"{path}, example {i + 1}: label {value!r} is not a number, and the task is regression "
                    "(num_labels=1). Give num_labels=0 (or the labels) for classification.") from None


# ---------------------------------------------------------------------------------------------
# Formats without a header or with positional columns.


def read_cola(path: str) -> list[PairExample]:
  """CoLA: train/dev have no header (source, label, original label, sentence); test has one."""
  rows = list(csv.reader(io.StringIO(read_text(path), newline=""), delimiter="\t", quoting=csv.QUOTE_NONE))
  if rows and rows[0][:2] == ["index", "sentence"]:
    return [PairExample(guid=r[0], text_a=r[1]) for r in rows[1:]]
  return [PairExample(guid=str(i), text_a=r[3], label=r[1]) for i, r in enumerate(rows)]


def read_quora(path: str) -> list[PairExample]:
  """QQP: GLUE's TSV (header `id qid1 qid2 question1 question2 is_duplicate`, or `id question1
  question2` for test), or the headerless Quora release `is_duplicate question1 question2 id`; a headerless
  file whose every row is two questions is unlabelled pairs (new text to predict)."""
  text = read_text(path)
  first = text.split("\n", 1)[0].rstrip("\r").split("\t")
  if "question1" in first:
    label = "is_duplicate" if "is_duplicate" in first else None
    return examples_from_rows(read_rows(path, short_rows="skip" if label else "keep"), "question1", "question2",
                              label, guid="id", path=path)
  rows = [r for r in csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE) if r]
  if rows and all(len(r) == 2 for r in rows):
    return [PairExample(guid=str(i), text_a=r[0], text_b=r[1]) for i, r in enumerate(rows)]
  short = sum(len(r) < 3 for r in rows)
  if short == len(rows):
    raise DataError(f"{path}: no row has the headerless Quora fields is_duplicate, question1, question2[, id] "
                    "(a tab between them). Give them, two questions a row (unlabelled), or a header line naming "
                    "the columns question1 and question2 (--config.task_opts.text_a/text_b, or predict's "
                    "--text_a/--text_b, name others).")
  if short:   # as the GLUE file's rows with a missing field (tasks.py's qqp), and Hugging Face's QqpProcessor
    logging.warning("%s: skipped %d rows with fewer than 3 fields", path, short)
  return [PairExample(guid=r[3] if len(r) > 3 else str(i), text_a=r[1], text_b=r[2], label=r[0])
          for i, r in enumerate(rows) if len(r) >= 3]


# ---------------------------------------------------------------------------------------------
# TensorFlow Datasets (already prepared; never downloaded here).

TFDS_SPLITS = {"train": "train", "dev": "validation", "dev_matched": "validation_matched",
               "dev_mismatched": "validation_mismatched", "test": "test",
               "test_matched": "test_matched", "test_mismatched": "test_mismatched"}


def is_tfds(source: str) -> bool:
  """Whether a task source names TFDS: "tfds" (the task's dataset) or "tfds:<name>"."""
  return source == "tfds" or source.startswith("tfds:")


def tfds_name(source: str, default: str | None) -> str:
  """The dataset named by "tfds:<name>", else the task's default."""
  name = source[len("tfds:"):] if ":" in source else default
  if not name:
    raise ValueError("this task has no TFDS dataset; give 'tfds:<name>'")
  return name


def tfds_records(name: str, split: str, data_dir: str | None):
  """(records as dicts of python values, builder) of one split of a prepared TFDS dataset."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  # A clear error, never a download, if not prepared.
  builder = corpus.tfds_builder(name, data_dir, data_dir_flag="--config.task_opts.tfds_data_dir")
  ds = builder.as_dataset(split=TFDS_SPLITS.get(split, split), shuffle_files=False)
  return [_to_python(r) for r in tfds.as_numpy(ds)], builder


def _to_python(value):
  if isinstance(value, dict):
    return {k: _to_python(v) for k, v in value.items()}
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if hasattr(value, "tolist"):
    return _to_python(value.tolist())
  if isinstance(value, list):
    return [_to_python(v) for v in value]
  return value


def read_tfds_glue(name: str, split: str, data_dir: str | None, text_a: str, text_b: str | None,
                   label_names, regression: bool = False) -> list[PairExample]:
  """`glue/<config>` (or `snli`) from TFDS. Class ids become our label names: by TFDS class name when
  it is one of ours (MNLI, QNLI, RTE), else by position ("0"/"1" as in the GLUE TSVs). Id -1 is an
  unlabelled test example (label None) or, outside test splits, an example without annotator
  consensus (SNLI), which is dropped as in the original files' "-"."""
  records, builder = tfds_records(name, split, data_dir)
  to_name = None
  if not regression:
    tfds_names = builder.info.features["label"].names
    to_name = [n if n in label_names else str(i) for i, n in enumerate(tfds_names)]
  examples = []
  for i, r in enumerate(records):
    label = r["label"]
    if regression:
      label = None if split.startswith("test") else float(label)
    elif label < 0:
      if not split.startswith("test"):
        continue
      label = None
    else:
      label = to_name[label]
    examples.append(PairExample(guid=str(r.get("idx", i)), text_a=r[text_a],
                                text_b=r[text_b] if text_b else None, label=label))
  return examples
