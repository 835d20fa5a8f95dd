"""The Python API (bert_jax/api.py): any checkpoint's encode and fill_mask, finetuning on in-memory data."""

import json

import numpy as np
import pytest

import bert_jax
from bert_jax import api
from bert_jax.finetune import readers
from test_readme_api import write_tiny_checkpoint

SENTENCES = ["the king is dead .", "long live the king and the queen ."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  path = tmp_path_factory.mktemp("api") / "tiny"
  write_tiny_checkpoint(path, " ".join(SENTENCES) + " paris rome bob lives in visits")
  return path


@pytest.mark.slow
def test_load_encode_and_fill_mask(tiny):
  model = bert_jax.load(tiny)
  assert isinstance(model, bert_jax.Model) and model.predictor is None
  both = model.encode(SENTENCES, batch_size=2)
  alone = model.encode(SENTENCES[0])
  n = int(alone["input_mask"].sum())
  assert both["sequence_output"].shape == (2, both["input_mask"].shape[1], 128)
  assert both["pooled_output"].shape == (2, 128)
  # Padding to the longer text changes nothing at the real positions.
  np.testing.assert_allclose(both["sequence_output"][0, :n], alone["sequence_output"][0, :n], atol=1e-5)
  np.testing.assert_allclose(both["pooled_output"][0], alone["pooled_output"][0], atol=1e-5)
  top = model.fill_mask("the [MASK] is dead .", top_k=3)
  assert len(top) == 1 and len(top[0]) == 3 and top[0][0][1] >= top[0][1][1]
  assert len(model.fill_mask(["the [MASK] .", "[MASK] [MASK] ."])[1]) == 2
  with pytest.raises(ValueError, match="finetuned"):
    model.predict(["the king"])
  with pytest.raises(ValueError, match="no texts given"):
    model.encode([])


class _Frame:
  """What `fit` uses of a pandas DataFrame."""

  def __init__(self, columns):
    self.columns = columns

  def to_dict(self, orient):
    assert orient == "records"
    return [dict(zip(self.columns, values)) for values in zip(*self.columns.values())]


def test_in_memory_data_becomes_rows_of_a_task():
  rows = api._rows(_Frame({"text": ["a", "b"], "label": [0.5, 1.25]}))
  assert rows == [{"text": "a", "label": 0.5}, {"text": "b", "label": 1.25}]
  assert api._guess_task(rows) == "regression"
  assert api._guess_task(api._rows((["a", "b"], [0, 1]))) == "classification"
  assert api._guess_task(api._rows((["a"], ["b"], ["yes"]))) == "classification"
  assert api._guess_task(api._rows([{"tokens": ["Bob", "lives"], "tags": ["B-PER", "O"]}])) == "tagging"
  with pytest.raises(readers.DataError, match="different lengths"):
    api._rows((["a", "b"], ["x"]))
  with pytest.raises(readers.DataError, match="example 1: its label is None; every example needs one"):
    api._rows((["a", "b"], ["x", None]))
  with pytest.raises(readers.DataError, match="example 0: its label is nan"):
    api._rows(_Frame({"text": ["a"], "label": [float("nan")]}))
  with pytest.raises(readers.DataError, match="example 0: its text is None"):
    api._rows(([None], ["x"]))
  with pytest.raises(ValueError, match="unknown config field 'num_epoch'"):
    api.fit("unused", (["a", "b"], ["x", "y"]), workdir="unused", num_epoch=3)


@pytest.mark.slow
def test_fit_tagging_from_python_lists_then_predict(tiny, tmp_path):
  words = [["bob", "lives", "in", "paris", "."], ["the", "queen", "visits", "rome", "."]]
  tags = [["B-PER", "O", "O", "B-LOC", "O"], ["O", "B-PER", "O", "B-LOC", "O"]]
  metrics, tagger = bert_jax.fit(tiny, train=(words * 4, tags * 4), dev=(words, tags), workdir=str(tmp_path / "run"),
                                 num_epochs=3, batch_size=8, learning_rate=1e-2, max_seq_length=16)
  assert {"f1", "token_accuracy"} <= set(metrics)
  (first, second) = tagger.predict(["bob visits rome", ["the", "king", "lives"]])
  assert first["words"] == ["bob", "visits", "rome"] and len(second["tags"]) == 3
  assert set(first["tags"] + second["tags"]) <= {"B-LOC", "B-PER", "O"}
  assert (tmp_path / "run" / "data" / "train.txt").read_text().startswith("bob B-PER\nlives O\n")


def test_long_texts_are_cut_to_the_longest_input_and_no_pooler_is_made_up():
  """RoBERTa's table holds 2 positions more than its longest input (they start after the pad id): a long
  text is cut to that input, not to the table. Its MaskedLM directory saved no pooler: no pooled output."""
  from conftest import shared_path  # pylint: disable=g-import-not-at-top
  model = bert_jax.load(shared_path("families", "roberta"))
  assert not model.saved_pooler and model.config.max_input_length == model.config.max_position_embeddings - 2
  out = model.encode(["word " * 400, "a short one"], batch_size=2)
  assert out["input_ids"].shape == (2, model.config.max_input_length) and out["pooled_output"] is None
  assert np.isfinite(out["sequence_output"]).all()
  with pytest.raises(ValueError, match=f"more than the model's {model.config.max_input_length} positions"):
    model.fill_mask("<mask> " + "word " * 400)
  assert bert_jax.load(shared_path("minilm")).saved_pooler


def test_fit_into_a_workdir_follows_the_command_s_one_run_rule(tiny, tmp_path, monkeypatch):
  """As `bert-jax finetune`: the same data and config again is the finished run's results, not a second run in its
  metrics.jsonl; other data or another config is refused; a run that did not finish starts over."""
  from bert_jax import failures  # pylint: disable=g-import-not-at-top
  trained = []

  def finetune(config, workdir):
    trained.append(config.num_epochs)
    results = {"best_metrics": {"accuracy": 0.5 + len(trained)}}
    (tmp_path / "run" / "results.json").write_text(json.dumps(results))
    return results

  monkeypatch.setattr(api.trainer, "finetune", finetune)
  monkeypatch.setattr(api, "load", lambda path: path)
  train = (["the king is dead", "long live the queen"] * 4, ["neg", "pos"] * 4)
  fit = lambda data, **overrides: bert_jax.fit(tiny, train=data, workdir=str(tmp_path / "run"), **overrides)
  assert fit(train, num_epochs=2).metrics == {"accuracy": 1.5} and trained == [2]
  assert fit(train, num_epochs=2).metrics == {"accuracy": 1.5} and trained == [2]   # finished: not trained again
  with pytest.raises(failures.UserError, match="holds a finished finetuning run of other data"):
    fit((["the king lives"] * 8, ["pos", "neg"] * 4), num_epochs=2)
  with pytest.raises(failures.UserError, match=r"another config \(num_epochs differ\)"):
    fit(train, num_epochs=3)
  (tmp_path / "run" / "results.json").unlink()   # a run that did not finish
  assert fit(train, num_epochs=3).metrics == {"accuracy": 2.5} and trained == [2, 3]
