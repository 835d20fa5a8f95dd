"""Generic tagging (`configs/finetune/generic.py:tagging`): any tag set from CoNLL-style files."""

import json

import numpy as np
import pytest

from bert_jax.finetune import metrics, ner, readers, tasks, trainer
from configs.finetune import generic
from conftest import shared_path
from test_finetune_train import tiny_config

# A made-up tag set on the CoNLL-2003 sample's sentences (its IOB1 entities are single words).
MADE_UP = {"I-ORG": "B-AGENCY", "I-PER": "B-HUMAN", "I-LOC": "B-SITE", "O": "O"}


def make_tagging_data(directory, copies: int = 8) -> str:
  """train.conll and dev.conll in the CoNLL-2003 sample's format (word POS chunk TAG), made-up tags."""
  lines = shared_path("tasks", "format_samples", "conll2003.txt").read_text(encoding="utf-8").splitlines()
  out = []
  for line in lines:
    cols = line.split()
    out.append(" ".join(cols[:-1] + [MADE_UP[cols[-1]]]) if cols and not line.startswith("-DOCSTART-") else line)
  text = "\n".join(out * copies) + "\n"
  directory.mkdir(parents=True, exist_ok=True)
  for split in ("train", "dev"):
    (directory / f"{split}.conll").write_text(text, encoding="utf-8")
  return str(directory)


def test_tag_set_and_metrics_follow_the_training_file(tmp_path):
  data = make_tagging_data(tmp_path, copies=1)
  task = tasks.get_task("tagging")
  assert task.label_names == () and task.kind == "tagging"
  examples = task.read("train", data)
  assert examples[0].words[:3] == ("U.N.", "official", "Ekeus")
  assert examples[0].tags[:3] == ("B-AGENCY", "O", "B-HUMAN")  # as written: no IOB1 conversion
  bio = task.with_labels_from(examples, task.file("train", data))
  assert bio.label_names == ("B-AGENCY", "B-HUMAN", "B-SITE", "O") and bio.primary_metric == "f1"
  # Part of speech (column 1): not BIO, so token accuracy only.
  pos_task = tasks.get_task("tagging", tag_column=1)
  pos_examples = pos_task.read("train", data)
  pos = pos_task.with_labels_from(pos_examples, "train.conll")
  assert "NNP" in pos.label_names and pos.primary_metric == "token_accuracy"
  meta = {"example_index": np.arange(len(pos_examples)),
          "word_positions": [np.arange(1, len(e.words) + 1) for e in pos_examples]}
  logits = np.zeros((len(pos_examples), 16, pos.num_labels), np.float32)
  for row, ex in enumerate(pos_examples):
    logits[row, np.arange(1, len(ex.words) + 1), [pos.label_names.index(t) for t in ex.tags]] = 1.0
  assert pos.evaluate(logits, pos_examples, meta) == {"token_accuracy": 1.0}


def test_unusable_tagging_files_name_the_line_or_the_tag(tmp_path):
  (tmp_path / "train.txt").write_text("Paris B-LOC\nis O\n\nRome\n", encoding="utf-8")
  with pytest.raises(readers.DataError, match=r"train.txt, line 4: 1 column.*tag_column"):
    tasks.get_task("tagging").read("train", str(tmp_path))
  (tmp_path / "train.txt").write_text("Paris B-LOC\nis O\n", encoding="utf-8")
  (tmp_path / "dev.txt").write_text("Bob B-PER\n", encoding="utf-8")
  task = tasks.get_task("tagging")
  task = task.with_labels_from(task.read("train", str(tmp_path)), "train.txt")
  with pytest.raises(readers.DataError, match=r"dev.txt: label 'B-PER' is not in the label set"):
    task.check_labelled(task.read("dev", str(tmp_path)), task.file("dev", str(tmp_path)))


def test_span_scores_are_seqeval_s():
  seqeval = pytest.importorskip("seqeval.metrics")
  gold = [["B-GENE", "I-GENE", "O", "B-DRUG"], ["O", "B-DRUG", "I-DRUG", "O"]]
  pred = [["B-GENE", "I-GENE", "O", "O"], ["O", "B-DRUG", "O", "B-GENE"]]
  ours = metrics.entity_scores(gold, pred)
  assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
  assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
  assert ner.is_bio(["O", "B-GENE", "I-GENE"]) and not ner.is_bio(["NN", "VB"]) and not ner.is_bio(["O"])


@pytest.mark.slow
def test_generic_tagging_trains_and_evaluates_with_the_files_tag_set(tmp_path):
  data = make_tagging_data(tmp_path / "data")
  c = tiny_config(data, generic.get_config("tagging"), vocab_file=str(shared_path("minilm", "vocab.txt")))
  c.model.vocab_size, c.model.max_position_embeddings, c.max_seq_length = 30522, 32, 32
  c.batch_size, c.num_epochs = 8, 2
  results = trainer.finetune(c, str(tmp_path / "run"))
  assert results["finished"] and results["primary_metric"] == "f1"
  assert {"f1", "precision", "recall", "token_accuracy", "f1_HUMAN"} <= set(results["best_metrics"])
  record = json.loads((tmp_path / "run" / "task.json").read_text())
  assert record["label_names"] == ["B-AGENCY", "B-HUMAN", "B-SITE", "O"] and record["kind"] == "tagging"
  assert (tmp_path / "run" / "predictions_dev.txt").read_text().startswith("U.N. B-AGENCY ")
