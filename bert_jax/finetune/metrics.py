"""The official metrics of the finetuning tasks, in numpy, each a fraction in [0, 1].

* GLUE (Wang et al. 2019): accuracy, binary F1, Matthews correlation (as sklearn), Pearson and
  Spearman (average ranks for ties, as scipy).
* SQuAD: `normalize_answer`, exact match and token F1 exactly as the official evaluation scripts
  v1.1 and v2.0 (max over the gold answers; in v2.0 an empty gold list means "no answer"). The
  scripts print 100x the fractions returned here.
* NER: entity (chunk) level precision/recall/F1 as conlleval and seqeval's default mode, for BIO
  (IOB2), IOB1 and IOBES tags: a chunk counts only if type, start and end all match, so a boundary
  error is both a false positive and a false negative.
"""

import collections
import re
import string

import numpy as np


# ---------------------------------------------------------------------------------------------
# Classification and regression (GLUE).


def accuracy(labels, preds) -> float:
  """Fraction of predictions equal to the labels (0.0 when there are none)."""
  labels, preds = np.asarray(labels), np.asarray(preds)
  return float(np.mean(labels == preds)) if labels.size else 0.0


def f1_binary(labels, preds, positive=1) -> float:
  """F1 of the positive class (MRPC, QQP); 0.0 when it has no true positive."""
  labels, preds = np.asarray(labels) == positive, np.asarray(preds) == positive
  tp = np.sum(labels & preds)
  return _f1(tp, np.sum(preds), np.sum(labels))


def matthews_corrcoef(labels, preds) -> float:
  """Multiclass Matthews correlation (Gorodkin 2004), as sklearn: 0.0 when undefined (CoLA)."""
  labels, preds = np.asarray(labels), np.asarray(preds)
  classes, index = np.unique(np.concatenate([labels, preds]), return_inverse=True)
  true, pred = index[:labels.size], index[labels.size:]
  confusion = np.zeros([classes.size, classes.size], np.float64)
  np.add.at(confusion, (true, pred), 1.0)
  t_sum, p_sum = confusion.sum(1), confusion.sum(0)
  n, correct = confusion.sum(), np.trace(confusion)
  cov_tp = correct * n - t_sum @ p_sum
  cov_pp = n * n - p_sum @ p_sum
  cov_tt = n * n - t_sum @ t_sum
  if cov_pp * cov_tt == 0:
    return 0.0
  return float(cov_tp / np.sqrt(cov_tt * cov_pp))


def pearson(x, y) -> float:
  """Pearson correlation (STS-B); 0.0 when either side is constant."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denom = np.sqrt((x @ x) * (y @ y))
  return float(x @ y / denom) if denom > 0 else 0.0


def _average_ranks(x) -> np.ndarray:
  """Ranks 1..n, tied values sharing the mean of their ranks (scipy.stats.rankdata 'average')."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="mergesort")
  sorted_x = x[order]
  starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
  ends = np.r_[starts[1:], x.size]
  ranks = np.empty(x.size, np.float64)
  ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
  return ranks


def spearman(x, y) -> float:
  """Spearman's rho: Pearson correlation of the average ranks (STS-B)."""
  return pearson(_average_ranks(x), _average_ranks(y))


def _f1(num_correct, num_predicted, num_gold) -> float:
  precision = num_correct / num_predicted if num_predicted else 0.0
  recall = num_correct / num_gold if num_gold else 0.0
  return float(2 * precision * recall / (precision + recall)) if precision + recall else 0.0


# ---------------------------------------------------------------------------------------------
# SQuAD, as the official evaluate-v1.1.py and evaluate-v2.0.py.


def normalize_answer(s: str) -> str:
  """Lower text and remove punctuation, articles and extra whitespace."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
  s = re.sub(r"\b(a|an|the)\b", " ", s, flags=re.UNICODE)
  return " ".join(s.split())


_PUNCTUATION = frozenset(string.punctuation)


def squad_exact(prediction: str, gold: str) -> float:
  """1.0 if the normalised texts are equal, else 0.0."""
  return float(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str, version: str = "v2.0") -> float:
  """Token F1. Empty on either side: v2.0 scores 1 only if both are empty, v1.1 scores 0."""
  pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
  if version == "v2.0" and (not pred_tokens or not gold_tokens):
    return float(pred_tokens == gold_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  return _f1(num_same, len(pred_tokens), len(gold_tokens))


def squad_raw_scores(predictions: dict, gold_answers: dict, version: str = "v1.1") -> tuple[dict, dict, dict]:
  """({qid: exact}, {qid: f1}, {qid: has an answer}) as the official scripts' `get_raw_scores` and v2.0's
  `make_qid_to_has_ans`: a question has an answer when its gold list is not empty, even where every gold
  text normalises to nothing (an answer "The"); those are then scored against "" as unanswerable ones are."""
  missing = set(gold_answers) - set(predictions)
  if missing:
    raise ValueError(f"{len(missing)} questions have no prediction, e.g. {sorted(missing)[:3]}")
  exact, f1, has_answer = {}, {}, {}
  for qid, answers in gold_answers.items():
    has_answer[qid] = bool(answers)
    if version == "v2.0":
      answers = [a for a in answers if normalize_answer(a)]
    answers = answers or [""]
    exact[qid] = max(squad_exact(predictions[qid], a) for a in answers)
    f1[qid] = max(squad_f1(predictions[qid], a, version) for a in answers)
  return exact, f1, has_answer


def squad_scores(predictions: dict, gold_answers: dict, version: str = "v1.1") -> dict:
  """Exact match and F1 over questions, max over each question's gold answers.

  Args:
    predictions: {qid: predicted text} ("" = no answer); every qid of `gold_answers` must be there.
    gold_answers: {qid: [gold texts]}; in v2.0 an empty list (or only empty texts) is "no answer".
    version: "v1.1" or "v2.0".
  Returns:
    {"exact_match", "f1"} and, for v2.0, the same split into "HasAns_*" and "NoAns_*" with counts, each where the
    set has such questions (as the official evaluate-v2.0.py: no zero scores for a category with no question).
  """
  exact, f1, has_answer = squad_raw_scores(predictions, gold_answers, version)
  result = {"exact_match": _mean(exact.values()), "f1": _mean(f1.values()), "total": len(exact)}
  if version == "v2.0":
    for prefix, want in (("HasAns", True), ("NoAns", False)):
      qids = [q for q in exact if has_answer[q] == want]
      if qids:
        result.update({f"{prefix}_exact_match": _mean(exact[q] for q in qids),
                       f"{prefix}_f1": _mean(f1[q] for q in qids), f"{prefix}_total": len(qids)})
  return result


def _mean(values) -> float:
  values = list(values)
  return float(np.mean(values)) if values else 0.0


# ---------------------------------------------------------------------------------------------
# Entity-level NER (conlleval / seqeval default mode).


def _split_tag(tag: str) -> tuple[str, str]:
  if tag in ("O", ""):
    return "O", ""
  prefix, _, kind = tag.partition("-")
  return (prefix, kind) if kind else ("I", prefix)  # a bare "PER" is read as inside a PER chunk


def _ends_chunk(prev, cur, prev_type, cur_type) -> bool:
  return (prev in ("E", "S") or (prev in ("B", "I") and cur in ("B", "S", "O"))
          or (prev != "O" and prev_type != cur_type))


def _starts_chunk(prev, cur, prev_type, cur_type) -> bool:
  return (cur in ("B", "S") or (prev in ("E", "S", "O") and cur in ("E", "I"))
          or (cur != "O" and prev_type != cur_type))


def get_entities(tags) -> list[tuple[str, int, int]]:
  """Chunks (type, start, end inclusive) of one tag sequence in BIO, IOB1 or IOBES."""
  chunks, start = [], None
  prev, prev_type = "O", ""
  for i, tag in enumerate(list(tags) + ["O"]):
    cur, cur_type = _split_tag(tag)
    if start is not None and _ends_chunk(prev, cur, prev_type, cur_type):
      chunks.append((prev_type, start, i - 1))
      start = None
    if _starts_chunk(prev, cur, prev_type, cur_type):
      start = i
    prev, prev_type = cur, cur_type
  return chunks


def entity_scores(gold_sentences, pred_sentences) -> dict:
  """Micro precision/recall/F1 over chunks, per-type F1 ("f1_PER") and token accuracy.

  Args:
    gold_sentences, pred_sentences: lists of tag sequences, one per sentence, of equal lengths.
  """
  gold, pred = set(), set()
  correct_tokens = total_tokens = 0
  for n, (g, p) in enumerate(zip(gold_sentences, pred_sentences, strict=True)):
    if len(g) != len(p):
      raise ValueError(f"sentence {n}: {len(g)} gold tags but {len(p)} predicted")
    gold.update((n,) + c for c in get_entities(g))
    pred.update((n,) + c for c in get_entities(p))
    correct_tokens += sum(a == b for a, b in zip(g, p))
    total_tokens += len(g)
  correct = gold & pred
  result = {"precision": len(correct) / len(pred) if pred else 0.0,
            "recall": len(correct) / len(gold) if gold else 0.0,
            "f1": _f1(len(correct), len(pred), len(gold)),
            "token_accuracy": correct_tokens / total_tokens if total_tokens else 0.0}
  n_correct, n_pred, n_gold = (collections.Counter(c[1] for c in s) for s in (correct, pred, gold))
  for kind in sorted(n_pred | n_gold):
    result[f"f1_{kind}"] = _f1(n_correct[kind], n_pred[kind], n_gold[kind])
  return result
