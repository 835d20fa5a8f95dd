"""Training instances: which token ranges form each sequence (planned per epoch), then the rows.

A host's documents live in three flat arrays (`Documents`). Planning walks sentences, not tokens:
  * "nsp": google-research/bert `create_instances_from_document`: a target length (shorter with
    probability `short_seq_prob`), a chunk of sentences split into A and B, B replaced with 50%
    by a random stretch of another document (the unused sentences are put back), and random
    front/back truncation of the longer segment. Two deliberate differences: the target is redrawn
    for every instance (not once per document), so about `short_seq_prob` of all instances are
    short; and a one-sentence chunk is split inside its sentence instead of always getting a
    random B, which skewed the original's labels to ~54% NotNext on news articles.
  * "sop": ALBERT's sentence-order prediction (Lan et al. 2020, 4.2): B always follows A in the
    document; with 50% they are swapped (label 1). A one-sentence chunk is split inside it too.
  * "sentence_pair": RoBERTa's SENTENCE-PAIR (Liu et al. 2019, 4.2): A is one natural sentence, B the
    sentence after it in its document or, with 50% (label 1), a sentence of another document; the
    sentence B did not use starts the next pair. A document's last sentence starts no pair (it has no
    next to draw against), so the labels stay balanced. Rows are short: no target length applies.
  * "full_sentences" / "doc_sentences": RoBERTa (Liu et al. 2019, 4.2): whole sentences up to the
    target length, one segment, no sentence objective; FULL crosses documents with a [SEP] between.
  * "doc_segments": ELECTRA's `build_pretraining_dataset.py` (`ExampleBuilder`): a document's sentences
    until they reach the target length (the sequence length; with probability `short_seq_prob` a length
    drawn from 5..seq_length), never across documents; 10% of rows one segment, the others A and B
    split near half (`(target - 3) // 2`: A takes a sentence while it stays under, and the sentence
    that would take it over with 50% while B is empty), no label; A cut to the row, B to what is left
    (from the back). One difference: a sentence after the first one B takes goes to B too (the
    reference lets a later short sentence back into A, out of the text's order).
Everything else (building rows, packing) is vectorised numpy over whole batches.
"""

import dataclasses

import numpy as np

SENTENCE_FORMATS = ("nsp", "sop", "sentence_pair")       # two segments and a sentence label per row
SINGLE_FORMATS = ("full_sentences", "doc_sentences")     # one segment per row (Liu et al. 2019, 4.2)
UNLABELLED_PAIR_FORMATS = ("doc_segments",)               # one or two segments, no sentence label (ELECTRA)
FORMATS = SENTENCE_FORMATS + SINGLE_FORMATS + UNLABELLED_PAIR_FORMATS


@dataclasses.dataclass(frozen=True)
class Documents:
  """Documents of one host: sentences back to back in one token array."""
  tokens: np.ndarray           # int32 [T]
  sentence_starts: np.ndarray  # int64 [S + 1]: token offset of each sentence, then T
  doc_starts: np.ndarray       # int64 [D + 1]: index of each document's first sentence, then S

  @property
  def num_documents(self) -> int:
    """Number of documents D."""
    return len(self.doc_starts) - 1

  def document_of(self, token_offsets: np.ndarray) -> np.ndarray:
    """Index of the document holding each token offset."""
    return np.searchsorted(self.sentence_starts[self.doc_starts], token_offsets, "right") - 1

  def joined(self, separator_id: int) -> "Documents":
    """One document: all of them, with a one-token separator sentence between two documents."""
    n_docs = self.num_documents
    lengths = np.diff(self.sentence_starts)
    doc_of_sentence = np.repeat(np.arange(n_docs), np.diff(self.doc_starts))
    # Sentence i moves down by the number of separators before it (one per earlier document).
    new_index = np.arange(len(lengths)) + doc_of_sentence
    sep_index = self.doc_starts[1:-1] + np.arange(n_docs - 1)
    new_lengths = np.ones(len(lengths) + n_docs - 1, np.int64)
    new_lengths[new_index] = lengths
    starts = np.concatenate([[0], np.cumsum(new_lengths)])
    tokens = np.empty(starts[-1], np.int32)
    tokens[starts[sep_index]] = separator_id
    is_real = np.ones(starts[-1], bool)
    is_real[starts[sep_index]] = False
    tokens[is_real] = self.tokens
    return Documents(tokens, starts, np.array([0, len(new_lengths)], np.int64))


@dataclasses.dataclass(frozen=True)
class Instances:
  """Planned instances: token ranges of A and B after truncation (b_len 0: no B) and labels.

  `target` is the length the instance was planned for; `a_chunk`/`b_chunk` [N, 2] keep the
  untruncated ranges (to check the pairing).
  """
  a_start: np.ndarray
  a_len: np.ndarray
  b_start: np.ndarray
  b_len: np.ndarray
  label: np.ndarray
  target: np.ndarray
  a_chunk: np.ndarray
  b_chunk: np.ndarray

  def __len__(self) -> int:
    return len(self.a_start)

  def take(self, index) -> "Instances":
    """The instances at `index` (an index array or a boolean mask)."""
    return Instances(**{f.name: getattr(self, f.name)[index] for f in dataclasses.fields(self)})

  def lengths(self) -> np.ndarray:
    """Row length of each instance: [CLS] A [SEP] (B [SEP])."""
    return 2 + self.a_len + np.where(self.b_len > 0, self.b_len + 1, 0)


def min_documents(fmt: str) -> int:
  """The fewest documents a host's share of a split needs in format `fmt`: a random next sentence
  ("nsp", "sentence_pair") comes from another document."""
  return 2 if fmt in ("nsp", "sentence_pair") else 1


def plan(docs: Documents, fmt: str, seq_length: int, short_seq_prob: float,
         rng: np.random.Generator, separator_id: int | None = None) -> Instances:
  """All instances of one epoch over `docs`.

  For "full_sentences" pass `docs.joined(sep_id)` and `separator_id=sep_id`.
  """
  if fmt not in FORMATS:
    raise ValueError(f"data format {fmt!r} is not one of {FORMATS}")
  two_segments = fmt in SENTENCE_FORMATS
  max_tokens = seq_length - (3 if two_segments else 2)  # room for [CLS], [SEP] (and [SEP])
  bound = len(docs.sentence_starts)  # every instance consumes at least one sentence
  targets = np.full(bound, max_tokens, np.int64)
  short = rng.random(bound) < short_seq_prob
  targets[short] = rng.integers(2, max_tokens, bound, endpoint=True)[short]
  if fmt == "sentence_pair":
    return _plan_sentence_pairs(docs, max_tokens, rng)
  if fmt == "doc_segments":
    return _plan_doc_segments(docs, seq_length, short_seq_prob, rng)
  if two_segments:
    return _plan_pairs(docs, fmt, targets, max_tokens, rng)
  return _plan_single(docs, targets, max_tokens, rng, separator_id)


def _pair_chunks(docs, fmt, targets, split_u, label_u):
  """The sequential walk of `create_instances_from_document`, over sentences of every document."""
  lengths = np.diff(docs.sentence_starts).tolist()
  doc_starts = docs.doc_starts.tolist()
  targets, split_u, label_u = targets.tolist(), split_u.tolist(), label_u.tolist()
  first, a_end, end, label, doc = [], [], [], [], []
  k = 0
  for d in range(len(doc_starts) - 1):
    start = i = doc_starts[d]
    stop, current = doc_starts[d + 1], 0
    while i < stop:
      current += lengths[i]
      if i == stop - 1 or current >= targets[k]:
        n = i + 1 - start
        split = start + 1 + (int(split_u[k] * (n - 1)) if n >= 2 else 0)
        swap = label_u[k] < 0.5
        random_next = fmt == "nsp" and (swap or (n == 1 and lengths[start] < 2))
        first.append(start), a_end.append(split), doc.append(d)
        end.append(split if random_next else i + 1)
        label.append(random_next if fmt == "nsp" else swap)
        if random_next:
          i = split - 1  # the sentences B did not use go back into the document
        k += 1
        start, current = i + 1, 0
      i += 1
  as_array = lambda x: np.array(x, np.int64)  # noqa: E731
  return as_array(first), as_array(a_end), as_array(end), as_array(label), as_array(doc)


def _plan_pairs(docs, fmt, targets, max_tokens, rng):
  n_docs = docs.num_documents
  if n_docs < min_documents(fmt):
    raise ValueError(f"data format {fmt!r} needs at least {min_documents(fmt)} document(s) per host")
  bound = len(targets)
  first, a_end, end, label, doc = _pair_chunks(docs, fmt, targets, rng.random(bound), rng.random(bound))
  n = len(first)
  starts = docs.sentence_starts
  a0, a1, b0, b1 = starts[first], starts[a_end], starts[a_end], starts[end]
  single = (end - first == 1) & (label == 0 if fmt == "nsp" else True)
  cut = a0 + 1 + (rng.random(n) * np.maximum(a1 - a0 - 1, 0)).astype(np.int64)
  a1, b0 = np.where(single, cut, a1), np.where(single, cut, b0)
  if fmt == "nsp":
    random_next = label == 1
    other = rng.integers(0, n_docs - 1, n)
    other += other >= doc  # any document but this one
    s_lo, s_hi = docs.doc_starts[other], docs.doc_starts[other + 1]
    r0 = s_lo + (rng.random(n) * (s_hi - s_lo)).astype(np.int64)
    # B: sentences from r0 until it reaches the target left over by A (at least one sentence).
    want = np.maximum(targets[:n] - (a1 - a0), 0)
    r1 = np.clip(np.searchsorted(starts, starts[r0] + want, "left"), r0 + 1, s_hi)
    b0, b1 = np.where(random_next, starts[r0], b0), np.where(random_next, starts[r1], b1)
  else:  # sop: swapped with 50% (a one-token chunk has no B and stays in order)
    label = label * (b1 > b0)
    swap = label == 1
    a0, a1, b0, b1 = (np.where(swap, b0, a0), np.where(swap, b1, a1),
                      np.where(swap, a0, b0), np.where(swap, a1, b1))
  return _truncated(a0, a1, b0, b1, label, targets[:n], max_tokens, rng)


def _plan_sentence_pairs(docs, max_tokens, rng):
  """One sentence and the next (label 0) or, with 50%, a sentence of another document (label 1)."""
  n_docs = docs.num_documents
  if n_docs < min_documents("sentence_pair"):
    raise ValueError("sentence pairs need at least two documents per host (for the random sentences)")
  starts = docs.sentence_starts
  doc_starts = docs.doc_starts.tolist()
  random_u = rng.random(len(starts) - 1).tolist()   # at most one draw per sentence
  first, label, doc = [], [], []
  k = 0
  for d in range(n_docs):
    i, stop = doc_starts[d], doc_starts[d + 1]
    while i + 1 < stop:   # a document's last sentence starts no pair: it has no real next, and a random
      # B there alone would tip the labels towards 1 (60% with two sentences a document)
      random_next, k = random_u[k] < 0.5, k + 1
      first.append(i), label.append(int(random_next)), doc.append(d)
      i += 1 if random_next else 2   # the sentence a random B did not use starts the next pair
  first, label, doc = np.array(first, np.int64), np.array(label, np.int64), np.array(doc, np.int64)
  n = len(first)
  other = rng.integers(0, n_docs - 1, n)
  other += other >= doc   # any document but this one
  s_lo, s_hi = docs.doc_starts[other], docs.doc_starts[other + 1]
  b = np.where(label == 1, s_lo + (rng.random(n) * (s_hi - s_lo)).astype(np.int64), first + 1)
  targets = np.full(n, max_tokens, np.int64)
  return _truncated(starts[first], starts[first + 1], starts[b], starts[b + 1], label, targets, max_tokens, rng)


def _plan_single(docs, targets, max_tokens, rng, separator_id):
  """Whole sentences while they fit the target (fairseq's "complete" blocks); no crossing of
  documents except through the separator sentences of `Documents.joined`."""
  lengths = np.diff(docs.sentence_starts).tolist()
  doc_starts = docs.doc_starts.tolist()
  targets_list = targets.tolist()
  first, end = [], []
  for d in range(len(doc_starts) - 1):
    start, current = doc_starts[d], 0
    for i in range(start, doc_starts[d + 1]):
      if current > 0 and current + lengths[i] > targets_list[len(first)]:
        first.append(start), end.append(i)
        start, current = i, 0
      current += lengths[i]
    if doc_starts[d + 1] > start:
      first.append(start), end.append(doc_starts[d + 1])
  first, end = np.array(first, np.int64), np.array(end, np.int64)
  starts = docs.sentence_starts
  if separator_id is not None:  # a chunk never starts or ends with the separator between documents
    is_sep = (np.diff(starts) == 1) & (docs.tokens[np.minimum(starts[:-1], len(docs.tokens) - 1)]
                                       == separator_id)
    first, end = first + is_sep[first], end - is_sep[end - 1]
  chunk = np.flatnonzero(end > first)
  first, end = first[chunk], end[chunk]
  a0, a1 = starts[first], starts[end]
  zeros = np.zeros(len(first), np.int64)
  return _truncated(a0, a1, a1, a1, zeros, targets[chunk], max_tokens, rng)


def _plan_doc_segments(docs, seq_length, short_seq_prob, rng):
  """ELECTRA's `ExampleBuilder.add_line` and `_create_example` (module docstring), over every document."""
  lengths = np.diff(docs.sentence_starts).tolist()
  doc_starts = docs.doc_starts.tolist()
  n = len(lengths)
  short = (rng.random(n + 1) < short_seq_prob).tolist()
  short_target = rng.integers(5, seq_length, n + 1, endpoint=True).tolist()
  one_segment, coin = (rng.random(n + 1) < 0.1).tolist(), (rng.random(n) < 0.5).tolist()
  a0, a1, b0, b1, targets = [], [], [], [], []
  target = seq_length   # the first example's target is the full length, as the reference's
  for d in range(len(doc_starts) - 1):
    start, current = doc_starts[d], 0
    for i in range(doc_starts[d], doc_starts[d + 1]):
      current += lengths[i]
      if current < target and i + 1 < doc_starts[d + 1]:
        continue
      k = len(a0)
      first_target = 100_000 if one_segment[k] else (target - 3) // 2
      first, split = 0, i + 1
      for j in range(start, i + 1):   # A takes sentences in order; the first B takes ends it
        if first == 0 or first + lengths[j] < first_target or (first < first_target and coin[j]):
          first += lengths[j]
        else:
          split = j
          break
      a_len = min(first, seq_length - 2)
      second = sum(lengths[split:i + 1])
      b_len = min(second, max(0, seq_length - a_len - 3))
      s0 = docs.sentence_starts[start]
      a0.append(s0), a1.append(s0 + a_len)
      b0.append(docs.sentence_starts[split]), b1.append(docs.sentence_starts[split] + b_len)
      targets.append(target)
      target = short_target[k] if short[k] else seq_length
      start, current = i + 1, 0
  as_array = lambda x: np.array(x, np.int64)  # noqa: E731
  a0, a1, b0, b1 = as_array(a0), as_array(a1), as_array(b0), as_array(b1)
  return Instances(a_start=a0, a_len=a1 - a0, b_start=b0, b_len=b1 - b0, label=np.zeros(len(a0), np.int32),
                   target=as_array(targets), a_chunk=np.stack([a0, a1], 1), b_chunk=np.stack([b0, b1], 1))


def _truncated(a0, a1, b0, b1, label, target, max_tokens, rng):
  """google-research/bert `truncate_seq_pair`: drop one token at a time from the longer segment
  (B on ties), from its front or back with equal probability, until both fit `max_tokens`."""
  la, lb = a1 - a0, b1 - b0
  excess = np.maximum(la + lb - max_tokens, 0)
  from_a = np.clip(la - lb, 0, excess)        # first the longer one down to the other's length,
  from_b = np.clip(lb - la, 0, excess)
  rest = excess - from_a - from_b              # then alternately, B first
  from_a, from_b = from_a + rest // 2, from_b + rest - rest // 2
  front_a, front_b = rng.binomial(from_a, 0.5), rng.binomial(from_b, 0.5)
  return Instances(a_start=a0 + front_a, a_len=la - from_a, b_start=b0 + front_b, b_len=lb - from_b,
                   label=label.astype(np.int32), target=target, a_chunk=np.stack([a0, a1], 1),
                   b_chunk=np.stack([b0, b1], 1))


def build_rows(tokens: np.ndarray, inst: Instances, seq_length: int, cls_id: int, sep_id: int,
               pad_id: int) -> dict:
  """`[CLS] A [SEP] B [SEP]` rows for every instance: input_ids, input_mask, segment_ids [n, L]."""
  j = np.arange(seq_length)[None, :]
  la, lb = inst.a_len[:, None], inst.b_len[:, None]
  in_a = (j >= 1) & (j <= la)
  in_b = (j >= la + 2) & (j < la + 2 + lb)
  source = np.where(j <= la, inst.a_start[:, None] + j - 1, inst.b_start[:, None] + j - la - 2)
  source = np.clip(source, 0, len(tokens) - 1)
  ids = np.where(in_a | in_b, tokens[source], pad_id)
  ids[:, 0] = cls_id
  is_sep = (j == la + 1) | ((j == la + 2 + lb) & (lb > 0))
  ids = np.where(is_sep, sep_id, ids)
  length = inst.lengths()[:, None]
  return {"input_ids": ids.astype(np.int32), "input_mask": (j < length).astype(np.int32),
          "segment_ids": ((j >= la + 2) & (j < length) & (lb > 0)).astype(np.int32)}


def pack(lengths: np.ndarray, seq_length: int, max_per_row: int) -> np.ndarray:
  """Next-fit packing of instances, in order, into rows; returns row starts [R + 1]."""
  starts, used, count = [0], 0, 0
  for i, n in enumerate(lengths.tolist()):
    if count == max_per_row or used + n > seq_length:
      starts.append(i)
      used = count = 0
    used += n
    count += 1
  starts.append(len(lengths))
  return np.array(starts if len(lengths) else [0], np.int64)


def packed_layout(row_starts: np.ndarray, lengths: np.ndarray):
  """(row, slot, offset) of every instance, given the row starts [R + 1] (from 0) of `pack`."""
  row = np.repeat(np.arange(len(row_starts) - 1), np.diff(row_starts))
  first = row_starts[row]
  begins = np.cumsum(lengths) - lengths
  return row, np.arange(len(lengths)) - first, begins - begins[first]


def scatter_packed(fields: dict, lengths: np.ndarray, row: np.ndarray, slot: np.ndarray,
                   offset: np.ndarray, num_rows: int, seq_length: int) -> dict:
  """Per-instance [n, L] arrays placed into [num_rows, L] rows, plus example and position ids."""
  j = np.arange(seq_length)[None, :]
  valid = j < lengths[:, None]
  target = (row[:, None] * seq_length + offset[:, None] + j)[valid]
  out = {}
  for name, value in fields.items():
    flat = np.zeros(num_rows * seq_length, value.dtype)
    flat[target] = value[valid]
    out[name] = flat.reshape(num_rows, seq_length)
  for name, value in (("position_ids", np.broadcast_to(j, valid.shape)),
                      ("example_ids", np.broadcast_to(slot[:, None] + 1, valid.shape))):
    flat = np.zeros(num_rows * seq_length, np.int32)
    flat[target] = value[valid]
    out[name] = flat.reshape(num_rows, seq_length)
  return out
