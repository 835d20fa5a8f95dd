"""SentencePiece models (unigram or BPE) with Hugging Face `AlbertTokenizer`'s preprocessing.

    tok = load_tokenizer("spm.model")   # bert_jax.data.tokenizer.load_tokenizer dispatches here
    ids, segment_ids = tok.encode_pair("A b.", "C d.", max_length=128)
"""

import unicodedata
from typing import Iterable, Sequence

import numpy as np

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data.tokenizer import SPM_FILE

_ALBERT_PUNCTUATION = frozenset('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')
_ALBERT_PIECE_CHARS = _ALBERT_PUNCTUATION | frozenset("abcdefghijklmnopqrstuvwxyz")


class SentencePieceTokenizer(tokenizer_lib._Tokenizer):  # pylint: disable=protected-access
  """A SentencePiece model (unigram or BPE), with Hugging Face `AlbertTokenizer`'s preprocessing.

  Args:
    do_lower_case: lowercase the text first.
    keep_accents: False drops accents (NFKD, combining marks removed), as ALBERT's default;
      `load_tokenizer` reads it from a tokenizer_config.json beside the model.
    remove_space: strip the text and collapse its runs of whitespace into one space.
  """

  kind = "sentencepiece"

  def __init__(self, model_file: str, do_lower_case: bool = True, keep_accents: bool = True,
               remove_space: bool = True):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top

    self.model_file = str(model_file)
    self.do_lower_case, self.keep_accents, self.remove_space = do_lower_case, keep_accents, remove_space
    self.sp = spm.SentencePieceProcessor(model_file=self.model_file)
    self.vocab_size = self.sp.get_piece_size()
    self._set_specials(self._piece_id)
    # Ids after which `_split_digit_comma` may change the pieces: encode those texts piece by piece.
    pieces = self.convert_ids_to_tokens(range(self.vocab_size))
    self._resplit = np.array([len(p) > 1 and p[-1] == "," and p[-2].isdigit() for p in pieces])
    self._resplit[self.unk_id] = True  # an unknown piece's text is only seen piece by piece

  def _piece_id(self, piece: str):
    i = self.sp.piece_to_id(piece)
    return i if self.sp.id_to_piece(i) == piece else None  # unknown pieces map to unk_id

  def _prepare(self, text: str) -> str:
    """`AlbertTokenizer.preprocess_text`."""
    if self.remove_space:
      text = " ".join(text.strip().split())
    text = text.replace("``", '"').replace("''", '"')
    if not self.keep_accents:
      text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return text.lower() if self.do_lower_case else text

  def _split_digit_comma(self, piece: str) -> list[str]:
    """`AlbertTokenizer._tokenize`: "9," is split off its comma (`9,9` -> `▁9 , 9`, as the
    google-research/bert README's SentencePiece note)."""
    if len(piece) < 2 or piece[-1] != "," or not piece[-2].isdigit():
      return [piece]
    pieces = self.sp.encode(piece[:-1].replace("\u2581", ""), out_type=str)
    if piece[0] != "\u2581" and pieces[0][0] == "\u2581":
      pieces = pieces[1:] if len(pieces[0]) == 1 else [pieces[0][1:]] + pieces[1:]
    return pieces + [","]

  def _pieces(self, prepared: str) -> list[str]:
    return [q for p in self.sp.encode(prepared, out_type=str) for q in self._split_digit_comma(p)]

  def tokenize(self, text: str) -> list[str]:
    return self._pieces(self._prepare(text))

  def encode(self, text: str) -> list[int]:
    return self._encode_prepared([self._prepare(text)])[0]

  def _encode_prepared(self, texts: list[str]) -> list[list[int]]:
    per_text = self.sp.encode(texts)  # by ids, in C++; piece by piece only where the rule may apply
    return [self.convert_tokens_to_ids(self._pieces(t)) if self._resplit[ids].any() else ids
            for t, ids in zip(texts, per_text)]

  def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """As `WordPieceTokenizer.encode_batch`."""
    return tokenizer_lib.concatenate(self._encode_prepared([self._prepare(t) for t in texts]))

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    return [self.sp.piece_to_id(t) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self.sp.id_to_piece(int(i)) for i in ids]

  @staticmethod
  def _join(tokens: list[str]) -> str:
    return "".join(tokens).replace("\u2581", " ").strip()

  @staticmethod
  def _starts_word(token: str) -> bool:
    """google-research/albert's `_is_start_piece_sp` (create_pretraining_data.py): a piece starts a word if
    it begins with "▁" or "<", is a punctuation piece, or holds any character but a-z and punctuation
    (digits, other scripts: "a whole piece")."""
    return (token.startswith(("\u2581", "<")) or token in _ALBERT_PUNCTUATION
            or not all(c.lower() in _ALBERT_PIECE_CHARS for c in token))

  @property
  def source_file(self) -> str:
    """The file this tokenizer was read from (the SentencePiece model)."""
    return self.model_file

  def save(self, directory: str) -> str:
    """Copies the model into `directory` and writes `keep_accents` and `remove_space` into its
    tokenizer_config.json (kept with what else it holds), which `load_tokenizer` reads back: without them
    an ALBERT model's copy would keep the accents its original drops."""
    tokenizer_lib.update_tokenizer_config(directory, keep_accents=self.keep_accents, remove_space=self.remove_space)
    return tokenizer_lib.copy_into(directory, self.model_file, SPM_FILE)
