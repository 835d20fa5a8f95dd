"""CoNLL-2003: reading, first-sub-token labels, decoding back to words, entity-level scores."""

import numpy as np
import pytest

from bert_jax.finetune import ner, tasks
from tests.conftest import shared_path


@pytest.fixture(scope="module")
def tokenizer():
  from bert_jax.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  return load_tokenizer(str(shared_path("minilm", "vocab.txt")))


@pytest.fixture(scope="module")
def sample():
  return str(shared_path("tasks", "format_samples", "conll2003.txt"))


def test_reads_conll_sample(sample):
  task = tasks.get_task("conll2003")
  examples = task.read("dev", sample)
  assert [e.words for e in examples] == [("U.N.", "official", "Ekeus", "heads", "for", "Baghdad", "."),
                                         ("AI2", "engineer", "Joel", "lives", "in", "Seattle", ".")]
  assert examples[0].tags == ("B-ORG", "O", "B-PER", "O", "O", "B-LOC", "O")  # IOB1 -> BIO
  iob1 = tasks.get_task("conll2003", tag_scheme="iob1").read("dev", sample)
  assert iob1[0].tags == ("I-ORG", "O", "I-PER", "O", "O", "I-LOC", "O")  # as in the file


def test_iob1_to_bio():
  assert ner.iob1_to_bio(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"]) == [
      "B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG"]


def test_labels_sit_on_first_sub_tokens(sample, tokenizer):
  task = tasks.get_task("conll2003")
  examples = task.read("dev", sample)
  features, meta = task.featurize(examples, tokenizer, max_seq_length=32)
  assert features["label_ids"].shape == features["label_weights"].shape == (2, 32)
  assert features["label_weights"].dtype == np.float32 and features["label_ids"].dtype == np.int32
  for row, ex in enumerate(examples):
    pieces = [tokenizer.tokenize(w) for w in ex.words]
    assert any(len(p) > 1 for p in pieces)  # some words do split ("U.N.", "Ekeus", "AI2")
    firsts = 1 + np.cumsum([0] + [len(p) for p in pieces[:-1]])
    assert meta["word_positions"][row].tolist() == firsts.tolist()
    weights = np.zeros(32, np.float32)
    weights[firsts] = 1.0
    assert features["label_weights"][row].tolist() == weights.tolist()  # never [CLS]/[SEP]/later pieces
    assert [task.label_names[i] for i in features["label_ids"][row, firsts]] == list(ex.tags)
    expected_ids = [tokenizer.cls_id] + tokenizer.convert_tokens_to_ids(sum(pieces, [])) + [tokenizer.sep_id]
    assert features["input_ids"][row, :len(expected_ids)].tolist() == expected_ids
    assert features["input_mask"][row].sum() == len(expected_ids)


def test_byte_level_words_are_spelled_as_in_the_running_text(sample):
  """RoBERTa's words after the first carry their space ("Ġofficial"), as in the sentence encoded whole."""
  from bert_jax.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  roberta = load_tokenizer(shared_path("families", "roberta"))
  task = tasks.get_task("conll2003")
  (example, _) = task.read("dev", sample)
  features, _ = task.featurize([example], roberta, max_seq_length=48)
  ids = features["input_ids"][0, 1:int(features["input_mask"][0].sum()) - 1].tolist()
  assert ids == roberta.encode(" " + " ".join(example.words))


def _logits_for(task, features, tags_per_row, meta):
  logits = np.zeros(features["label_ids"].shape + (task.num_labels,), np.float32)
  for row, tags in enumerate(tags_per_row):
    for p, tag in zip(meta["word_positions"][row], tags):
      if p >= 0:
        logits[row, p, task.label_names.index(tag)] = 5.0
  return logits


def test_decode_and_evaluate(sample, tokenizer, tmp_path):
  task = tasks.get_task("conll2003")
  examples = task.read("dev", sample)
  features, meta = task.featurize(examples, tokenizer, 32)
  perfect = _logits_for(task, features, [e.tags for e in examples], meta)
  assert ner.decode(task, perfect, meta) == [list(e.tags) for e in examples]
  assert task.evaluate(perfect, examples, meta)["f1"] == 1.0
  # Second sentence: "Joel" tagged B-LOC (type error) and "Seattle" missed: 4 of 6 entities right,
  # 5 predicted -> P 4/5, R 4/6.
  wrong = [list(examples[0].tags), ["B-ORG", "O", "B-LOC", "O", "O", "O", "O"]]
  scores = task.evaluate(_logits_for(task, features, wrong, meta), examples, meta)
  assert scores["precision"] == pytest.approx(4 / 5) and scores["recall"] == pytest.approx(4 / 6)
  task.write_predictions(str(tmp_path / "pred.txt"), perfect, examples, meta)
  lines = (tmp_path / "pred.txt").read_text().splitlines()
  assert lines[0] == "U.N. B-ORG B-ORG" and lines[7] == "" and len(lines) == 16


def test_a_sentence_past_the_window_is_trained_and_scored_a_window_at_a_time(sample, tokenizer, tmp_path):
  """Finetuning's features are `predict`'s: every word of a sentence longer than the window is in one of its
  runs, so the dev score is predict's on the dev file (one window dropped the words past it, scored "O")."""
  task = tasks.get_task("conll2003")
  examples = task.read("dev", sample)
  features, meta = task.featurize(examples, tokenizer, 8)  # "Baghdad" does not fit the first window
  runs, owners = ner.windows(examples, tokenizer, 8)
  assert meta["example_index"].tolist() == owners and len(features["input_ids"]) == len(runs) > len(examples)
  assert all((p >= 0).all() for p in meta["word_positions"])
  assert sum(int(w.sum()) for w in features["label_weights"]) == sum(len(e.words) for e in examples)
  perfect = _logits_for(task, features, [r.tags for r in runs], meta)
  assert ner.decode(task, perfect, meta) == [list(e.tags) for e in examples]
  assert task.evaluate(perfect, examples, meta)["f1"] == 1.0
  task.write_predictions(str(tmp_path / "pred.txt"), perfect, examples, meta)
  assert len((tmp_path / "pred.txt").read_text().splitlines()) == sum(len(e.words) + 1 for e in examples)
  _, one_window = ner.featurize_truncated(task, examples, tokenizer, 8)   # probing's inputs: cut at the window
  assert one_window["word_positions"][0][-2:].tolist() == [-1, -1]


def test_windows_give_every_word_a_tag_of_the_model_s(sample, tokenizer):
  """`predict` tags a sentence past the window a window at a time: runs of whole words, each fitting, in order,
  a first word longer than the window alone cut to its first pieces."""
  task = tasks.get_task("conll2003")
  examples = task.read("dev", sample)
  runs, owners = ner.windows(examples, tokenizer, 8)
  assert len(runs) > len(examples) and owners == sorted(owners) and set(owners) == {0, 1}
  for i, ex in enumerate(examples):
    mine = [r for r, o in zip(runs, owners) if o == i]
    assert sum((r.words for r in mine), ()) == ex.words and sum((r.tags for r in mine), ()) == ex.tags
  features, meta = task.featurize(runs, tokenizer, 8)
  assert all((p >= 0).all() for p in meta["word_positions"])   # every word has its first sub-token in a window
  perfect = _logits_for(task, features, [r.tags for r in runs], meta)
  assert ner.join(ner.decode(task, perfect, meta), owners) == [list(e.tags) for e in examples]
  # A sentence that fits is one run, as featurize reads it alone.
  assert ner.windows(examples, tokenizer, 128) == (list(examples), [0, 1])
  long_word = ner.NerExample("x", ("a", "Ekeus" * 20, "b"), None)
  runs, owners = ner.windows([long_word], tokenizer, 8)
  assert [r.words for r in runs] == [("a",), ("Ekeus" * 20,), ("b",)] and owners == [0, 0, 0]
  features, meta = task.featurize(runs, tokenizer, 8)
  assert [p.tolist() for p in meta["word_positions"]] == [[1], [1], [1]] and features["input_mask"][1].sum() == 8


def test_reads_a_conll_directory(tmp_path, sample):
  (tmp_path / "eng.testa").write_text(open(sample, encoding="utf-8").read(), encoding="utf-8")
  assert len(tasks.get_task("conll2003").read("dev", str(tmp_path))) == 2
  with pytest.raises(FileNotFoundError):
    tasks.get_task("conll2003").read("test", str(tmp_path))


def test_a_line_without_its_tag_names_the_option_of_the_reader(tmp_path):
  """CoNLL-2003 reads its last column (no option to set); a generic tagging task names its config field."""
  (tmp_path / "train.txt").write_text("EU B-ORG\nrejects\n")
  from bert_jax.finetune import readers  # pylint: disable=g-import-not-at-top
  with pytest.raises(readers.DataError, match=r"line 2: 1 column.*CoNLL-2003's tag is its last column"):
    tasks.get_task("conll2003").read("train", str(tmp_path))
  with pytest.raises(readers.DataError, match=r"line 2: 1 column.*set --config\.task_opts\.tag_column\)"):
    ner.read_columns("train", str(tmp_path))
