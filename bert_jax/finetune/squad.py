"""SQuAD v1.1 / v2.0: reading, windowed features, n-best span decoding, official EM/F1.

Follows google-research/bert `run_squad.py` step for step: contexts are split on whitespace into
words, each word into sub-tokens; a context longer than the window is covered by overlapping windows
`doc_stride` sub-tokens apart; a token is scored only in the window where it has the most context
("max context"); spans are decoded from the top-`n_best_size` starts and ends (valid, inside the
context, end >= start, at most `max_answer_length` sub-tokens) and mapped back to the original text
with `get_final_text`. For v2.0 the answer is "" when the best [CLS] ("null") score beats the best
span's score by more than `null_score_diff_threshold` (Devlin et al. 2019, 4.3).
"""

import collections
import dataclasses
import functools
import json
import logging
import os

import numpy as np

from bert_jax.data import wordpiece_text
from bert_jax.finetune import metrics, readers


@dataclasses.dataclass(frozen=True)
class SquadExample:
  """One question. `start_position`/`end_position` index `doc_tokens` (the context's whitespace
  words) for the first gold answer; -1 when there is none or it cannot be found in the context."""

  qas_id: str
  question_text: str
  doc_tokens: tuple[str, ...]
  answers: tuple[str, ...]          # every gold answer text (evaluation)
  orig_answer_text: str = ""
  start_position: int = -1
  end_position: int = -1
  is_impossible: bool = False


# ---------------------------------------------------------------------------------------------
# Reading.


def _is_whitespace(c: str) -> bool:
  return c in " \t\r\n" or ord(c) == 0x202F


def split_context(context: str) -> tuple[list[str], list[int]]:
  """(whitespace words, word index of every character), as `run_squad.read_squad_examples`."""
  words, char_to_word, prev_is_whitespace = [], [], True
  for c in context:
    if _is_whitespace(c):
      prev_is_whitespace = True
    else:
      if prev_is_whitespace:
        words.append(c)
      else:
        words[-1] += c
      prev_is_whitespace = False
    char_to_word.append(len(words) - 1)
  return words, char_to_word


def make_example(qas_id, question, context, answers, answer_starts, is_impossible=False,
                 words_and_offsets=None) -> SquadExample:
  """A SquadExample; the first answer is located in the context's words by its character offset."""
  words, char_to_word = words_and_offsets or split_context(context)
  start = end = -1
  text = ""
  if answers and not is_impossible:
    text, offset = answers[0], answer_starts[0]
    inside = text and 0 <= offset and offset + len(text) <= len(char_to_word)
    if inside:
      start, end = char_to_word[offset], char_to_word[offset + len(text) - 1]
    if not inside or " ".join(words[start:end + 1]).find(" ".join(text.split())) == -1:
      logging.warning("SQuAD %s: answer %r not found in the context", qas_id, text)
      start = end = -1
  return SquadExample(qas_id=str(qas_id), question_text=question, doc_tokens=tuple(words),
                      answers=tuple(answers), orig_answer_text=text, start_position=start,
                      end_position=end, is_impossible=bool(is_impossible))


def read_json(path: str) -> list[SquadExample]:
  """Examples of a SQuAD JSON file (v1.1 or v2.0; `is_impossible` is read when present)."""
  try:
    data = json.loads(readers.read_text(path))["data"]
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise readers.DataError(f"{path} is not a SQuAD file ({type(e).__name__}: {e}); it holds "
                            '{"data": [{"paragraphs": [{"context": ..., "qas": [...]}]}]}.') from None
  examples = []
  for article in data:
    for paragraph in article["paragraphs"]:
      split = split_context(paragraph["context"])
      for qa in paragraph["qas"]:
        answers = qa.get("answers", [])
        examples.append(make_example(
            qa["id"], qa["question"], paragraph["context"], [a["text"] for a in answers],
            [a["answer_start"] for a in answers], qa.get("is_impossible", False), split))
  return examples


def read(split: str, source: str, data_dir: str | None = None, version: str = "v1.1"):
  """`split` from a SQuAD JSON file, a directory with `<split>.json` or `<split>-v1.1.json` /
  `<split>-v2.0.json`, or "tfds" / "tfds:squad/v2.0" from a prepared `data_dir`."""
  if readers.is_tfds(source):
    records, _ = readers.tfds_records(readers.tfds_name(source, f"squad/{version}"), split, data_dir)
    return [make_example(r["id"], r["question"], r["context"], r["answers"]["text"],
                         r["answers"]["answer_start"], r.get("is_impossible", False))
            for r in records]
  return read_json(readers.resolve_file(source, split, (".json", f"-{version}.json")))


# ---------------------------------------------------------------------------------------------
# Features.


def _improve_answer_span(doc_tokens, start, end, tokenizer, answer_text):
  """The tightest sub-token span whose text equals the tokenized answer ("1895" in "(1895-1943).").

  WordPiece compares the pieces (run_squad); the other kinds spell a piece by where it stands (the answer's
  "▁1632" is "16", "3", "2" after "▁(" in the context), so they compare the pieces' decoded text."""
  same = (lambda pieces: " ".join(pieces)) if tokenizer.kind == "wordpiece" else (
      lambda pieces: _decoded(tokenizer, pieces).strip())
  answer = same(tokenizer.tokenize(answer_text))
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if same(doc_tokens[new_start:new_end + 1]) == answer:
        return new_start, new_end
  return start, end


def _lowercases(tokenizer) -> bool:
  """Whether the tokenizer lowercases (`get_final_text` aligns its pieces with the original text so): its
  `do_lower_case`, or for a tokenizer.json, whose normaliser does it, what it makes of "A"."""
  if tokenizer.kind != "tokenizer_json":
    return getattr(tokenizer, "do_lower_case", True)
  return tokenizer.decode(tokenizer.encode("A")).strip() == "a"


def _decoded(tokenizer, pieces) -> str:
  return tokenizer.decode(tokenizer.convert_tokens_to_ids(pieces))


def _doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
  """(start, length) windows over the context's sub-tokens."""
  if max_tokens < 1:
    raise ValueError("no room for the context: raise max_seq_length or lower max_query_length")
  spans, start = [], 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens)
    spans.append((start, length))
    if start + length == num_tokens:
      break
    start += min(length, doc_stride)
  return spans


def _is_max_context(spans, span_index: int, position: int) -> bool:
  """Whether window `span_index` gives `position` its largest min(left, right) context."""
  best, best_index = None, None
  for i, (start, length) in enumerate(spans):
    end = start + length - 1
    if start <= position <= end:
      score = min(position - start, end - position) + 0.01 * length
      if best is None or score > best:
        best, best_index = score, i
  return span_index == best_index


def _tokenize_words(words, tokenizer):
  """Each whitespace word's pieces, spelled as in the running text (`space_prefix`: byte-level BPE's "Ġ")."""
  sub_tokens, tok_to_orig, orig_to_tok = [], [], []
  for i, word in enumerate(words):
    orig_to_tok.append(len(sub_tokens))
    for piece in tokenizer.tokenize(tokenizer.space_prefix + word):
      tok_to_orig.append(i)
      sub_tokens.append(piece)
  return sub_tokens, tok_to_orig, orig_to_tok


def answer_token_span(example: SquadExample, sub_tokens, orig_to_tok, tokenizer) -> tuple[int, int]:
  """Sub-token (start, end) of the example's first answer in its context; (-1, -1) if none."""
  if example.start_position < 0:
    return -1, -1
  start = orig_to_tok[example.start_position]
  if example.end_position < len(example.doc_tokens) - 1:
    end = orig_to_tok[example.end_position + 1] - 1
  else:
    end = len(sub_tokens) - 1
  return _improve_answer_span(sub_tokens, start, end, tokenizer, example.orig_answer_text)


def featurize(task, examples, tokenizer, max_seq_length, **opts):
  """Windows of `[CLS] question [SEP] context-window [SEP]`, in the tokenizer's layout (`build_inputs`:
  RoBERTa's `<s> question </s></s> context </s>`, one token type).

  Options (task options as defaults): doc_stride=128, max_query_length=64, is_training=False (drop
  examples whose answer is not in their context: they cannot be trained on).
  Returns:
    features: input_ids, input_mask, segment_ids [N, L]; start_positions, end_positions [N]
      (0 = [CLS] when the window does not hold the whole answer, or there is none).
    meta: example_index [N], token_to_orig [N, L] (word index, -1 outside the context),
      max_context [N, L] bool, tokens (list of sub-token lists), do_lower_case.
  """
  doc_stride = task.option("doc_stride", opts, 128)
  max_query_length = task.option("max_query_length", opts, 64)
  is_training = task.option("is_training", opts, False)
  rows = collections.defaultdict(list)
  tokenized = {}  # questions on one paragraph share its tokenization
  for example_index, ex in enumerate(examples):
    if is_training and not ex.is_impossible and ex.start_position < 0:
      continue
    if ex.doc_tokens not in tokenized:
      tokenized[ex.doc_tokens] = _tokenize_words(ex.doc_tokens, tokenizer)
    sub_tokens, tok_to_orig, orig_to_tok = tokenized[ex.doc_tokens]
    answer = answer_token_span(ex, sub_tokens, orig_to_tok, tokenizer)
    query = tokenizer.tokenize(ex.question_text)[:max_query_length]
    query_ids = tokenizer.convert_tokens_to_ids(query)
    layout, _ = tokenizer.build_inputs(query_ids, [])
    offset = len(layout) - 1   # where the context starts: [CLS] q [SEP] (RoBERTa: <s> q </s></s>)
    spans = _doc_spans(len(sub_tokens), max_seq_length - len(layout), doc_stride)
    for span_index, (start, length) in enumerate(spans):
      row = _window_row(tokenizer, query_ids, sub_tokens, tok_to_orig, answer, spans, span_index, offset,
                        max_seq_length)
      for k, v in dict(row, example_index=example_index).items():
        rows[k].append(v)
  features = {k: np.array(rows[k], np.int32).reshape(-1, max_seq_length)
              for k in ("input_ids", "input_mask", "segment_ids")}
  features.update({k: np.array(rows[k], np.int32) for k in ("start_positions", "end_positions")})
  meta = {"example_index": np.array(rows["example_index"], np.int64),
          "token_to_orig": np.array(rows["token_to_orig"], np.int32).reshape(-1, max_seq_length),
          "max_context": np.array(rows["max_context"], bool).reshape(-1, max_seq_length),
          "tokens": rows["tokens"], "do_lower_case": _lowercases(tokenizer),
          "strip_accents": getattr(tokenizer, "strip_accents", None),
          "decode": None if tokenizer.kind == "wordpiece" else functools.partial(_decoded, tokenizer)}
  return features, meta


def _window_row(tokenizer, query_ids, sub_tokens, tok_to_orig, answer, spans, span_index, offset,
                max_seq_length) -> dict:
  """One feature row of `featurize`: the question and the context window `spans[span_index]` (its
  sub-tokens from `offset` on), padded to `max_seq_length`, with the answer's positions in it."""
  start, length = spans[span_index]
  window = sub_tokens[start:start + length]
  ids, segments = tokenizer.build_inputs(query_ids, tokenizer.convert_tokens_to_ids(window))
  tokens = tokenizer.convert_ids_to_tokens(ids[:offset]) + window + tokenizer.convert_ids_to_tokens(
      ids[offset + length:])
  to_orig = np.full([max_seq_length], -1, np.int32)
  to_orig[offset:offset + length] = tok_to_orig[start:start + length]
  max_context = np.zeros([max_seq_length], bool)
  max_context[offset:offset + length] = [_is_max_context(spans, span_index, start + i) for i in range(length)]
  inside = answer[0] >= start and answer[1] <= start + length - 1
  positions = (answer[0] - start + offset, answer[1] - start + offset) if inside else (0, 0)
  pad = max_seq_length - len(ids)
  return {"input_ids": ids + [tokenizer.pad_id] * pad, "segment_ids": segments + [0] * pad,
          "input_mask": [1] * len(ids) + [0] * pad, "start_positions": positions[0],
          "end_positions": positions[1], "token_to_orig": to_orig, "max_context": max_context,
          "tokens": tokens}


# ---------------------------------------------------------------------------------------------
# Decoding spans back to text.


def _strip_spaces(text: str) -> tuple[str, dict]:
  chars, ns_to_s = [], {}
  for i, c in enumerate(text):
    if c != " ":
      ns_to_s[len(chars)] = i
      chars.append(c)
  return "".join(chars), ns_to_s


def get_final_text(pred_text: str, orig_text: str, do_lower_case: bool, strip_accents: bool | None = None) -> str:
  """The part of `orig_text` (original words) that `pred_text` (normalised sub-tokens) covers.

  E.g. pred "steve smith", orig "Steve Smith's" -> "Steve Smith". Aligns the two after BERT's basic
  tokenization with spaces removed; falls back to `orig_text` when they cannot be aligned.
  """
  tok_text = " ".join(wordpiece_text.basic_tokenize(orig_text, do_lower_case, strip_accents))
  start = tok_text.find(pred_text)
  if start == -1:
    return orig_text
  end = start + len(pred_text) - 1
  orig_ns, orig_ns_to_s = _strip_spaces(orig_text)
  tok_ns, tok_ns_to_s = _strip_spaces(tok_text)
  if len(orig_ns) != len(tok_ns):
    return orig_text
  tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
  if start not in tok_s_to_ns or end not in tok_s_to_ns:
    return orig_text
  return orig_text[orig_ns_to_s[tok_s_to_ns[start]]:orig_ns_to_s[tok_s_to_ns[end]] + 1]


def span_text(example: SquadExample, meta: dict, feature: int, start: int, end: int) -> str:
  """Original text of sub-tokens start..end (inclusive) of one feature."""
  pieces = meta["tokens"][feature][start:end + 1]
  if meta.get("decode") is None:   # WordPiece, as run_squad
    tok_text = " ".join(" ".join(pieces).replace(" ##", "").replace("##", "").split())
  else:   # the pieces' text, split as get_final_text splits the original
    tok_text = " ".join(wordpiece_text.basic_tokenize(meta["decode"](pieces), meta["do_lower_case"],
                                                    meta.get("strip_accents")))
  to_orig = meta["token_to_orig"][feature]
  orig_text = " ".join(example.doc_tokens[to_orig[start]:to_orig[end] + 1])
  return get_final_text(tok_text, orig_text, meta["do_lower_case"], meta.get("strip_accents"))


def _split_logits(predictions):
  if isinstance(predictions, dict):
    return np.asarray(predictions["start_logits"]), np.asarray(predictions["end_logits"])
  predictions = np.asarray(predictions)  # [N, L, 2], as the head's dense layer
  return predictions[..., 0], predictions[..., 1]


def decode(predictions, examples, meta, n_best_size=20, max_answer_length=30, version="v1.1",
           null_score_diff_threshold=0.0) -> tuple[dict, dict, dict]:
  """(answers {qid: text}, best non-null answers {qid: text}, null score diffs {qid: float})."""
  start_logits, end_logits = _split_logits(predictions)
  by_example = collections.defaultdict(list)
  for f, e in enumerate(meta["example_index"]):
    by_example[int(e)].append(f)
  answers, best_non_null, null_diffs = {}, {}, {}
  for e, ex in enumerate(examples):
    candidates, null_score = [], np.inf
    for f in by_example.get(e, []):
      null_score = min(null_score, start_logits[f, 0] + end_logits[f, 0])
      s = np.argsort(-start_logits[f], kind="stable")[:n_best_size, None]  # [K, 1]
      t = np.argsort(-end_logits[f], kind="stable")[None, :n_best_size]    # [1, K]
      in_context = meta["token_to_orig"][f] >= 0
      ok = (in_context[s] & meta["max_context"][f][s] & in_context[t]  # max context: the start
            & (s <= t) & (t < s + max_answer_length))
      s, t = np.broadcast_arrays(s, t)
      scores = start_logits[f, s] + end_logits[f, t]
      candidates.extend(zip(scores[ok].tolist(), [f] * int(ok.sum()), s[ok].tolist(), t[ok].tolist()))
    candidates.sort(key=lambda c: -c[0])
    best = next(((score, span_text(ex, meta, f, s, t)) for score, f, s, t in candidates), None)
    best = best if best is not None and best[1] else (None, "")
    best_non_null[ex.qas_id] = best[1]
    answers[ex.qas_id] = best[1]
    if version == "v2.0":
      diff = float(null_score - best[0]) if best[0] is not None else np.inf
      null_diffs[ex.qas_id] = diff
      if diff > null_score_diff_threshold:
        answers[ex.qas_id] = ""
  return answers, best_non_null, null_diffs


def decode_opts(task, opts) -> dict:
  """`decode`'s keyword arguments: `opts`, else the task's options, else run_squad.py's defaults."""
  return {"n_best_size": task.option("n_best_size", opts, 20),
          "max_answer_length": task.option("max_answer_length", opts, 30),
          "version": task.option("version", opts, "v1.1"),
          "null_score_diff_threshold": task.option("null_score_diff_threshold", opts, 0.0)}


def best_null_threshold(answers: dict, null_diffs: dict, scores: dict, has_answer: dict) -> tuple[float, float]:
  """(best mean score, threshold) over no-answer thresholds, as `find_best_thresh` of the official v2.0
  script given what `write_predictions` writes: the answers at `null_score_diff_threshold` and their null
  score diffs. `scores` and `has_answer` are `metrics.squad_raw_scores`' of those answers. Starting from
  "" everywhere, the questions in the order of their diffs take their written answer in turn; a question
  whose written answer is already "" gains nothing (the best non-null span is not tried)."""
  score = best = float(sum(not h for h in has_answer.values()))
  threshold = 0.0
  for q in sorted(answers, key=lambda q: null_diffs[q]):
    score += scores[q] if has_answer[q] else (-1.0 if answers[q] else 0.0)
    if score > best:
      best, threshold = score, null_diffs[q]
  return best / max(len(answers), 1), float(threshold)


def evaluate(task, predictions, examples, meta, **opts) -> dict:
  """Official EM/F1; for v2.0 also HasAns/NoAns splits and the best no-answer threshold on this set."""
  options = decode_opts(task, opts)
  answers, _, null_diffs = decode(predictions, examples, meta, **options)
  gold = {ex.qas_id: list(ex.answers) for ex in examples}
  version = options["version"]
  result = metrics.squad_scores(answers, gold, version)
  if version == "v2.0":
    exact, f1, has_answer = metrics.squad_raw_scores(answers, gold, version)
    result["best_f1"], result["best_f1_threshold"] = best_null_threshold(answers, null_diffs, f1, has_answer)
    result["best_exact_match"], result["best_exact_match_threshold"] = best_null_threshold(
        answers, null_diffs, exact, has_answer)
  return result


def write_predictions(task, path, predictions, examples, meta, **opts) -> None:
  """predictions JSON {qid: text}; for v2.0 also `<path stem>_null_odds.json` {qid: null score diff}."""
  options = decode_opts(task, opts)
  answers, _, null_diffs = decode(predictions, examples, meta, **options)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(answers, f, indent=2, ensure_ascii=False)
  if options["version"] == "v2.0":
    with open(os.path.splitext(path)[0] + "_null_odds.json", "w", encoding="utf-8") as f:
      json.dump(null_diffs, f, indent=2)
