"""A rule-based sentence splitter, for text that does not come one sentence per line.

`corpus` splits JSON lines, TFDS text and the embedded plays with it (plain text in the original BERT
format already holds one sentence per line).
"""

import re

# A candidate boundary: terminal punctuation, optional closing quotes/brackets, then whitespace.
_CANDIDATE_RE = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*\s+")
_OPENERS = "\"'\u201c\u2018([-"
# Titles before a name and always-inside-sentence abbreviations: never a boundary after these.
_NEVER_BREAK = frozenset(
    "mr mrs ms dr prof sen rep gov gen st lt col sgt capt cmdr adm rev hon pres supt messrs mme mlle "
    "vs e.g i.e cf al approx".split())
# Abbreviations of a number's label ("No. 5", "vol. 2", "pp. 10-12"): inside a sentence only before a number, so
# "He said no. Then he left." is two sentences.
_BEFORE_NUMBER = frozenset("no nos vol vols fig figs pp art sec ch".split())
# Abbreviations that may also end a sentence: a boundary only before a typical sentence opener.
_MAYBE_BREAK = frozenset(
    "inc ltd co corp jr sr etc u.s u.k u.n a.m p.m jan feb mar apr jun jul aug sep sept oct nov dec "
    "mt ft ave blvd dept univ assn bros est".split())
_STARTERS = frozenset(
    "the a an he she it they we i you this that these those there but and in on at for his her their "
    "its our my if when while after before as so yet mr mrs ms dr what who why how".split())
_INITIALISM_RE = re.compile(r"^(?:[a-z]\.)+[a-z]$")


def _is_boundary(text: str, match: re.Match) -> bool:
  """Decides one candidate of `_CANDIDATE_RE`; cheap, since it runs once per sentence."""
  nxt = match.end()
  while nxt < len(text) and text[nxt] in _OPENERS:
    nxt += 1
  if nxt >= len(text) or not (text[nxt].isupper() or text[nxt].isdigit()):
    return False
  terminator = match.group().rstrip()
  if terminator != ".":
    return True  # "!", "?", "...", or a period followed by a closing quote
  word = text[text.rfind(" ", 0, match.start()) + 1:match.start()].lstrip(_OPENERS).lower()
  if len(word) == 1 and word.isalpha():
    return False  # an initial: "J. R. R. Tolkien"
  if word in _NEVER_BREAK:
    return False
  if word in _BEFORE_NUMBER:
    return not text[nxt].isdigit()
  if word in _MAYBE_BREAK or _INITIALISM_RE.match(word):
    next_word = text[nxt:text.find(" ", nxt) if text.find(" ", nxt) > 0 else len(text)]
    return next_word.lower() in _STARTERS
  return True


def split_sentences(text: str) -> list[str]:
  """Rule-based sentence splitter; paragraph breaks (newlines) always end a sentence.

  Handles titles and abbreviations ("Mr. Smith", "the U.S. Senate"), initials, decimals ("3.14"),
  and closing quotes ('He left." Then'). Whitespace inside a sentence is collapsed to one space.
  """
  sentences = []
  for paragraph in text.splitlines():
    paragraph = " ".join(paragraph.split())
    start = 0
    for match in _CANDIDATE_RE.finditer(paragraph):
      if _is_boundary(paragraph, match):
        sentences.append(paragraph[start:match.end()].rstrip())
        start = match.end()
    if start < len(paragraph):
      sentences.append(paragraph[start:])
  return sentences
