"""Finetuning metrics against hand-computed values and reference implementations.

References: scipy (Pearson/Spearman), scikit-learn (MCC, F1) and seqeval (conlleval chunking) when
installed; the official SQuAD v2.0 script's scoring functions, restated below.
"""

import collections
import re
import string

import numpy as np
import pytest

from bert_jax.finetune import metrics

# ---------------------------------------------------------------------------------------------
# GLUE metrics.


def test_matthews_by_hand():
  # TP=2 TN=2 FP=1 FN=1: (2*2 - 1*1) / sqrt(3*3*3*3) = 1/3.
  assert metrics.matthews_corrcoef([1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]) == pytest.approx(1 / 3)
  assert metrics.matthews_corrcoef([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(-1.0)
  assert metrics.matthews_corrcoef([1, 0, 1], [1, 1, 1]) == 0.0  # constant prediction: undefined -> 0


def test_f1_and_accuracy_by_hand():
  # tp=2 fp=1 fn=1 -> P = R = F1 = 2/3.
  assert metrics.f1_binary([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(2 / 3)
  assert metrics.f1_binary([0, 0], [0, 0]) == 0.0
  assert metrics.accuracy([1, 1, 0, 0, 1], [1, 0, 1, 0, 1]) == pytest.approx(0.6)


def test_spearman_with_ties_by_hand():
  # Average ranks x -> [1, 2.5, 2.5, 4], y -> [1, 3, 2, 4]; Pearson of those = 0.9486833.
  assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / np.sqrt(10), abs=1e-6)
  assert metrics.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
  sk = pytest.importorskip("sklearn.metrics")
  rng = np.random.default_rng(seed)
  labels, preds = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
  assert metrics.matthews_corrcoef(labels, preds) == pytest.approx(sk.matthews_corrcoef(labels, preds))
  assert metrics.f1_binary(labels, preds) == pytest.approx(sk.f1_score(labels, preds))
  multi_l, multi_p = rng.integers(0, 3, 60), rng.integers(0, 3, 60)
  assert metrics.matthews_corrcoef(multi_l, multi_p) == pytest.approx(sk.matthews_corrcoef(multi_l, multi_p))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy_with_ties(seed):
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 6, 40).astype(float)  # many ties, as STS-B's 0..5 scores in steps
  y = x + rng.normal(0, 2, 40).round()
  assert metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
  assert metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


# ---------------------------------------------------------------------------------------------
# SQuAD: the official evaluate-v2.0.py functions, verbatim but for names (v1.1 differs only in F1
# when a side is empty: there it is 0).


def _official_normalize(s):
  def remove_articles(text):
    return re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", text)

  def remove_punc(text):
    exclude = set(string.punctuation)
    return "".join(ch for ch in text if ch not in exclude)

  return " ".join(remove_articles(remove_punc(s.lower())).split())


def _official_f1(a_gold, a_pred):
  gold_toks = _official_normalize(a_gold).split() if a_gold else []
  pred_toks = _official_normalize(a_pred).split() if a_pred else []
  common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
  num_same = sum(common.values())
  if len(gold_toks) == 0 or len(pred_toks) == 0:
    return int(gold_toks == pred_toks)
  if num_same == 0:
    return 0
  precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
  return (2 * precision * recall) / (precision + recall)


_ANSWERS = ["The Quick, brown fox!", "quick brown fox", "an apple a day", "Apple day.", "the the",
            "", "Denver Broncos", "the Denver Broncos'", "1,000 years", "1000 years", "café au lait",
            "Saint  Bernadette\tSoubirous", "Bernadette", "theory of the atom", "an", "A-B c"]


def test_normalize_answer_by_hand():
  assert metrics.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
  assert metrics.normalize_answer("an apple a day") == "apple day"
  assert metrics.normalize_answer("theory of theology") == "theory of theology"  # articles as words only
  assert metrics.normalize_answer("1,000") == "1000"


def test_squad_f1_by_hand():
  # pred {cat, sat}, gold {cat, sat, down}: P = 1, R = 2/3, F1 = 0.8.
  assert metrics.squad_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
  assert metrics.squad_f1("", "", "v2.0") == 1.0 and metrics.squad_f1("", "", "v1.1") == 0.0
  assert metrics.squad_f1("a", "something", "v2.0") == 0.0  # "a" normalises to nothing


@pytest.mark.parametrize("pred", _ANSWERS)
def test_squad_scores_match_official_script(pred):
  for gold in _ANSWERS:
    assert metrics.normalize_answer(gold) == _official_normalize(gold)
    assert metrics.squad_f1(pred, gold, "v2.0") == pytest.approx(_official_f1(gold, pred))
    assert metrics.squad_exact(pred, gold) == float(_official_normalize(gold) == _official_normalize(pred))


def test_squad_scores_max_over_gold_and_no_answer():
  gold = {"q1": ["Denver Broncos", "the Broncos"], "q2": [], "q3": ["1882"]}
  preds = {"q1": "Broncos", "q2": "", "q3": "in 1882"}
  result = metrics.squad_scores(preds, gold, "v2.0")
  # q1: "broncos" equals the normalised 2nd gold answer (EM 1, F1 1); q3: F1 2*(.5*1)/1.5.
  assert result["exact_match"] == pytest.approx(2 / 3)  # q1 and q2 exact, q3 not
  assert result["f1"] == pytest.approx((1.0 + 1.0 + 2 * 0.5 * 1 / 1.5) / 3)
  assert result["HasAns_total"] == 2 and result["NoAns_total"] == 1 and result["NoAns_f1"] == 1.0
  # As the official script: no NoAns scores where no question is unanswerable (they would read as zeros earned).
  answerable = metrics.squad_scores({"q1": "Broncos"}, {"q1": gold["q1"]}, "v2.0")
  assert answerable["HasAns_total"] == 1 and not any(k.startswith("NoAns") for k in answerable)
  with pytest.raises(ValueError, match="no prediction"):
    metrics.squad_scores({"q1": "x"}, gold, "v2.0")


# ---------------------------------------------------------------------------------------------
# Entity-level NER.


def test_entities_bio_and_iob1_by_hand():
  assert metrics.get_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
  # IOB1: I- opens a chunk after O; B- separates adjacent chunks of one type.
  assert metrics.get_entities(["I-PER", "I-PER", "B-PER", "O", "I-LOC"]) == [
      ("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]
  assert metrics.get_entities(["I-PER", "I-ORG"]) == [("PER", 0, 0), ("ORG", 1, 1)]
  assert metrics.get_entities(["S-PER", "B-LOC", "E-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]


def test_boundary_error_is_false_positive_and_false_negative():
  gold = [["B-PER", "I-PER", "O", "B-LOC"]]
  pred = [["B-PER", "O", "O", "B-LOC"]]  # PER cut short: wrong chunk (FP) and missed chunk (FN)
  result = metrics.entity_scores(gold, pred)
  assert result["precision"] == 0.5 and result["recall"] == 0.5 and result["f1"] == 0.5
  assert result["f1_LOC"] == 1.0 and result["f1_PER"] == 0.0
  assert result["token_accuracy"] == 0.75


def _random_tags(rng, n, prefixes):
  return [str(rng.choice(["O"] + [f"{p}-{t}" for p in prefixes for t in ("PER", "LOC")]))
          for _ in range(n)]


@pytest.mark.parametrize("prefixes", [("B", "I"), ("I",), ("B", "I", "E", "S")])
def test_entity_scores_match_seqeval(prefixes):
  seqeval = pytest.importorskip("seqeval.metrics")
  rng = np.random.default_rng(len(prefixes))
  for _ in range(20):
    lengths = rng.integers(1, 12, 5)
    gold = [_random_tags(rng, n, prefixes) for n in lengths]
    pred = [_random_tags(rng, n, prefixes) for n in lengths]
    result = metrics.entity_scores(gold, pred)
    assert result["precision"] == pytest.approx(seqeval.precision_score(gold, pred))
    assert result["recall"] == pytest.approx(seqeval.recall_score(gold, pred))
    assert result["f1"] == pytest.approx(seqeval.f1_score(gold, pred))
