"""SentEval-style probing tasks built from raw text, with no labels needed (Conneau et al. 2018, "What you can
cram into a single $&!#* vector", section 3): sentence length, word content and bigram shift.

    sentences = senteval.read_sentences("news_articles.jsonl")
    splits = senteval.build("bshift", sentences, num_examples=3000, seed=0)   # {"train", "dev", "test"}

The corpus is JSON lines (a `text` field) or plain text (one document a line), split into sentences after
`.`, `!` or `?` followed by a capital or a digit, and tokenized into words and punctuation marks (the paper's
data is tokenized text). A sentence's text is its tokens joined by spaces; duplicates are read once. As in the
paper, only sentences of 5 to 28 tokens are kept, and every task's classes are balanced.

  sentlen  the length in tokens, in the paper's 6 equal-width bins over 5..28: 5-8, 9-12, ..., 25-28.
  wc       which one of a set of mid-frequency words the sentence holds; it holds exactly one occurrence of
           one of them. The paper takes 1000 words of frequency ranks 2000-3000 of a book corpus; a corpus of
           a few million words has too few sentences per word for that (in the news corpus, 2.4M tokens, a
           word of rank 2000-3000 is in ~36 sentences), so by default 30 words are drawn from ranks 500-1500
           (lowercased alphabetic tokens; ~100 sentences each there) among those with enough sentences.
  bshift   whether two adjacent tokens were swapped ("I", inverted) or not ("O", original), half and half.
           The swapped pair is two different alphabetic words (case-insensitively: the models may be
           uncased), so that an inverted sentence really differs from every original.

Splits are 80/10/10 per class (the paper's 100k/10k/10k is 83/8.5/8.5), from a seeded shuffle.
"""

import collections
import re

import numpy as np

from bert_jax.finetune import readers

WORD_RANGE = (5, 28)   # tokens a sentence may have (Conneau et al. 2018, section 3)
SENTLEN_BINS = 6       # equal-width length bins of SentLen
WC_WORDS = 30          # target words of WC; the paper's 1000 need ~100k sentences
WC_RANKS = (500, 1500)
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
SPLITS = ("train", "dev", "test")

_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)]?\s+(?=[\"“(]?[A-Z0-9])")
_TOKEN = re.compile(r"\w+(?:['’]\w+)*|[^\w\s]")


def split_sentences(text: str) -> list[str]:
  """Sentences of a document: a break after `.`, `!` or `?` (and a closing quote) before a capital or digit."""
  return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def tokenize(sentence: str) -> tuple[str, ...]:
  """Words (with inner apostrophes: `Trump's`) and single punctuation marks."""
  return tuple(_TOKEN.findall(sentence))


def read_sentences(path: str, field: str = "text", word_range=WORD_RANGE,
                   flag: str = "--text_key") -> list[tuple[str, ...]]:
  """The distinct tokenized sentences of `word_range` tokens of a JSON lines (`field`) or plain-text corpus; a
  JSON line without its text is a DataError naming the file, the line and `flag` (the option naming `field`)."""
  text = readers.read_text(path)
  is_json = path.endswith((".jsonl", ".json"))
  seen, sentences = set(), []
  # JSON lines end at "\n" only: str.splitlines also splits at U+2028 and U+0085, which JSON strings may hold.
  for n, line in enumerate(text.split("\n") if is_json else text.splitlines(), 1):
    if not line.strip():
      continue
    document = readers.json_text(path, n, line, field, flag) if is_json else line
    for sentence in split_sentences(document):
      tokens = tokenize(sentence)
      if word_range[0] <= len(tokens) <= word_range[1] and tokens not in seen:
        seen.add(tokens)
        sentences.append(tokens)
  return sentences


def sentlen_bin(length: int, word_range=WORD_RANGE, bins: int = SENTLEN_BINS) -> str:
  """The SentLen label of a length: its bin as "lo-hi" (5-8, 9-12, ... for the paper's range)."""
  lo, hi = word_range
  width = (hi - lo + 1) // bins
  if not lo <= length <= hi:
    raise ValueError(f"length {length} outside {lo}..{hi}")
  index = min((length - lo) // width, bins - 1)  # the last bin takes any remainder
  start = lo + index * width
  return f"{start}-{hi if index == bins - 1 else start + width - 1}"


def build_sentlen(sentences, num_examples: int, rng: np.random.Generator) -> list[tuple[str, str]]:
  """(text, bin) pairs, the same number per bin."""
  by_label = collections.defaultdict(list)
  for tokens in sentences:
    by_label[sentlen_bin(len(tokens))].append(" ".join(tokens))
  return _balanced(by_label, num_examples, rng)


def wc_targets(sentences, num_words: int, ranks, per_word: int, rng: np.random.Generator) -> list[str]:
  """`num_words` words drawn from the frequency ranks [lo, hi) among those found in >= `per_word` sentences
  (fewer if fewer qualify)."""
  counts = collections.Counter(w.lower() for tokens in sentences for w in tokens if w.isalpha())
  ranked = [w for w, _ in counts.most_common()][ranks[0]:ranks[1]]
  holding = collections.Counter(w for tokens in sentences for w in {t.lower() for t in tokens})
  candidates = [w for w in ranked if holding[w] >= per_word]
  chosen = rng.choice(len(candidates), size=min(num_words, len(candidates)), replace=False)
  return sorted(candidates[i] for i in chosen)


def build_wc(sentences, num_examples: int, rng: np.random.Generator, num_words: int = WC_WORDS,
             ranks=WC_RANKS) -> list[tuple[str, str]]:
  """(text, word) pairs: each text holds exactly one occurrence of one target word, its label."""
  targets = set(wc_targets(sentences, num_words, ranks, max(num_examples // num_words, 1), rng))
  by_label = collections.defaultdict(list)
  for tokens in sentences:
    found = [t.lower() for t in tokens if t.lower() in targets]
    if len(found) == 1:
      by_label[found[0]].append(" ".join(tokens))
  return _balanced(by_label, num_examples, rng)


def swappable(tokens) -> list[int]:
  """Positions i where tokens i and i + 1 are two different alphabetic words (case-insensitively)."""
  return [i for i in range(len(tokens) - 1)
          if tokens[i].isalpha() and tokens[i + 1].isalpha() and tokens[i].lower() != tokens[i + 1].lower()]


def build_bshift(sentences, num_examples: int, rng: np.random.Generator) -> list[tuple[str, str]]:
  """(text, "I"|"O") pairs, half with two adjacent words inverted; each sentence is used once."""
  usable = [tokens for tokens in sentences if swappable(tokens)]
  picked = rng.permutation(len(usable))[:num_examples - num_examples % 2]
  pairs = []
  for k, i in enumerate(picked):
    tokens = list(usable[i])
    if k % 2:
      positions = swappable(tokens)
      j = positions[rng.integers(len(positions))]
      tokens[j], tokens[j + 1] = tokens[j + 1], tokens[j]
    pairs.append((" ".join(tokens), "I" if k % 2 else "O"))
  return pairs


BUILDERS = {"sentlen": build_sentlen, "wc": build_wc, "bshift": build_bshift}


def _balanced(by_label: dict, num_examples: int, rng: np.random.Generator) -> list[tuple[str, str]]:
  """The same number of texts per label: num_examples // labels, or what the rarest label has."""
  if not by_label:
    raise readers.DataError("the corpus has no sentence for this task: give a larger corpus")
  per_label = min(num_examples // len(by_label), min(len(v) for v in by_label.values()))
  pairs = []
  for label in sorted(by_label):
    texts = by_label[label]
    pairs += [(texts[i], label) for i in rng.permutation(len(texts))[:per_label]]
  return pairs


def split(items, rng: np.random.Generator, label_of=None, fractions=SPLIT_FRACTIONS) -> dict[str, list]:
  """{"train", "dev", "test"}: a seeded shuffle of `items` cut by `fractions`, per label if `label_of` is
  given (so balanced classes stay balanced); every split gets at least one item of 3 or more."""
  groups = collections.defaultdict(list)
  for item in items:
    groups[label_of(item) if label_of else None].append(item)
  out = {name: [] for name in SPLITS}
  for key in sorted(groups, key=str):
    group = [groups[key][i] for i in rng.permutation(len(groups[key]))]
    n_dev = max(int(round(len(group) * fractions[1])), 1 if len(group) >= 3 else 0)
    n_test = max(int(round(len(group) * fractions[2])), 1 if len(group) >= 3 else 0)
    out["dev"] += group[:n_dev]
    out["test"] += group[n_dev:n_dev + n_test]
    out["train"] += group[n_dev + n_test:]
  return {name: [out[name][i] for i in rng.permutation(len(out[name]))] for name in SPLITS}


def build(name: str, sentences, num_examples: int, seed: int = 0) -> dict[str, list[readers.PairExample]]:
  """One task's train/dev/test `PairExample`s (text_a, label) from tokenized sentences."""
  rng = np.random.default_rng([seed, sorted(BUILDERS).index(name)])
  pairs = BUILDERS[name](sentences, num_examples, rng)
  parts = split(pairs, rng, label_of=lambda pair: pair[1])
  return {part: [readers.PairExample(guid=f"{part}-{i}", text_a=text, label=label)
                 for i, (text, label) in enumerate(rows)] for part, rows in parts.items()}
