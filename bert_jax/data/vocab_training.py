"""Vocabulary training: WordPiece, SentencePiece and byte-level BPE for `bert_jax.data.tokenizer`.

WordPiece and SentencePiece put BERT's special tokens first ([PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4),
byte-level BPE RoBERTa's (<s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4); every model and pipeline stage
resolves them through the tokenizer. `train` is the one place a vocabulary kind is chosen.

    path = train_wordpiece(sentences, vocab_size=30522, out_file="vocab.txt")
    model = train_sentencepiece(sentences, "spm", vocab_size=32000, model_type="unigram")
    vocab_json = train_byte_level_bpe(sentences, vocab_size=50265, out_dir="bpe")   # + merges.txt
"""

import collections
import heapq
import os
import random
import re
import shutil
import tempfile
from typing import Iterable

from bert_jax.data import bpe
from bert_jax.data.tokenizer import (BPE_VOCAB_FILE, CLS, MASK, MERGES_FILE, PAD, SEP, SPECIAL_TOKENS,
                                     SPM_FILE, UNK, VOCAB_FILE)
from bert_jax.data.wordpiece_text import basic_tokenize

# wordpiece; SentencePiece unigram or bpe; byte_bpe: byte-level BPE as RoBERTa and GPT-2.
VOCAB_MODELS = ("wordpiece", "unigram", "bpe", "byte_bpe")
TRAINED_FILES = (VOCAB_FILE, SPM_FILE, BPE_VOCAB_FILE)  # what `train` writes, one per kind


def train(vocab_model: str, sentences: Iterable[str], vocab_size: int, output_dir: str,
          do_lower_case: bool = True) -> str:
  """Trains a `vocab_model` vocabulary into `output_dir` (vocab.txt, spm.model, or vocab.json and
  merges.txt); returns the path `load_tokenizer` reads. The vocabulary file is moved in last, so one
  of TRAINED_FILES present is complete. Byte-level BPE is cased: `do_lower_case` does not apply.
  """
  if vocab_model not in VOCAB_MODELS:
    raise ValueError(f"vocab_model {vocab_model!r} is not one of {VOCAB_MODELS}")
  tmp = tempfile.mkdtemp(prefix=".vocab-", dir=output_dir)
  try:   # a failed or interrupted training leaves nothing behind
    if vocab_model == "wordpiece":
      made = [train_wordpiece(sentences, vocab_size, os.path.join(tmp, VOCAB_FILE),
                              do_lower_case=do_lower_case)]
    elif vocab_model in ("unigram", "bpe"):
      made = [train_sentencepiece(sentences, os.path.join(tmp, os.path.splitext(SPM_FILE)[0]), vocab_size,
                                  vocab_model, do_lower_case=do_lower_case)]
    else:
      made = [os.path.join(tmp, MERGES_FILE), train_byte_level_bpe(sentences, vocab_size, tmp)]
    for path in made:
      os.replace(path, os.path.join(output_dir, os.path.basename(path)))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return os.path.join(output_dir, os.path.basename(made[-1]))


def train_sentencepiece(files_or_iter, out_prefix: str, vocab_size: int, model_type: str = "unigram",
                        do_lower_case: bool = True, character_coverage: float = 0.9999,
                        input_sentence_size: int = 2_000_000) -> str:
  """Trains a SentencePiece model with [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.

  Args:
    files_or_iter: text file paths (one sentence per line) or an iterable of sentences.
    model_type: "unigram" or "bpe".
  Returns:
    the path of the `.model` file.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  kwargs = dict(
      model_prefix=out_prefix, vocab_size=vocab_size, model_type=model_type,
      character_coverage=character_coverage, input_sentence_size=0, shuffle_input_sentence=False,
      pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
      pad_piece=PAD, unk_piece=UNK, control_symbols=[CLS, SEP, MASK],
      # Lowercasing happens in the tokenizer, so the model only sees what it will be given.
      normalization_rule_name="nmt_nfkc", hard_vocab_limit=False, minloglevel=2)
  if isinstance(files_or_iter, (list, tuple)) and files_or_iter and all(
      isinstance(f, (str, os.PathLike)) and os.path.isfile(f) for f in files_or_iter):
    files_or_iter = (line.rstrip("\n") for f in files_or_iter for line in open(f, encoding="utf-8"))
  lower = str.lower if do_lower_case else (lambda s: s)
  # Above `input_sentence_size` sentences, a sample of them drawn here with a fixed seed: SentencePiece's own
  # sampling draws another sample, and so another vocabulary, in every process.
  sample = _reservoir((lower(s) for s in files_or_iter if s.strip()), input_sentence_size)
  try:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sample), **kwargs)
  except RuntimeError as e:   # e.g. a vocabulary smaller than the characters the corpus needs
    said = str(e).split("] ", 1)[-1].split(" Increase vocab_size")[0].rstrip(". ")   # its words, not its flags
    raise ValueError(f"SentencePiece could not train a {model_type} vocabulary of {vocab_size}: {said}; raise "
                     "--vocab_size") from None
  return out_prefix + ".model"


def _reservoir(items: Iterable[str], size: int, seed: int = 0) -> list[str]:
  """A uniform sample of `size` of `items` (all of them when fewer, or when `size` <= 0, as SentencePiece's
  input_sentence_size 0), in their order, the same every run."""
  rng, kept = random.Random(seed), []
  for i, item in enumerate(items):
    if len(kept) < size or size <= 0:
      kept.append((i, item))
    else:
      j = rng.randrange(i + 1)
      if j < size:
        kept[j] = (i, item)
  return [item for _, item in sorted(kept)]


_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")  # BERT's words, for printable ASCII


def _count_words(texts: Iterable[str], do_lower_case: bool) -> collections.Counter:
  """Counts of `basic_tokenize` words; printable ASCII (the bulk of most corpora) by one regex."""
  counts = collections.Counter()
  for text in texts:
    if text.isascii() and text.isprintable():
      counts.update(_ASCII_WORD_RE.findall(text.lower() if do_lower_case else text))
    else:
      counts.update(basic_tokenize(text, do_lower_case))
  return counts


def _learn_wordpiece(counts: dict, vocab_size: int, min_count: int, max_alphabet: int) -> list[str]:
  """BPE merges over word pieces, continuation pieces marked `##` (as Hugging Face's WordPiece
  trainer): start from characters, repeatedly add the most frequent adjacent pair as one piece."""
  alphabet = collections.Counter()
  for word, count in counts.items():
    alphabet.update({c: count for c in word})
  chars = {c for c, _ in alphabet.most_common(max_alphabet)}
  words = [([w[0]] + ["##" + c for c in w[1:]], n) for w, n in counts.items() if set(w) <= chars]
  vocab = list(SPECIAL_TOKENS) + sorted({p for pieces, _ in words for p in pieces} - set(SPECIAL_TOKENS))
  if len(vocab) > vocab_size:
    raise ValueError(f"vocab_size {vocab_size} is below the {len(vocab)} special tokens and characters (each also "
                     f"as a ## continuation) the corpus needs: raise --vocab_size (or, calling train_wordpiece, "
                     f"lower max_alphabet from {max_alphabet})")
  pair_counts, where = collections.Counter(), collections.defaultdict(set)
  for i, (pieces, n) in enumerate(words):
    for pair in zip(pieces, pieces[1:]):
      pair_counts[pair] += n
      where[pair].add(i)
  heap = [(-n, pair) for pair, n in pair_counts.items()]
  heapq.heapify(heap)
  while heap and len(vocab) < vocab_size:
    n, pair = heapq.heappop(heap)
    if -n != pair_counts.get(pair):
      continue  # stale entry: the count changed since it was pushed
    if -n < min_count:
      break
    merged = pair[0] + pair[1][2:]
    vocab.append(merged)
    changed = set()
    for i in where.pop(pair):
      pieces, count = words[i]
      new = _merge_pair(pieces, pair, merged)
      for old_pair in zip(pieces, pieces[1:]):
        pair_counts[old_pair] -= count
        changed.add(old_pair)
      for new_pair in zip(new, new[1:]):
        pair_counts[new_pair] += count
        where[new_pair].add(i)
        changed.add(new_pair)
      words[i] = (new, count)
    del pair_counts[pair]
    for p in changed - {pair}:
      heapq.heappush(heap, (-pair_counts[p], p))
  return vocab


def _merge_pair(pieces: list[str], pair: tuple[str, str], merged: str) -> list[str]:
  out, i = [], 0
  while i < len(pieces):
    if i + 1 < len(pieces) and pieces[i] == pair[0] and pieces[i + 1] == pair[1]:
      out.append(merged)
      i += 2
    else:
      out.append(pieces[i])
      i += 1
  return out


def train_wordpiece(texts: Iterable[str], vocab_size: int, out_file: str | None = None,
                    do_lower_case: bool = True, min_count: int = 2, max_alphabet: int = 1000) -> str:
  """Learns a WordPiece vocabulary of at most `vocab_size` (specials first: [PAD]=0 ... [MASK]=4).

  Words are counted after the same `basic_tokenize` the tokenizer applies; pieces are then merged
  BPE-style (`_learn_wordpiece`) until the vocabulary is full or no pair occurs `min_count` times.
  Characters outside the `max_alphabet` most frequent ones are left out (they become [UNK]).

  Returns:
    the path of the written vocab file.
  """
  vocab = _learn_wordpiece(_count_words(texts, do_lower_case), vocab_size, min_count, max_alphabet)
  if out_file is None:
    out_file = os.path.join(tempfile.mkdtemp(prefix="wordpiece-"), VOCAB_FILE)
  with open(out_file, "w", encoding="utf-8") as f:
    f.write("".join(t + "\n" for t in vocab))
  return out_file


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int, out_dir: str | None = None,
                         min_frequency: int = 2) -> str:
  """Learns a byte-level BPE with `tokenizers`' trainer (RoBERTa's recipe, Liu et al. 2019, 4.4: the
  256 bytes, then merges), RoBERTa's special tokens first; the text is kept as it is (cased).

  Returns:
    the path of the written vocab.json; merges.txt lies beside it.
  """
  from tokenizers import models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top

  tk = bpe.byte_level_pipeline(models.BPE())
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                special_tokens=list(bpe.ROBERTA_SPECIALS.values()),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tk.train_from_iterator((t for t in texts if t.strip()), trainer)
  out_dir = out_dir or tempfile.mkdtemp(prefix="byte-bpe-")
  os.makedirs(out_dir, exist_ok=True)
  tk.model.save(out_dir)  # vocab.json and merges.txt
  return os.path.join(out_dir, BPE_VOCAB_FILE)
