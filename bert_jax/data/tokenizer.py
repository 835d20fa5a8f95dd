"""The WordPiece tokenizer, what every tokenizer shares (the special tokens, the input layout); `load_tokenizer`.

WordPiece follows google-research/bert `tokenization.py` and Hugging Face `BertTokenizer` exactly;
bert_jax/data/wordpiece_text.py states those rules in plain Python (`tokenize`, `encode`); `encode_batch` runs
them through `tensorflow_text.FastBertTokenizer` (LinMaxMatch, Song et al. 2021), after cheap rewrites where
the two would differ (`wordpiece_text.fast_form`); the rare text it cannot rewrite takes the Python path.
Tests hold both paths to Hugging Face's ids and to each other.
SentencePiece (preprocessing text as Hugging Face's `AlbertTokenizer`) lives in
`bert_jax.data.sentencepiece_tokenizer`, byte-level BPE (RoBERTa) in `bert_jax.data.bpe`, a Hugging Face
tokenizer.json in `bert_jax.data.tokenizer_json`. Vocabularies are trained by `bert_jax.data.vocab_training`.

    tok = load_tokenizer("vocab.txt")   # or "spm.model", "vocab.json" (+ merges.txt), "tokenizer.json", a directory
    ids, segment_ids = tok.encode_pair("A b.", "C d.", max_length=128)
"""

import json
import os
import shutil
import tempfile
import unicodedata
from typing import Iterable, Sequence

import numpy as np

from bert_jax import host_env
from bert_jax.data import wordpiece_text

# The one place special tokens are named; every model and pipeline stage resolves ids through it.
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
# SentencePiece models trained elsewhere (ALBERT, T5-style) spell pad/unk differently.
_SPECIAL_ALIASES = {PAD: ("[PAD]", "<pad>"), UNK: ("[UNK]", "<unk>"), CLS: ("[CLS]",),
                    SEP: ("[SEP]",), MASK: ("[MASK]", "<mask>")}
VOCAB_FILE, SPM_FILE = "vocab.txt", "spm.model"
BPE_VOCAB_FILE, MERGES_FILE = "vocab.json", "merges.txt"  # byte-level BPE, as Hugging Face names them
TOKENIZER_CONFIG = "tokenizer_config.json"  # Hugging Face's settings beside the vocabulary
TOKENIZER_JSON = "tokenizer.json"  # a Hugging Face fast tokenizer, read by `bert_jax.data.tokenizer_json`


def _resolve_special_ids(lookup, aliases_of: dict) -> dict:
  """{token: id} for the five specials; `lookup(piece)` returns an id or None."""
  ids = {}
  for token, aliases in aliases_of.items():
    found = [i for i in (lookup(a) for a in aliases) if i is not None]
    if not found:
      raise ValueError(f"vocabulary has no {token} (tried {aliases})")
    ids[token] = found[0]
  return ids


class _Tokenizer:
  """What every tokenizer shares: special ids, the input layout, pairs, the word-start table."""

  kind: str  # "wordpiece", "sentencepiece", "byte_bpe" or "tokenizer_json": what `prepare` records
  vocab_size: int
  do_lower_case: bool
  # Put before a piece of running text that follows a space when it is encoded alone (a document's later
  # sentences in `prepare`, a SQuAD context's words), so that it is spelled as in the running text: nothing
  # where a text is spelled alike wherever it starts (WordPiece; SentencePiece, which marks every text's
  # start as a word's); a space for byte-level BPE, which spells a word after a space with "Ġ".
  space_prefix = ""

  def _set_specials(self, lookup, aliases_of: dict = _SPECIAL_ALIASES):
    ids = _resolve_special_ids(lookup, aliases_of)
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[t] for t in SPECIAL_TOKENS)
    self.special_ids = np.array(sorted(set(ids.values())), np.int32)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without [CLS]/[SEP]."""
    return self.convert_tokens_to_ids(self.tokenize(text))

  def build_inputs(self, a: list[int], b: list[int] | None = None) -> tuple[list[int], list[int]]:
    """The model input around token ids: `[CLS] A [SEP] B [SEP]`, segment ids 0 for A, 1 for B.

    The one place a tokenizer family's layout is written (RoBERTa's: `bert_jax.data.bpe`).
    """
    ids = [self.cls_id] + a + [self.sep_id]
    segment_ids = [0] * len(ids)
    if b is not None:
      ids += b + [self.sep_id]
      segment_ids += [1] * (len(b) + 1)
    return ids, segment_ids

  def encode_pair(self, text_a: str, text_b: str | None = None, max_length: int | None = None):
    """`build_inputs` of one or two texts (ids, segment ids), longest-first truncation to `max_length`."""
    a = self.encode(text_a)
    b = self.encode(text_b) if text_b is not None else None
    if max_length is not None:
      budget = max_length - len(self.build_inputs([], None if b is None else [])[0])
      while len(a) + len(b or []) > budget:  # as google-research/bert `_truncate_seq_pair`
        (a if len(a) > len(b or []) else b).pop()
    return self.build_inputs(a, b)

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    ids = [int(i) for i in ids]
    if skip_special_tokens:
      special = set(self.special_ids.tolist())
      ids = [i for i in ids if i not in special]
    return self._join(self.convert_ids_to_tokens(ids))

  def word_start_table(self) -> np.ndarray:
    """bool [vocab_size]: True where a token starts a word (whole-word and span masking)."""
    table = np.array([self._starts_word(t) for t in self.convert_ids_to_tokens(range(self.vocab_size))])
    table[self.special_ids] = True
    return table


def _merge(pieces, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Interleaves (text indices, flat ids, lengths) groups back into text order."""
  lengths = np.zeros([n], np.int64)
  for idx, _, piece_lengths in pieces:
    lengths[idx] = piece_lengths
  out_starts = np.cumsum(lengths) - lengths
  ids = np.zeros([int(lengths.sum())], np.int32)
  for idx, piece_ids, piece_lengths in pieces:
    in_starts = np.cumsum(piece_lengths) - piece_lengths
    ids[np.repeat(out_starts[idx] - in_starts, piece_lengths) + np.arange(len(piece_ids))] = piece_ids
  return ids, lengths


_DETOKENIZE = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
               (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class WordPieceTokenizer(_Tokenizer):
  """BERT WordPiece from a `vocab.txt` (one token per line, id = line number)."""

  kind = "wordpiece"

  def __init__(self, vocab_file: str, do_lower_case: bool = True, strip_accents: bool | None = None):
    self.vocab_file = str(vocab_file)
    self.do_lower_case = do_lower_case
    self.strip_accents = strip_accents   # Hugging Face's: None follows do_lower_case
    with open(self.vocab_file, encoding="utf-8") as f:
      self.inv_vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    self.vocab = {tok: i for i, tok in enumerate(self.inv_vocab)}  # a repeated token: the last id, as HF
    self.vocab_size = len(self.inv_vocab)
    self._set_specials(self.vocab.get)
    self._fast = {}  # built on first use: importing tensorflow_text costs seconds

  def tokenize(self, text: str) -> list[str]:
    return [p for w in wordpiece_text.basic_tokenize(text, self.do_lower_case, self.strip_accents)
            for p in wordpiece_text.wordpiece_split(w, self.vocab, UNK)]

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    return [self.vocab.get(t, self.unk_id) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self.inv_vocab[int(i)] for i in ids]

  @staticmethod
  def _join(tokens: list[str]) -> str:
    text = " ".join(tokens).replace(" ##", "")
    for spaced, joined in _DETOKENIZE:  # as Hugging Face's `clean_up_tokenization_spaces`
      text = text.replace(spaced, joined)
    return text

  @staticmethod
  def _starts_word(token: str) -> bool:
    return not token.startswith("##")

  def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ids of many texts at once, same ids as `encode`.

    Returns:
      (ids int32 [total], lengths int64 [len(texts)]): the texts' ids concatenated, and their counts.
    """
    texts = list(texts)
    if not texts:
      return np.zeros([0], np.int32), np.zeros([0], np.int64)
    joined = " ".join(texts)  # one check of the whole batch usually finds plain ASCII
    if joined.isascii() and joined.isprintable():
      return self._fast_ids(texts, ascii_only=True)
    # The fast tokenizer strips accents exactly where it lowercases: other settings take it for ASCII only.
    usual, fast_form = self.strip_accents in (None, self.do_lower_case), wordpiece_text.fast_form
    forms = [fast_form(t, self.do_lower_case) if usual else (t if t.isascii() and t.isprintable() else None)
             for t in texts]
    groups = {True: [], False: []}  # ASCII or not -> indices
    for i, form in enumerate(forms):
      if form is not None:
        groups[form.isascii()].append(i)
    pieces = [(np.array(idx), *self._fast_ids([forms[i] for i in idx], ascii_only))
              for ascii_only, idx in groups.items() if idx]
    slow = [i for i, form in enumerate(forms) if form is None]
    if slow:
      ids = [np.asarray(self.encode(texts[i]), np.int32) for i in slow]
      pieces.append((np.array(slow), np.concatenate(ids), np.array([len(x) for x in ids], np.int64)))
    return _merge(pieces, len(texts))

  def _fast_ids(self, texts: list[str], ascii_only: bool) -> tuple[np.ndarray, np.ndarray]:
    if not ascii_only and not self.do_lower_case:
      texts = [unicodedata.normalize("NFC", t) for t in texts]  # as `basic_tokenize`
    ragged = self._fast_tokenizer(ascii_only).tokenize(texts)
    return ragged.flat_values.numpy(), ragged.row_lengths().numpy()

  def _fast_tokenizer(self, ascii_only: bool = False):
    """tensorflow_text's tokenizer; for ASCII its byte limit per word is BERT's character limit."""
    if ascii_only not in self._fast:
      tf = host_env.import_tensorflow()
      import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top

      max_chars = wordpiece_text.MAX_CHARS_PER_WORD
      self._fast[ascii_only] = tf_text.FastBertTokenizer(
          vocab=self.inv_vocab, suffix_indicator="##", unknown_token=self.inv_vocab[self.unk_id],
          max_bytes_per_word=max_chars if ascii_only else 4 * 3 * max_chars,
          token_out_type=tf.int32, lower_case_nfd_strip_accents=self.do_lower_case)
    return self._fast[ascii_only]

  @property
  def source_file(self) -> str:
    """The file this tokenizer was read from (vocab.txt)."""
    return self.vocab_file

  def save(self, directory: str) -> str:
    """Copies vocab.txt into `directory`; a `strip_accents` other than None goes into its tokenizer_config.json
    (kept with what else it holds), which `load_tokenizer` reads back."""
    if self.strip_accents is not None:
      update_tokenizer_config(directory, strip_accents=self.strip_accents)
    return copy_into(directory, self.vocab_file, VOCAB_FILE)


def concatenate(per_text: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """`encode_batch`'s result from each text's ids: (ids int32 [total], lengths int64 [texts])."""
  lengths = np.array([len(c) for c in per_text], np.int64)
  return np.fromiter((i for c in per_text for i in c), np.int32, int(lengths.sum())), lengths


def copy_into(directory: str, source: str, name: str) -> str:
  """Copies a tokenizer's file into `directory` as `name` (the tokenizers' `save`); returns the copy."""
  os.makedirs(directory, exist_ok=True)
  dest = os.path.join(directory, name)
  if os.path.abspath(dest) != os.path.abspath(source):
    shutil.copyfile(source, dest)
  return dest


def load_tokenizer(path: str, do_lower_case: bool = True):
  """`vocab.txt` -> WordPiece, `*.model` -> SentencePiece, `vocab.json` (`merges.txt` beside it) ->
  byte-level BPE, `tokenizer.json` -> Hugging Face's pipeline as the file states it
  (`bert_jax.data.tokenizer_json`); a directory -> the first of those it holds.

  A tokenizer_config.json beside the file gives WordPiece's `strip_accents`, SentencePiece's
  `keep_accents` and `remove_space` and the BPE's settings. Byte-level BPE is cased by design (RoBERTa,
  GPT-2): `do_lower_case` does not apply to it. Remote paths (`gs://...`, anything with a scheme) are
  copied to local disk first.
  """
  path = str(path)
  if "://" in path:
    path = _localize(path)
  if os.path.isdir(path):
    path = _tokenizer_file(path)
  if os.path.basename(path) == TOKENIZER_JSON:
    from bert_jax.data import tokenizer_json  # pylint: disable=g-import-not-at-top
    return tokenizer_json.load(path)
  if path.endswith(".model"):
    from bert_jax.data import sentencepiece_tokenizer  # pylint: disable=g-import-not-at-top
    return sentencepiece_tokenizer.SentencePieceTokenizer(path, do_lower_case,
                                                          **_sentencepiece_options(os.path.dirname(path)))
  if path.endswith(".json"):
    from bert_jax.data import bpe  # pylint: disable=g-import-not-at-top
    return bpe.load(path)
  strip_accents = read_tokenizer_config(os.path.dirname(path)).get("strip_accents")
  try:
    return WordPieceTokenizer(path, do_lower_case, None if strip_accents is None else bool(strip_accents))
  except UnicodeDecodeError as e:   # a binary file (a shard, a checkpoint) named as the vocabulary
    raise ValueError(f"{path} is no vocabulary: not UTF-8 text ({e.reason} at byte {e.start}); a WordPiece "
                     "vocab.txt holds one token a line") from None
  except ValueError as e:   # its special tokens missing: another kind of file, or a vocabulary of another kind
    raise ValueError(f"{path} is no WordPiece vocabulary: {e}") from None


def _tokenizer_file(directory: str) -> str:
  names = set(os.listdir(directory))
  candidates = [VOCAB_FILE] + sorted(n for n in names if n.endswith(".model"))
  candidates += [BPE_VOCAB_FILE] if MERGES_FILE in names else []
  candidates += [TOKENIZER_JSON]  # Hugging Face's whole pipeline (ModernBERT ships only this)
  found = [os.path.join(directory, n) for n in candidates if os.path.isfile(os.path.join(directory, n))]
  if not found:
    raise FileNotFoundError(
        f"{directory} holds no {VOCAB_FILE}, SentencePiece *.model, {BPE_VOCAB_FILE} + {MERGES_FILE} or "
        f"{TOKENIZER_JSON}")
  return found[0]


def read_tokenizer_config(directory: str) -> dict:
  """The tokenizer_config.json in `directory`, {} without one."""
  path = os.path.join(directory, TOKENIZER_CONFIG)
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def update_tokenizer_config(directory: str, **settings) -> None:
  """Sets `settings` in `directory`'s tokenizer_config.json, keeping what else it holds."""
  config = read_tokenizer_config(directory)
  config.update(settings)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, TOKENIZER_CONFIG), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2)


def _sentencepiece_options(directory: str) -> dict:
  """`AlbertTokenizer`'s settings in Hugging Face's tokenizer_config.json; an ALBERT config without
  `keep_accents` means its default (False). Our own models have no such config and keep accents."""
  config = read_tokenizer_config(directory)
  albert = str(config.get("tokenizer_class", "")).startswith("Albert")
  return {"keep_accents": bool(config.get("keep_accents", not albert)),
          "remove_space": bool(config.get("remove_space", True))}


def _localize(path: str) -> str:
  """Copies a remote tokenizer file (with merges.txt and tokenizer_config.json beside it), or a
  directory's tokenizer files, to local disk."""
  tf = host_env.import_tensorflow()   # only for remote file systems
  gfile = tf.io.gfile
  if gfile.isdir(path):
    wanted = (VOCAB_FILE, BPE_VOCAB_FILE, MERGES_FILE, TOKENIZER_CONFIG, TOKENIZER_JSON,
              "special_tokens_map.json")
    names = [f.rstrip("/") for f in gfile.listdir(path)]
    sources = [os.path.join(path, f) for f in names if f in wanted or f.endswith(".model")]
  else:
    beside = [os.path.join(os.path.dirname(path), f)
              for f in (MERGES_FILE, TOKENIZER_CONFIG, "special_tokens_map.json")]
    sources = [path] + [f for f in beside if gfile.exists(f)]
  local = tempfile.mkdtemp(prefix="bert_jax_tokenizer-")
  for source in sources:
    gfile.copy(source, os.path.join(local, os.path.basename(source)), overwrite=True)
  return local if gfile.isdir(path) else os.path.join(local, os.path.basename(path))
