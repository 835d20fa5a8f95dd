"""Byte-level BPE (RoBERTa, GPT-2) through Hugging Face's `tokenizers`, with RoBERTa's layout.

Reads `vocab.json` + `merges.txt` (and `add_prefix_space` and the special tokens' names from a
tokenizer_config.json beside them) and gives the ids of Hugging Face's `RobertaTokenizer`:
`<s> A </s>` and `<s> A </s></s> B </s>`, one token type. The text is never lowercased: byte-level
BPE keeps every byte. Vocabularies are trained by
`bert_jax.data.vocab_training.train_byte_level_bpe`.

    tok = load_tokenizer("roberta/")   # bert_jax.data.tokenizer.load_tokenizer dispatches here
    ids, segment_ids = tok.encode_pair("A b.", "C d.", max_length=128)
"""

import json
import os
from typing import Iterable, Sequence

import numpy as np

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.tokenizer import CLS, MASK, PAD, SEP, UNK

# RoBERTa's special tokens, in its vocabulary's order (<s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4).
ROBERTA_SPECIALS = {CLS: "<s>", PAD: "<pad>", SEP: "</s>", UNK: "<unk>", MASK: "<mask>"}
_CONFIG_KEYS = {CLS: "cls_token", PAD: "pad_token", SEP: "sep_token", UNK: "unk_token", MASK: "mask_token"}


def byte_level_pipeline(model, add_prefix_space: bool = False):
  """A `tokenizers.Tokenizer` of `model` with GPT-2's byte-level pre-tokenizer and decoder."""
  from tokenizers import Tokenizer, decoders, pre_tokenizers  # pylint: disable=g-import-not-at-top

  tk = Tokenizer(model)
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
  tk.decoder = decoders.ByteLevel()
  return tk


class TokenizersPipeline(tokenizer_lib._Tokenizer):  # pylint: disable=protected-access
  """A tokenizer run by a `tokenizers.Tokenizer` (`self._tk`), special tokens left to `build_inputs`."""

  _tk = None

  def tokenize(self, text: str) -> list[str]:
    return self._tk.encode(text, add_special_tokens=False).tokens

  def encode(self, text: str) -> list[int]:
    return self._tk.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """As `WordPieceTokenizer.encode_batch` (the texts are encoded in parallel, in Rust)."""
    encodings = self._tk.encode_batch_fast(list(texts), add_special_tokens=False)
    return tokenizer_lib.concatenate([e.ids for e in encodings])

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    ids = [self._tk.token_to_id(t) for t in tokens]
    return [self.unk_id if i is None else i for i in ids]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self._tk.id_to_token(int(i)) for i in ids]


class ByteLevelBPETokenizer(TokenizersPipeline):
  """Byte-level BPE from `vocab.json` and `merges.txt`.

  Args:
    vocab_file: vocab.json ({token: id}); `merges_file` defaults to the merges.txt beside it.
    add_prefix_space: a space before every text, so its first word is spelled as any other.
    special_tokens: {role ([CLS], [SEP], [PAD], [UNK], [MASK]): token}, RoBERTa's by default.
  """

  kind = "byte_bpe"
  space_prefix = " "
  do_lower_case = False

  def __init__(self, vocab_file: str, merges_file: str | None = None, add_prefix_space: bool = False,
               special_tokens: dict | None = None):
    from tokenizers import models  # pylint: disable=g-import-not-at-top

    self.vocab_file = str(vocab_file)
    self.merges_file = str(merges_file or os.path.join(os.path.dirname(self.vocab_file),
                                                       tokenizer_lib.MERGES_FILE))
    self.add_prefix_space = add_prefix_space
    self.special_tokens = {**ROBERTA_SPECIALS, **(special_tokens or {})}
    # Special tokens are not matched in text (as WordPiece and SentencePiece here, unlike Hugging Face):
    # a corpus that spells "</s>" or "<mask>" gets bytes, never a separator or a mask.
    try:
      bpe = models.BPE.from_file(self.vocab_file, self.merges_file)
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raises a bare Exception)
      raise ValueError(f"{self.vocab_file} with {self.merges_file} is no byte-level BPE vocabulary (a vocab.json "
                       f"of token ids and the merges.txt beside it): {e}") from None
    self._tk = byte_level_pipeline(bpe, add_prefix_space)
    self.vocab_size = self._tk.get_vocab_size()
    self._set_specials(self._tk.token_to_id, {role: (t,) for role, t in self.special_tokens.items()})

  def build_inputs(self, a: list[int], b: list[int] | None = None) -> tuple[list[int], list[int]]:
    """RoBERTa's layout: `<s> A </s>` or `<s> A </s></s> B </s>`, all segment ids 0."""
    ids = [self.cls_id] + a + [self.sep_id]
    if b is not None:
      ids += [self.sep_id] + b + [self.sep_id]
    return ids, [0] * len(ids)

  def _join(self, tokens: list[str]) -> str:
    return self._tk.decoder.decode(tokens)

  def _starts_word(self, token: str) -> bool:
    # A word's first token holds its leading space ("Ġthe") or punctuation; letters, digits and the
    # bytes inside a character (decoded as U+FFFD) continue one. The first word of a text has no
    # space to show it: the vocabulary alone cannot tell it from a continuation.
    first = self._join([token])[:1]
    return first.isspace() or not (first.isalnum() or first == "\ufffd")

  @property
  def source_file(self) -> str:
    """The file this tokenizer was read from (vocab.json; merges.txt lies beside it)."""
    return self.vocab_file

  def save(self, directory: str) -> str:
    """Writes merges.txt, tokenizer_config.json (where its settings are not RoBERTa's defaults) and
    vocab.json into `directory`; returns vocab.json's path."""
    tokenizer_lib.copy_into(directory, self.merges_file, tokenizer_lib.MERGES_FILE)
    config = tokenizer_lib.read_tokenizer_config(directory)
    if _settings(config) != (self.add_prefix_space, self.special_tokens):
      config.update({"add_prefix_space": self.add_prefix_space, "tokenizer_class": "RobertaTokenizer"},
                    **{_CONFIG_KEYS[role]: t for role, t in self.special_tokens.items()})
      with open(os.path.join(directory, tokenizer_lib.TOKENIZER_CONFIG), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return tokenizer_lib.copy_into(directory, self.vocab_file, tokenizer_lib.BPE_VOCAB_FILE)


def _settings(config: dict) -> tuple[bool, dict]:
  """(add_prefix_space, special tokens) of Hugging Face's tokenizer_config.json, RoBERTa's defaults."""
  specials = dict(ROBERTA_SPECIALS)
  for role, key in _CONFIG_KEYS.items():
    value = config.get(key)
    if value is not None:
      specials[role] = value["content"] if isinstance(value, dict) else str(value)
  return bool(config.get("add_prefix_space", False)), specials


def load(vocab_file: str) -> ByteLevelBPETokenizer:
  """The tokenizer of `vocab_file`, with the merges.txt and tokenizer_config.json beside it."""
  add_prefix_space, specials = _settings(tokenizer_lib.read_tokenizer_config(os.path.dirname(vocab_file)))
  return ByteLevelBPETokenizer(vocab_file, add_prefix_space=add_prefix_space, special_tokens=specials)
