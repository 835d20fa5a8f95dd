"""Dynamic masked-LM masking of whole batches with vectorised numpy.

Four schemes choose what to predict: single tokens (Devlin et al. 2019, 3.1), whole words (the
google-research/bert `--do_whole_word_mask` update), SpanBERT spans (Joshi et al. 2020, 3.1) and
ALBERT n-grams (Lan et al. 2019, 4.1). `span_boundaries` gives the inputs of SpanBERT's span
boundary objective for the chosen tokens of any scheme.
Chosen tokens become [MASK], a random token or stay themselves (80/10/10 by default). By default
the choices are those of google-research/bert `create_masked_lm_predictions`: any real token but
[CLS] and [SEP] may be chosen ([UNK] too, and a [MASK] or [PAD] id found in the text is an ordinary
token), round(real tokens * masked_lm_prob) of them, and random replacements come from the whole
vocabulary.

Randomness is counter-based: every draw is a hash of a per-example key (`example_keys`) and a
(stream, index) counter, so an example's mask depends only on (seed, epoch, host, example index),
not on the batch it lands in nor on the state of any generator.
"""

import dataclasses

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
# Streams: independent counters under one example key.
_CHOICE, _ACTION, _RANDOM_ID, _SPAN_LENGTH, _SPAN_ANCHOR = range(5)
_BLOCK = 32  # span rounds whose random draws are made at once


def _mix(z: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: a bijective, well-mixing hash of uint64 values."""
  z = (z ^ (z >> np.uint64(30))) * _M1
  z = (z ^ (z >> np.uint64(27))) * _M2
  return z ^ (z >> np.uint64(31))


def example_keys(*ids) -> np.ndarray:
  """uint64 keys hashing integer ids (scalars or arrays, broadcast), e.g. (seed, epoch, host, index)."""
  with np.errstate(over="ignore"):
    key = np.uint64(0x2545F4914F6CDD1D)
    for x in ids:
      key = _mix(key + _GOLDEN * (np.asarray(x).astype(np.uint64) + np.uint64(1)))
    return np.atleast_1d(key)


def uniform(keys: np.ndarray, stream: int, width: int, offset: int = 0) -> np.ndarray:
  """float64 [n, width] in [0, 1): draws `offset + j` of `stream` for each key."""
  counters = np.arange(offset, offset + width, dtype=np.uint64) + np.uint64(stream << 32)
  with np.errstate(over="ignore"):
    bits = _mix(keys[:, None] ^ _mix(counters * _GOLDEN + _GOLDEN))
  return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


BUDGETS = ("all_tokens", "maskable_tokens")
# Where a "random token" replacement comes from: any id (google-research/bert), the non-special ids (earlier
# runs), or the example's own tokens ("input": SpanBERT's code draws from the corpus' token stream, the
# input distribution; a row's tokens are its sample of it, and keep masks independent of batch layout).
RANDOM_TOKEN_POOLS = ("vocab", "non_special", "input")
# The data config's switch for each scheme but "token" (the default).
SCHEME_SWITCHES = {"word": "whole_word_masking", "span": "span_masking", "ngram": "ngram_masking"}


def config_problems(data_config) -> list[str]:
  """What is wrong with the data config's masking fields (none: []): `run_checks.validate` says it before a
  run compiles anything, `MaskingSpec.from_config` refuses it."""
  c = data_config
  problems = []
  if c.masking_budget not in BUDGETS:
    problems.append(f"data.masking_budget must be one of {BUDGETS}, got {c.masking_budget!r}")
  if c.random_token_pool not in RANDOM_TOKEN_POOLS:
    problems.append(f"data.random_token_pool must be one of {RANDOM_TOKEN_POOLS}, got {c.random_token_pool!r}")
  if len(schemes := [scheme for scheme, switch in SCHEME_SWITCHES.items() if c[switch]]) > 1:
    problems.append(f"set at most one of data.{', data.'.join(SCHEME_SWITCHES.values())}; got {schemes}")
  return problems


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
  """What `mask_batch` needs: the config's masking fields and the tokenizer's ids.

  The defaults of `MaskingSpec.from_config` are google-research/bert's `create_masked_lm_predictions`;
  docs/fidelity.md lists the switches that depart from it.
  """
  mask_id: int
  never_mask: np.ndarray        # bool [vocab]: never chosen; the reference: [CLS] and [SEP] only
  word_start: np.ndarray        # bool [vocab]: token begins a word
  random_ids: np.ndarray        # int32: the pool of "random token" replacements
  random_from_input: bool = False   # replacements drawn from the row's own candidate tokens instead
  masked_lm_prob: float = 0.15
  max_predictions: int = 20
  mask_token_prob: float = 0.8  # 80/10/10 as in Devlin et al. 2019, 3.1
  random_token_prob: float = 0.1
  scheme: str = "token"         # "token" | "word" | "span" | "ngram"
  span_p: float = 0.2           # SpanBERT: span length in words ~ Geo(0.2) truncated at 10
  span_max_length: int = 10
  ngram_max_length: int = 3     # ALBERT: n-grams of 1..3 words, p(n) proportional to 1/n
  budget: str = "all_tokens"    # BUDGETS: what round(n * masked_lm_prob) counts

  @classmethod
  def from_config(cls, data_config, tokenizer) -> "MaskingSpec":
    """From the data config's masking fields and the tokenizer's special ids and word starts."""
    c = data_config
    if problems := config_problems(c):
      raise ValueError("; ".join(problems))
    is_special = np.zeros(tokenizer.vocab_size, bool)
    is_special[np.asarray(tokenizer.special_ids)] = True
    never_mask = np.zeros_like(is_special)
    never_mask[[tokenizer.cls_id, tokenizer.sep_id]] = True
    schemes = [scheme for scheme, switch in SCHEME_SWITCHES.items() if c[switch]]
    pool = np.arange(tokenizer.vocab_size) if c.random_token_pool == "vocab" else np.flatnonzero(~is_special)
    scheme = schemes[0] if schemes else "token"
    return cls(mask_id=tokenizer.mask_id, never_mask=never_mask if c.mask_unk else is_special,
               word_start=np.asarray(tokenizer.word_start_table(), bool), random_ids=pool.astype(np.int32),
               random_from_input=c.random_token_pool == "input",
               masked_lm_prob=c.masked_lm_prob, max_predictions=c.max_predictions_per_seq,
               mask_token_prob=c.mask_token_prob, random_token_prob=c.random_token_prob, scheme=scheme,
               span_p=c.span_p, span_max_length=c.span_max_length, budget=c.masking_budget)


def prediction_budget(input_ids: np.ndarray, input_mask: np.ndarray, spec: MaskingSpec) -> np.ndarray:
  """Tokens to predict per row: google-research/bert's `num_to_predict`,
  min(max_predictions, max(1, round(len(tokens) * masked_lm_prob))), where `tokens` counts every
  real token, [CLS] and [SEP] included; 0 where nothing can be chosen.

  Each row is one example (the pipeline masks before packing), so the budget is per example.
  With `budget="maskable_tokens"` only the tokens that may be chosen are counted.
  """
  real = input_mask.astype(bool)
  candidates = real & ~spec.never_mask[input_ids]
  n_candidates = candidates.sum(1)
  counted = real.sum(1) if spec.budget == "all_tokens" else n_candidates
  # np.rint rounds half to even, as Python's round() in the reference.
  budget = np.minimum(spec.max_predictions, np.maximum(1, np.rint(counted * spec.masked_lm_prob)))
  return np.where(n_candidates > 0, budget, 0).astype(np.int64)


def mask_batch(input_ids: np.ndarray, input_mask: np.ndarray, keys: np.ndarray, spec: MaskingSpec):
  """Chooses and corrupts the tokens to predict in each row (one example per row).

  Args:
    input_ids, input_mask: int [n, L].
    keys: uint64 [n], one per example (`example_keys`).
    spec: the masking scheme.

  Returns:
    (corrupted input_ids int32 [n, L], is_masked bool [n, L]); at most `max_predictions` per row.
  """
  candidates = input_mask.astype(bool) & ~spec.never_mask[input_ids]
  budget = prediction_budget(input_ids, input_mask, spec)
  length = input_ids.shape[1]
  if spec.scheme == "token":
    is_masked = _choose_tokens(candidates, budget, keys, spec.max_predictions)
    action_u = uniform(keys, _ACTION, length)  # one 80/10/10 draw per token
  else:
    word_id, word_len = _words(input_ids, candidates, spec.word_start)
    word_index = np.maximum(word_id, 0)
    if spec.scheme in ("word", "ngram"):
      word_taken = (_choose_words(word_len, budget, keys) if spec.scheme == "word"
                    else _choose_ngrams(word_len, budget, keys, spec.ngram_max_length)[0])
      action_u = uniform(keys, _ACTION, length)  # per token, as google-research/bert and /albert
    else:
      word_taken, span_of_word = _choose_spans(word_len, budget, keys, spec)
      span_id = np.take_along_axis(span_of_word, word_index, 1)  # per span, as SpanBERT
      action_u = np.take_along_axis(uniform(keys, _ACTION, int(span_id.max()) + 1), span_id, 1)
    is_masked = candidates & np.take_along_axis(word_taken, word_index, 1)
  return _corrupt(input_ids, is_masked, action_u, keys, spec, candidates), is_masked


def _choose_tokens(candidates, budget, keys, max_predictions):
  """`budget[i]` candidate positions of row i, uniformly without replacement."""
  n, length = candidates.shape
  scores = np.where(candidates, uniform(keys, _CHOICE, length), 2.0)
  k = min(max_predictions, length)
  first = np.argpartition(scores, k - 1, axis=1)[:, :k] if k < length else np.argsort(scores, 1)
  first = np.take_along_axis(first, np.argsort(np.take_along_axis(scores, first, 1), 1), 1)
  chosen = np.arange(first.shape[1])[None, :] < budget[:, None]
  is_masked = np.zeros((n, length), bool)
  np.put_along_axis(is_masked, first, chosen, 1)
  return is_masked & candidates


def _words(input_ids, candidates, word_start):
  """Word index of every candidate token (-1 elsewhere) and word lengths [n, L] by word index.

  A word starts at a word-start token or after a non-candidate ([CLS], [SEP]), so words never
  cross segments and continuation pieces always join the word they continue.
  """
  n, length = candidates.shape
  previous = np.zeros_like(candidates)
  previous[:, 1:] = candidates[:, :-1]
  starts = candidates & (word_start[input_ids] | ~previous)
  word_id = np.where(candidates, np.cumsum(starts, 1) - 1, -1)
  rows = np.broadcast_to(np.arange(n)[:, None], (n, length))
  flat = (rows * length + word_id)[candidates]
  word_len = np.bincount(flat, minlength=n * length).reshape(n, length)
  return word_id, word_len


def _choose_words(word_len, budget, keys):
  """Whole words in random order, each taken if it still fits the budget (google-research/bert).

  The greedy scan runs as rounds over all rows at once: a round takes the longest prefix of the
  words that still fit; a word that no longer fits never will, so rounds reproduce the scan.
  """
  n, width = word_len.shape
  order = np.argsort(np.where(word_len > 0, uniform(keys, _CHOICE, width), 2.0), 1)
  lengths = np.take_along_axis(word_len, order, 1)
  taken = np.zeros((n, width), bool)
  remaining = budget.copy()
  while True:
    fits = ~taken & (lengths > 0) & (lengths <= remaining[:, None])
    cumulative = np.cumsum(np.where(fits, lengths, 0), 1)
    take = fits & (cumulative <= remaining[:, None])
    if not take.any():
      break
    taken |= take
    remaining -= np.where(take, lengths, 0).sum(1)
  word_taken = np.zeros((n, width), bool)
  np.put_along_axis(word_taken, order, taken, 1)
  return word_taken


def span_lengths(u: np.ndarray, p: float, max_length: int) -> np.ndarray:
  """Inverse CDF of Geo(p) on 1..max_length, renormalised as in SpanBERT's code (mean 3.8 at 0.2, 10)."""
  q = 1.0 - p
  scaled = u * (1.0 - q ** max_length)
  return np.clip(np.ceil(np.log1p(-scaled) / np.log(q)), 1, max_length).astype(np.int64)


def _choose_spans(word_len, budget, keys, spec):
  """SpanBERT: repeatedly a span length (in words) and a random starting point not yet masked.

  The starting point is a token drawn uniformly, taken back to its word's start, as SpanBERT's code
  (`PairWithSpanMaskingScheme.mask`: `np.random.choice(sent_length)`, then `get_word_start`): a word of
  three pieces starts a span three times as often as a word of one. A span takes its free words in order
  while they fit the budget (never part of a word). Returns the taken words and, per word, the round
  (span) that took it, for the per-span 80/10/10 decision.
  """
  n_tokens = word_len.sum(1)[:, None]
  ends = np.cumsum(word_len, 1)   # [n, words]: the token after each word

  def draw(r):
    token = (uniform(keys, _SPAN_ANCHOR, _BLOCK, offset=r) * n_tokens).astype(np.int64)
    token = np.minimum(token, np.maximum(n_tokens - 1, 0))
    anchor = (ends[:, None, :] <= token[..., None]).sum(-1)   # the word holding the token
    length = span_lengths(uniform(keys, _SPAN_LENGTH, _BLOCK, offset=r), spec.span_p, spec.span_max_length)
    return anchor, length

  max_rounds = 8 * spec.max_predictions + 64  # it ends far sooner
  return _grow_spans(word_len, budget, draw, spec.span_max_length, max_rounds, drop_overlapping=False)


def ngram_lengths(u: np.ndarray, max_n: int) -> np.ndarray:
  """Inverse CDF of p(n) = (1/n) / sum_k 1/k on 1..max_n (ALBERT, Lan et al. 2019, 4.1)."""
  cdf = np.cumsum(1.0 / np.arange(1, max_n + 1))
  return np.minimum(np.searchsorted(cdf / cdf[-1], u, side="right") + 1, max_n).astype(np.int64)


def _choose_ngrams(word_len, budget, keys, max_n):
  """ALBERT n-grams: google-research/albert `create_masked_lm_predictions` (`ngram=3`,
  `favor_shorter_ngram=True`, `do_whole_word_mask=True`), which this follows step by step.

  Every word is an n-gram start once, in a random order (the shuffled `ngram_indexes`). At each
  start n ~ p(n) (`ngram_lengths`); the n-gram is the next n words, fewer at the row's last word;
  while it overflows the budget it is shortened word by word, and it is skipped when even its
  first word does not fit or when any of its words is already taken: n-grams never overlap (the
  reference's first "covered" check is a no-op; only the check after shortening acts). Words are
  counted across [SEP], as the reference's candidate list skips [CLS] and [SEP], so an n-gram may
  end a segment and begin the next. Returns what `_choose_spans` returns.
  """
  n, width = word_len.shape
  order = np.argsort(np.where(word_len > 0, uniform(keys, _CHOICE, width), 2.0), 1)
  order = np.pad(order, ((0, 0), (0, _BLOCK)), constant_values=width)  # past the last word: no word

  def draw(r):
    return order[:, r:r + _BLOCK], ngram_lengths(uniform(keys, _SPAN_LENGTH, _BLOCK, offset=r), max_n)

  max_rounds = int((word_len > 0).sum(1).max(initial=0))  # one round per start
  return _grow_spans(word_len, budget, draw, max_n, max_rounds, drop_overlapping=True)


def _grow_spans(word_len, budget, draw, max_len, max_rounds, drop_overlapping):
  """One span per row and round: from word anchor[r] over length[r] words, where `draw(r)` gives the
  [n, _BLOCK] anchors and lengths of rounds r.., keeping the longest prefix that fits the budget.

  A word already taken is passed over from a free anchor (SpanBERT), or, with `drop_overlapping`,
  the span is dropped whole (ALBERT). Each round looks only at the `max_len` words after each
  row's anchor. Returns the taken words [n, W] and, per word, the round that took it.
  """
  n, width = word_len.shape
  rows, window = np.arange(n)[:, None], np.arange(max_len)[None, :]
  lengths = np.zeros((n, width + max_len), word_len.dtype)  # padded: windows never run off
  lengths[:, :width] = word_len
  taken = np.zeros(lengths.shape, bool)
  span_of_word = np.zeros(lengths.shape, np.int64)
  remaining = budget.copy()
  for r in range(max_rounds):
    if r % _BLOCK == 0:
      anchor, span = draw(r)
    if r % 8 == 0:  # rows where some free word still fits; stale for at most 7 rounds
      active = (~taken & (lengths > 0) & (lengths <= remaining[:, None])).any(1)
      if not active.any():
        break
    cols = anchor[:, r % _BLOCK, None] + window
    lens, was_taken = lengths[rows, cols], taken[rows, cols]
    in_span = (lens > 0) & (window < span[:, r % _BLOCK, None]) & active[:, None]
    if not drop_overlapping:
      in_span &= ~was_taken & ~was_taken[:, :1]
    take = in_span & (np.cumsum(np.where(in_span, lens, 0), 1) <= remaining[:, None])
    if drop_overlapping:
      take &= ~(take & was_taken).any(1, keepdims=True)
    taken[rows, cols] = was_taken | take
    span_of_word[rows, cols] = np.where(take, r, span_of_word[rows, cols])
    remaining -= np.where(take, lens, 0).sum(1)
  return taken[:, :width], span_of_word[:, :width]


def _corrupt(input_ids, is_masked, action_u, keys, spec, candidates):
  """80% [MASK], 10% a random token, 10% unchanged (the proportions come from `spec`)."""
  pool, u = spec.random_ids, uniform(keys, _RANDOM_ID, input_ids.shape[1])
  random_ids = pool[(u * len(pool)).astype(np.int64)]
  if spec.random_from_input:   # the k-th of the row's candidate tokens, k uniform
    count = candidates.sum(1, keepdims=True)
    order = np.argsort(~candidates, axis=1, kind="stable")   # the candidates first, in order
    k = np.minimum((u * count).astype(np.int64), input_ids.shape[1] - 1)
    own = np.take_along_axis(input_ids, np.take_along_axis(order, k, 1), 1)
    random_ids = np.where(count > 0, own, random_ids)
  to_mask = is_masked & (action_u < spec.mask_token_prob)
  to_random = is_masked & ~to_mask & (action_u < spec.mask_token_prob + spec.random_token_prob)
  out = np.where(to_mask, spec.mask_id, input_ids)
  return np.where(to_random, random_ids, out).astype(np.int32)


def gather_predictions(input_ids, original_ids, is_masked, max_predictions: int) -> dict:
  """Batch fields of the masked-LM targets, keeping at most `max_predictions` per row.

  Packed rows may hold more chosen tokens than the cap; the extra ones are restored.
  """
  n = is_masked.shape[0]
  rank = np.cumsum(is_masked, 1) - 1
  overflow = is_masked & (rank >= max_predictions)
  if overflow.any():
    input_ids = np.where(overflow, original_ids, input_ids)
    is_masked = is_masked & ~overflow
  rows, cols = np.nonzero(is_masked)
  slots = rank[rows, cols]
  positions = np.zeros((n, max_predictions), np.int32)
  ids = np.zeros((n, max_predictions), np.int32)
  weights = np.zeros((n, max_predictions), np.float32)
  positions[rows, slots] = cols
  ids[rows, slots] = original_ids[rows, cols]
  weights[rows, slots] = 1.0
  return {"input_ids": input_ids.astype(np.int32), "masked_lm_positions": positions,
          "masked_lm_ids": ids, "masked_lm_weights": weights}


def span_boundaries(masked_lm_positions, masked_lm_weights, input_mask, max_offset: int, edges=None) -> dict:
  """Inputs of SpanBERT's span boundary objective (Joshi et al. 2020, 3.2) for each prediction slot.

  A token x_i of the span x_s..x_e is predicted from the encoder outputs at s - 1 and e + 1 and an
  embedding of i - s. A span here is a maximal run of contiguous predicted positions (the slots with
  weight > 0 of `gather_predictions`, so after its cap): two chosen spans that touch merge into one,
  as the release's `merge_intervals` merges them, and the tokens of any scheme form such runs.

  As the release's `span_masking` with `--endpoints external` (the pretraining command's), a span has
  boundary targets only where both neighbours are tokens of its text: the release masks a block before
  it adds [CLS] and [SEP] and leaves out every span that starts at the block's first token or ends at its
  last. Here a span whose s - 1 or e + 1 is one of `edges` (bool [B, L]: the rows' [CLS] and [SEP]),
  padding or outside the row gets `masked_lm_span_weights` 0; its tokens are still MLM predictions.

  Args:
    masked_lm_positions, masked_lm_weights: [B, P], as `gather_predictions` returns them.
    input_mask: int [B, L].
    max_offset: i - s is clipped to it (a relative position table of max_offset + 1 rows).
    edges: bool [B, L], positions that are no boundary target; None: none but padding and the row's ends.

  Returns:
    int32 [B, P] `masked_lm_span_left` (s - 1), `masked_lm_span_right` (e + 1) and
    `masked_lm_span_offset` (i - s), both boundaries clipped into the row; float32 [B, P]
    `masked_lm_span_weights`, 1 where the span has both boundaries. All 0 in padding slots.
  """
  n, length = input_mask.shape
  valid = masked_lm_weights > 0
  is_masked = np.zeros((n, length), bool)
  is_masked[np.nonzero(valid)[0], masked_lm_positions[valid]] = True
  j = np.arange(length)
  before = np.maximum.accumulate(np.where(is_masked, -1, j), 1)  # last unmasked position <= j, or -1
  after = np.minimum.accumulate(np.where(is_masked, length, j)[:, ::-1], 1)[:, ::-1]  # first >= j, or L
  left = np.take_along_axis(before, masked_lm_positions, 1)
  right = np.take_along_axis(after, masked_lm_positions, 1)
  left_in, right_in = np.maximum(left, 0), np.minimum(right, length - 1)
  target = input_mask > 0 if edges is None else (input_mask > 0) & ~edges
  has_both = ((left >= 0) & (right < length) & np.take_along_axis(target, left_in, 1)
              & np.take_along_axis(target, right_in, 1))
  out = {"masked_lm_span_left": left_in, "masked_lm_span_right": right_in,
         "masked_lm_span_offset": np.minimum(masked_lm_positions - left - 1, max_offset)}
  out = {name: np.where(valid, value, 0).astype(np.int32) for name, value in out.items()}
  out["masked_lm_span_weights"] = (valid & has_both).astype(np.float32)
  return out
