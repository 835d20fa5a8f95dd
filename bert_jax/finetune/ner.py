"""CoNLL-2003 named entity recognition (Tjong Kim Sang & De Meulder 2003) as token tagging.

The files hold one word per line (`word POS chunk NER`), a blank line between sentences and
`-DOCSTART-` lines between documents. Tags are IOB1 in the original release (B- only between two
adjacent entities of one type); by default they are converted to BIO (IOB2) on reading, which leaves
the entities, and so the entity-level scores, unchanged. As in Devlin et al. 2019, 5.3, a word's label
sits on its first sub-token; the other sub-tokens carry weight 0 and are not predicted.
"""

import dataclasses
import os

import numpy as np

from bert_jax.finetune import metrics, readers

LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
# Where the common distributions put each split (`<split>.txt` is tried first).
_SPLIT_FILES = {"train": ("train.txt", "eng.train"), "dev": ("dev.txt", "valid.txt", "eng.testa"),
                "test": ("test.txt", "eng.testb")}


@dataclasses.dataclass(frozen=True)
class NerExample:
  """One sentence: its words and their NER tags."""
  guid: str
  words: tuple[str, ...]
  tags: tuple[str, ...]


def label_names(scheme: str = "bio") -> tuple[str, ...]:
  """CoNLL-2003's tags; IOB1 and BIO use the same set (IOB1 needs B- between adjacent entities)."""
  if scheme not in ("bio", "iob1"):
    raise ValueError(f"tag_scheme must be 'bio' or 'iob1', not {scheme!r}")
  return LABELS


def iob1_to_bio(tags) -> list[str]:
  """IOB1 -> BIO: an I-X that does not continue an X entity starts one (B-X)."""
  out, prev = [], "O"
  for tag in tags:
    if tag.startswith("I-") and prev[2:] != tag[2:]:
      tag = "B-" + tag[2:]
    out.append(tag)
    prev = tag
  return out


def parse_conll(lines, scheme: str = "bio") -> list[NerExample]:
  """Sentences of CoNLL text: first column the word, last column the NER tag."""
  sentences, words, tags = [], [], []
  for line in list(lines) + [""]:
    line = line.strip()
    if not line or line.startswith("-DOCSTART-"):
      if words:
        sentences.append(NerExample(str(len(sentences)), tuple(words),
                                    tuple(iob1_to_bio(tags) if scheme == "bio" else tags)))
        words, tags = [], []
      continue
    columns = line.split()
    words.append(columns[0])
    tags.append(columns[-1])
  return sentences


def read(split: str, source: str, data_dir: str | None = None, scheme: str = "bio"):
  """`split` from a CoNLL file, or a directory with `<split>.txt` (also `valid.txt`, `eng.testa`...)."""
  del data_dir
  if readers.is_tfds(source):
    raise ValueError("conll2003 reads the original text files; give their path")
  path = source
  if os.path.isdir(source):
    found = [os.path.join(source, n) for n in _SPLIT_FILES.get(split, (f"{split}.txt",))
             if os.path.isfile(os.path.join(source, n))]
    if not found:
      raise FileNotFoundError(f"no {split} file ({_SPLIT_FILES.get(split)}) in {source!r}")
    path = found[0]
  with open(path, encoding="utf-8") as f:
    return parse_conll(f, scheme)


def featurize(task, examples, tokenizer, max_seq_length, **opts):
  """`[CLS] sub-tokens [SEP]` per sentence; words past the window are dropped (scored as "O").

  Returns:
    features: input_ids, input_mask, segment_ids, label_ids int32 [N, L]; label_weights float32
      [N, L], 1.0 on each word's first sub-token.
    meta: example_index [N]; word_positions, one int array per sentence: the first sub-token's
      position of each word, -1 for words that did not fit.
  """
  del opts
  index = {name: i for i, name in enumerate(task.label_names)}
  n = len(examples)
  features = {k: np.zeros([n, max_seq_length], np.int32)
              for k in ("input_ids", "input_mask", "segment_ids", "label_ids")}
  features["label_weights"] = np.zeros([n, max_seq_length], np.float32)
  features["input_ids"][:] = tokenizer.pad_id
  word_positions = []
  for row, ex in enumerate(examples):
    ids, positions = [tokenizer.cls_id], np.full([len(ex.words)], -1, np.int64)
    for w, (word, tag) in enumerate(zip(ex.words, ex.tags)):
      pieces = tokenizer.encode(word) or [tokenizer.unk_id]  # every word needs a first sub-token
      if len(ids) + len(pieces) > max_seq_length - 1:
        break
      positions[w] = len(ids)
      features["label_ids"][row, len(ids)] = index[tag]
      features["label_weights"][row, len(ids)] = 1.0
      ids.extend(pieces)
    ids.append(tokenizer.sep_id)
    features["input_ids"][row, :len(ids)] = ids
    features["input_mask"][row, :len(ids)] = 1
    word_positions.append(positions)
  return features, {"example_index": np.arange(n), "word_positions": word_positions}


def decode(task, predictions, meta) -> list[list[str]]:
  """Word-level tags per feature: argmax at each word's first sub-token, "O" past the window."""
  best = np.asarray(predictions).argmax(-1)  # [N, L]
  tags = []
  for row, positions in enumerate(meta["word_positions"]):
    tags.append([task.label_names[best[row, p]] if p >= 0 else "O" for p in positions])
  return tags


def evaluate(task, predictions, examples, meta, **opts) -> dict:
  """Entity-level precision/recall/F1 (conlleval), per-type F1, token accuracy."""
  del opts
  predicted = decode(task, predictions, meta)
  gold = [examples[i].tags for i in meta["example_index"]]
  return metrics.entity_scores(gold, predicted)


def write_predictions(task, path, predictions, examples, meta, **opts) -> None:
  """conlleval's input: `word gold predicted` per line, a blank line after each sentence."""
  del opts
  with open(path, "w", encoding="utf-8") as f:
    for i, tags in zip(meta["example_index"], decode(task, predictions, meta)):
      ex = examples[i]
      f.writelines(f"{w} {g} {p}\n" for w, g, p in zip(ex.words, ex.tags, tags))
      f.write("\n")
