"""SQuAD: gold spans round-trip through windowed features; n-best decoding rules; v2 no-answer."""

import json

import numpy as np
import pytest

from bert_jax.finetune import metrics, squad, tasks
from tests.conftest import shared_path


@pytest.fixture(scope="module")
def tokenizer():
  from bert_jax.data.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  return load_tokenizer(str(shared_path("minilm", "vocab.txt")))


def _every_answer():
  """(example with that answer as its first, answer text) for every gold answer of the sample."""
  with open(shared_path("tasks", "format_samples", "squad.json"), encoding="utf-8") as f:
    data = json.load(f)["data"]
  for article in data:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        for a in qa["answers"]:
          yield squad.make_example(qa["id"], qa["question"], paragraph["context"], [a["text"]],
                                   [a["answer_start"]]), a["text"]


def _one_hot_logits(features, value=10.0):
  """Start/end logits peaking at each feature's labelled span (what a perfect model would output)."""
  n, length = features["input_ids"].shape
  start, end = np.zeros([n, length], np.float32), np.zeros([n, length], np.float32)
  start[np.arange(n), features["start_positions"]] = value
  end[np.arange(n), features["end_positions"]] = value
  return {"start_logits": start, "end_logits": end}


def test_every_gold_answer_round_trips_through_overlapping_windows(tokenizer):
  task = tasks.get_task("squad_v1", doc_stride=16)
  answers = list(_every_answer())
  assert len(answers) == 7
  for example, text in answers:
    query = tokenizer.tokenize(example.question_text)
    answer_length = len(tokenizer.tokenize(text))
    # Windows just large enough for the answer (the whole-context answer needs a long one), 16 apart.
    length = max(64, len(query) + 3 + answer_length + 8)
    features, meta = task.featurize([example], tokenizer, length)
    doc_length = sum(len(tokenizer.tokenize(w)) for w in example.doc_tokens)
    if answer_length < doc_length:  # the context really is split into overlapping windows
      assert len(features["input_ids"]) > 1
    holding = np.flatnonzero(features["start_positions"] > 0)
    assert holding.size >= 1, text
    for f in holding:
      s, e = features["start_positions"][f], features["end_positions"][f]
      assert metrics.normalize_answer(squad.span_text(example, meta, f, s, e)) == metrics.normalize_answer(text)
      assert np.all(features["segment_ids"][f, s:e + 1] == 1)  # inside the context
    # And through the n-best decoder, which scores each token only in its max-context window.
    predicted, _, _ = squad.decode(_one_hot_logits(features), [example], meta, max_answer_length=length)
    assert metrics.normalize_answer(predicted[example.qas_id]) == metrics.normalize_answer(text)


def test_partial_word_answer_is_cut_from_the_original_text(tokenizer):
  example = next(ex for ex, text in _every_answer() if text == "Father Julius Nieuwl")
  features, meta = tasks.get_task("squad_v1").featurize([example], tokenizer, 384)
  s, e = features["start_positions"][0], features["end_positions"][0]
  assert squad.span_text(example, meta, 0, s, e) == "Father Julius Nieuwl"  # exactly, not "...Nieuwland"


def test_windows_and_max_context():
  assert squad._doc_spans(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
  assert squad._doc_spans(3, 4, 2) == [(0, 3)]
  with pytest.raises(ValueError, match="no room"):
    squad._doc_spans(3, 0, 2)
  spans = [(0, 4), (2, 4), (4, 4)]
  # Token 3: context min(3, 0) in span 0, min(1, 2) in span 1 -> span 1 only.
  assert [squad._is_max_context(spans, i, 3) for i in range(3)] == [False, True, False]


def test_get_final_text():
  assert squad.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
  assert squad.get_final_text("1895", "(1895-1943).", True) == "1895"
  assert squad.get_final_text("zzz", "Steve", True) == "Steve"  # cannot align: the original words
  assert squad.get_final_text("cafe", "Café,", True) == "Café"


def _toy(tokenizer, context="alpha beta gamma delta epsilon", question="which?", length=16):
  example = squad.make_example("q", question, context, ["gamma"], [context.index("gamma")])
  features, meta = tasks.get_task("squad_v2").featurize([example], tokenizer, length)
  return example, features, meta


def test_decoding_rules(tokenizer):
  example, features, meta = _toy(tokenizer)
  tokens = meta["tokens"][0]
  pos = {t: i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")}
  start, end = np.zeros([1, 16]), np.zeros([1, 16])

  def best(max_answer_length=30):
    return squad.decode({"start_logits": start, "end_logits": end}, [example], meta,
                        max_answer_length=max_answer_length)[0]["q"]

  start[0, pos["delta"]], end[0, pos["beta"]] = 5, 5  # end before start: invalid
  end[0, pos["epsilon"]] = 4
  assert best() == "delta epsilon"
  assert best(max_answer_length=1) == "delta"  # the 2-token span is too long; the next best fits
  start[0, pos["which"]], end[0, pos["which"]] = 9, 9  # inside the question: never an answer
  assert best(max_answer_length=1) == "delta"


def test_v2_null_threshold(tokenizer):
  example, features, meta = _toy(tokenizer)
  logits = _one_hot_logits(features, 3.0)  # span score 6
  logits["start_logits"][0, 0] = logits["end_logits"][0, 0] = 4.0  # null score 8: diff 2
  for threshold, expected in ((0.0, ""), (1.9, ""), (2.1, "gamma")):
    answers, non_null, diffs = squad.decode(logits, [example], meta, version="v2.0",
                                            null_score_diff_threshold=threshold)
    assert answers["q"] == expected and non_null["q"] == "gamma" and diffs["q"] == pytest.approx(2.0)
  # As the official script given the written predictions: at threshold 0 the answer is "" and no threshold
  # brings it back; written at 2.1 it is "gamma", right from the threshold of its diff on.
  result = tasks.get_task("squad_v2").evaluate(logits, [example], meta)
  assert result["exact_match"] == result["best_exact_match"] == 0.0 and result["best_f1_threshold"] == 0.0
  result = tasks.get_task("squad_v2").evaluate(logits, [example], meta, null_score_diff_threshold=2.1)
  assert result["exact_match"] == result["best_exact_match"] == 1.0
  assert result["best_exact_match_threshold"] == pytest.approx(2.0)


def test_v2_best_threshold_and_answer_split_as_the_official_script():
  """evaluate-v2.0.py: a question has an answer when its gold list is not empty (an answer that normalises
  to nothing, "The", included: it is then scored against ""), and `find_best_thresh` moves the threshold
  over the predictions as written (a question answered "" gains nothing), from 0.0."""
  gold = {"q1": ["Paris"], "q2": ["Rome"], "q3": [], "q4": ["The"]}
  written = {"q1": "", "q2": "Rome", "q3": "", "q4": ""}
  null_diffs = {"q1": 0.5, "q2": -1.0, "q3": 2.0, "q4": 1.0}
  scores = metrics.squad_scores(written, gold, "v2.0")
  assert (scores["HasAns_total"], scores["NoAns_total"]) == (3, 1)
  assert scores["HasAns_exact_match"] == pytest.approx(2 / 3) and scores["NoAns_exact_match"] == 1.0
  exact, _, has_answer = metrics.squad_raw_scores(written, gold, "v2.0")
  # From "" everywhere counted as the unanswerable questions' score (q3: 1), in the order of the diffs q2
  # takes "Rome" (2), q1 stays "" (2), q4's "" scores against its gold "The" normalised to "" (3, at 1.0).
  assert squad.best_null_threshold(written, null_diffs, exact, has_answer) == (pytest.approx(3 / 4), 1.0)
  assert squad.best_null_threshold({"q3": "Oslo"}, {"q3": 2.0}, {"q3": 0.0}, {"q3": False}) == (1.0, 0.0)


def test_v2_unanswerable_features_point_at_cls(tokenizer, tmp_path):
  context = "alpha beta gamma"
  impossible = squad.make_example("n", "what?", context, [], [], is_impossible=True)
  answerable = squad.make_example("a", "what?", context, ["beta"], [6])
  task = tasks.get_task("squad_v2")
  features, meta = task.featurize([impossible, answerable], tokenizer, 16)
  assert features["start_positions"][0] == features["end_positions"][0] == 0
  assert features["start_positions"][1] > 0
  logits = _one_hot_logits(features)
  result = task.evaluate(logits, [impossible, answerable], meta)
  assert result["exact_match"] == result["f1"] == 1.0 and result["NoAns_total"] == 1
  task.write_predictions(str(tmp_path / "predictions.json"), logits, [impossible, answerable], meta)
  assert json.loads((tmp_path / "predictions.json").read_text()) == {"n": "", "a": "beta"}
  assert set(json.loads((tmp_path / "predictions_null_odds.json").read_text())) == {"n", "a"}


def test_v1_evaluate_on_the_sample(tokenizer):
  task = tasks.get_task("squad_v1", doc_stride=32)
  examples = task.read("dev", str(shared_path("tasks", "format_samples", "squad.json")))
  assert len(examples) == 5 and examples[1].answers[2].startswith("Architecturally")
  features, meta = task.featurize(examples, tokenizer, 96)
  result = task.evaluate(_one_hot_logits(features), examples, meta)
  assert result["exact_match"] == 1.0 and result["f1"] == 1.0
  zero = {k: np.zeros_like(v) for k, v in _one_hot_logits(features).items()}
  assert task.evaluate(zero, examples, meta)["exact_match"] < 1.0


def test_answer_not_in_context_is_dropped_for_training(tokenizer):
  bad = squad.make_example("x", "q?", "alpha beta", ["gamma"], [0])
  assert bad.start_position == -1
  task = tasks.get_task("squad_v1")
  assert len(task.featurize([bad], tokenizer, 16)[0]["input_ids"]) == 1
  assert len(task.featurize([bad], tokenizer, 16, is_training=True)[0]["input_ids"]) == 0


def test_tfds_squad_with_mock_data(tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  from unittest import mock  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE), \
       mock.patch.object(tfds.core.DatasetBuilder, "is_prepared", return_value=True):
    examples = tasks.get_task("squad_v2").read("dev", "tfds", data_dir=str(tmp_path))
  assert len(examples) == 3 and all(isinstance(e, squad.SquadExample) for e in examples)


def test_reads_v2_json_with_unanswerable_questions(tmp_path):
  data = {"version": "v2.0", "data": [{"title": "T", "paragraphs": [{
      "context": "Normans came from Normandy in France.",
      "qas": [{"id": "a", "question": "Where from?", "is_impossible": False,
               "answers": [{"text": "Normandy", "answer_start": 18}]},
              {"id": "n", "question": "When?", "is_impossible": True, "answers": [],
               "plausible_answers": [{"text": "France", "answer_start": 30}]}]}]}]}
  (tmp_path / "dev-v2.0.json").write_text(json.dumps(data), encoding="utf-8")
  answerable, impossible = tasks.get_task("squad_v2").read("dev", str(tmp_path))
  assert (answerable.doc_tokens[answerable.start_position], answerable.answers) == ("Normandy", ("Normandy",))
  assert impossible.is_impossible and impossible.answers == () and impossible.start_position == -1


def test_finetuning_drops_training_questions_whose_answer_is_not_in_their_context(tmp_path):
  """`trainer._read_data` featurizes the training split with `is_training`, as run_squad.py trains: a
  question whose answer text is not at its offset is not trained on as "no answer"; dev keeps it."""
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  from configs.finetune import squad_v1  # pylint: disable=g-import-not-at-top
  from test_finetune_train import write_vocab  # pylint: disable=g-import-not-at-top
  context = "the movie was good and the plot was great"
  qas = [{"id": "ok", "question": "what was good?", "answers": [{"text": "movie", "answer_start": 4}]},
         {"id": "bad", "question": "what was bad?", "answers": [{"text": "the acting", "answer_start": 0}]}]
  for split in ("train", "dev"):
    (tmp_path / f"{split}.json").write_text(json.dumps(
        {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
  write_vocab(tmp_path)
  c = squad_v1.get_config()
  c.data_dir, c.vocab_file, c.max_seq_length = str(tmp_path), str(tmp_path / "vocab.txt"), 32
  from bert_jax.finetune import init  # pylint: disable=g-import-not-at-top
  task = tasks.get_task(c.task, **c.task_opts)
  _, train, (dev,), _ = trainer._read_data(task, c, init.load_tokenizer(c))
  assert [train.examples[i].qas_id for i in train.meta["example_index"]] == ["ok"]
  assert [dev.examples[i].qas_id for i in dev.meta["example_index"]] == ["ok", "bad"]


@pytest.mark.parametrize("family", ["albert", "roberta"])
def test_other_tokenizers_label_and_decode_exact_spans(family):
  """SentencePiece and byte-level BPE spell a piece by where it stands (the answer alone is "▁1632", in
  "(1632-1675)" it is "16", "3", "2"): the training span is the answer's pieces, a perfect model's answer is
  the answer's text, not its whole words; RoBERTa's context words keep their "Ġ" and its layout is its own."""
  from bert_jax.data import tokenizer as tokenization  # pylint: disable=g-import-not-at-top
  tok = tokenization.load_tokenizer(shared_path("families", family))
  context = "The painter Jan Vermeer (1632-1675) lived in Delft, a city in the Netherlands."
  examples = [squad.make_example("q1", "When was Vermeer born?", context, ["1632"], [context.index("1632")]),
              squad.make_example("q2", "Where did he live?", context, ["Delft"], [context.index("Delft")])]
  features, meta = tasks.get_task("squad_v1").featurize(examples, tok, 64, is_training=True)
  start, end = features["start_positions"], features["end_positions"]
  assert tok.decode(features["input_ids"][0, start[0]:end[0] + 1]).strip() == "1632"
  answers, _, _ = squad.decode(_one_hot_logits(features), examples, meta)
  assert answers == {"q1": "1632", "q2": "Delft"}
  if family == "roberta":
    ids = features["input_ids"][0][:int(features["input_mask"][0].sum())].tolist()
    query = tok.encode("When was Vermeer born?")
    assert ids == tok.build_inputs(query, tok.encode(" " + context))[0]   # <s> q </s></s> context </s>
    assert not features["segment_ids"].any()


def test_an_uncased_tokenizer_json_cuts_an_answer_inside_a_word(tmp_path):
  """Its normaliser lowercases (its do_lower_case is False: ours never lowercases again): the pieces'
  text is aligned with the original lowercased, as for vocab.txt, not given up for whole words."""
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  from bert_jax.data import tokenizer as tokenization  # pylint: disable=g-import-not-at-top
  BertWordPieceTokenizer(str(shared_path("minilm", "vocab.txt")), lowercase=True).save(str(tmp_path / "tokenizer.json"))
  tok = tokenization.load_tokenizer(tmp_path / "tokenizer.json")
  example = next(e for e, a in _every_answer() if a == "Father Julius Nieuwl")
  features, meta = tasks.get_task("squad_v1").featurize([example], tok, 384, is_training=True)
  start, end = int(features["start_positions"][0]), int(features["end_positions"][0])
  assert squad.span_text(example, meta, 0, start, end) == "Father Julius Nieuwl"
