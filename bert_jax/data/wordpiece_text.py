"""WordPiece's text rules: google-research/bert `tokenization.py` in plain Python, and the rewrites that let
the fast path (`tensorflow_text.FastBertTokenizer`) give the same ids (`fast_form`).

The rules (Hugging Face `BertTokenizer`'s where the two differ, whose ids we match): clean text, split CJK
ideographs, lowercase + strip accents when uncased, split punctuation (`basic_tokenize`), then greedy
longest-match-first with `##`, words over 100 characters -> [UNK] (`wordpiece_split`).
bert_jax/data/tokenizer.py `WordPieceTokenizer` runs them.
"""

import re
import unicodedata

MAX_CHARS_PER_WORD = 100  # google-research/bert `WordpieceTokenizer.max_input_chars_per_word`


def is_whitespace(ch: str) -> bool:
  return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def is_control(ch: str) -> bool:
  # Hugging Face drops every "C*" category; google-research/bert only Cc/Cf. They differ on
  # private-use and unassigned code points; we follow Hugging Face, whose ids we must match.
  return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def is_punctuation(ch: str) -> bool:
  cp = ord(ch)  # ASCII symbols like "$" or "^" are not Unicode "P*" but BERT splits them too.
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(ch).startswith("P")


_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_CJK_RE = re.compile("([" + "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES) + "])")


def clean_text(text: str) -> str:
  """Drops NUL, U+FFFD and control characters; every whitespace character becomes a space."""
  out = []
  for ch in text:
    if ch == "\x00" or ch == "\ufffd" or is_control(ch):
      continue
    out.append(" " if is_whitespace(ch) else ch)
  return "".join(out)


def remove_accents(text: str) -> str:
  return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


def split_punctuation(word: str) -> list[str]:
  pieces, current = [], []
  for ch in word:
    if is_punctuation(ch):
      if current:
        pieces.append("".join(current))
        current = []
      pieces.append(ch)
    else:
      current.append(ch)
  if current:
    pieces.append("".join(current))
  return pieces


def basic_tokenize(text: str, do_lower_case: bool, strip_accents: bool | None = None) -> list[str]:
  """BERT's `BasicTokenizer`: the words WordPiece then splits. Accents are stripped as Hugging Face's
  `strip_accents` says: None follows `do_lower_case` (BERT's rule), True or False either way."""
  text = _CJK_RE.sub(r" \1 ", clean_text(text))
  text = unicodedata.normalize("NFC", text)  # as Hugging Face, so composed/decomposed input agree
  strip = do_lower_case if strip_accents is None else strip_accents
  words = []
  for word in text.split():
    if do_lower_case:
      word = word.lower()
    if strip:
      word = remove_accents(word)
    words.extend(split_punctuation(word))
  return words


def wordpiece_split(word: str, vocab: dict, unk: str) -> list[str]:
  """Greedy longest-match-first split of one word; [UNK] if any part cannot be matched."""
  if len(word) > MAX_CHARS_PER_WORD:
    return [unk]
  pieces, start = [], 0
  while start < len(word):
    end = len(word)
    while end > start:
      piece = word[start:end] if start == 0 else "##" + word[start:end]
      if piece in vocab:
        break
      end -= 1
    if end == start:
      return [unk]
    pieces.append(piece)
    start = end
  return pieces


# The fast path (tensorflow_text) differs from the reference on a few inputs; `fast_form`
# rewrites a text so that both agree, or returns None to send it to the reference path:
# * controls, NUL and U+FFFD: BERT deletes them, the fast normaliser maps controls to spaces, so
#   they are deleted first (`clean_text` is idempotent, so this changes nothing for the reference);
# * the per-word limit: the fast path counts bytes, BERT characters of the normalised word. They
#   agree on ASCII; other texts use a tokenizer with a limit no word of 100 characters reaches,
#   and go to the reference path if a run of non-space characters could hold a longer word once
#   normalised (NFD turns one Hangul syllable into three jamo);
# * CJK ideographs: not split by the fast pre-tokeniser, so they are padded with spaces first;
# * when lowercasing, characters with a compatibility decomposition ("½", "™", "…": the fast
#   normaliser applies NFKD where BERT applies NFD) or whose case folding differs from
#   `str.lower` ("ß" -> "ss", final sigma).
# NFD (and lowercasing) turn a character into at most 4, so shorter runs stay within the limit.
_LONG_RUN_RE = re.compile(r"\S{%d,}" % (MAX_CHARS_PER_WORD // 4))
# Also the Hangul fillers U+115F and U+1160, which the fast path's normaliser deletes as default-ignorable
# when it lowercases (the reference keeps them: one [UNK] with the letters around them).
_FOLD_DIFFERS_RE = re.compile("[\u03a3\u115f\u1160" + re.escape(
    "".join(chr(c) for c in range(0x10000) if chr(c).casefold() != chr(c).lower())) + "]")


def fast_form(text: str, do_lower_case: bool) -> str | None:
  """`text` rewritten so the fast path gives the reference ids, or None if it cannot."""
  if text.isascii() and text.isprintable():
    return text
  if not text.isprintable():
    text = clean_text(text)
  text = text.replace("\ufffd", "")
  if text.isascii():
    return text
  text = _CJK_RE.sub(r" \1 ", text)
  for run in _LONG_RUN_RE.findall(text):
    normalised = remove_accents(run.lower()) if do_lower_case else unicodedata.normalize("NFC", run)
    if len(normalised) > MAX_CHARS_PER_WORD:
      return None
  if do_lower_case and (not unicodedata.is_normalized("NFKC", text) or _FOLD_DIFFERS_RE.search(text)):
    return None
  return text
