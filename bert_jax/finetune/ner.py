"""Token tagging: CoNLL-2003 named entity recognition (Tjong Kim Sang & De Meulder 2003), and any tag set
in the same file format (the generic `tagging` task: biomedical or legal NER, part of speech, ...).

The files hold one word per line (`word POS chunk NER`), a blank line between sentences and
`-DOCSTART-` lines between documents. Tags are IOB1 in the original release (B- only between two
adjacent entities of one type); by default they are converted to BIO (IOB2) on reading, which leaves
the entities, and so the entity-level scores, unchanged. As in Devlin et al. 2019, 5.3, a word's label
sits on its first sub-token; the other sub-tokens carry weight 0 and are not predicted.

Generic tagging reads the tag from `tag_column` (default the last) as written; its tag set is the
training file's. Span F1 (conlleval / seqeval) is reported when the tags are BIO, token accuracy always.
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
  tags: tuple[str, ...] | None  # None: text to tag (no gold tags)


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


def is_bio(tags) -> bool:
  """Whether a tag set is "O" plus B-/I-/E-/S- prefixed types, so that entity spans can be scored."""
  tags = set(tags) - {"O"}
  return bool(tags) and all(len(t) > 2 and t[:2] in ("B-", "I-", "E-", "S-") for t in tags)


def parse_conll(lines, scheme: str = "bio", tag_column: int = -1, path: str = "<text>",
                tag_flag: str = "--config.task_opts.tag_column") -> list[NerExample]:
  """Sentences of CoNLL text: first column the word, column `tag_column` (default the last) the tag.

  `scheme` "bio" converts IOB1 tags to BIO, "iob1" or "" keeps them as written. A line with one column
  only, or without the tag column, is a DataError naming `path`, the line and `tag_flag` (the caller's option
  that sets the column).
  """
  sentences, words, tags = [], [], []
  for n, line in enumerate(list(lines) + [""], 1):
    line = line.strip()
    if not line or line.startswith("-DOCSTART-"):
      if words:
        sentences.append(NerExample(str(len(sentences)), tuple(words),
                                    tuple(iob1_to_bio(tags) if scheme == "bio" else tags)))
        words, tags = [], []
      continue
    columns = line.split()
    if len(columns) < 2 or not -len(columns) < tag_column < len(columns) or tag_column == 0:
      raise readers.DataError(
          f"{path}, line {n}: {len(columns)} column(s) {columns[:4]}; each line needs the token (first column) "
          f"and its tag (column {tag_column}; set {tag_flag}), a blank line between sentences.")
    words.append(columns[0])
    tags.append(columns[tag_column])
  return sentences


def locate(split: str, source: str) -> str:
  """The file of `split`: `source` if a file, else in the directory `<split>.txt` or the common
  distributions' names (`valid.txt`, `eng.testa` ...), then any `<split>.*`."""
  if readers.is_tfds(source):
    raise readers.DataError("tagging tasks read CoNLL-style text files; set --config.data_dir to their directory")
  if os.path.isfile(source):
    return source
  if not os.path.isdir(source):
    raise FileNotFoundError(f"{source or '(data_dir not set)'} does not exist: set --config.data_dir to the "
                            f"directory holding {split}.txt (or to the file itself)")
  names = _SPLIT_FILES.get(split, (f"{split}.txt",)) + tuple(
      sorted(n for n in os.listdir(source) if n.split(".")[0] == split))
  found = [os.path.join(source, n) for n in names if os.path.isfile(os.path.join(source, n))]
  if not found:
    raise FileNotFoundError(f"no {split} file ({', '.join(names[:3])} or {split}.*) in {source!r}")
  return found[0]


def read(split: str, source: str, data_dir: str | None = None, scheme: str = "bio"):
  """`split` from a CoNLL file, or a directory with `<split>.txt` (also `valid.txt`, `eng.testa`...)."""
  del data_dir
  if readers.is_tfds(source):
    raise ValueError("conll2003 reads the original text files; give their path")
  path = locate(split, source)
  return parse_conll(readers.read_text(path).splitlines(), scheme, path=path,
                     tag_flag="CoNLL-2003's tag is its last column; a generic tagging task (`tagging:`) takes "
                              "--config.task_opts.tag_column")


def read_columns(split: str, source: str, data_dir: str | None = None, tag_column: int = -1):
  """`split` of a generic tagging task: tags as written in column `tag_column` (see `locate`)."""
  del data_dir
  path = locate(split, source)
  return parse_conll(readers.read_text(path).splitlines(), scheme="", tag_column=tag_column, path=path)


def featurize(task, examples, tokenizer, max_seq_length, **opts):
  """`[CLS] sub-tokens [SEP]` per run of whole words that fits the window (`windows`): a sentence longer than
  one window becomes several features, so that every word is trained on and tagged (`decode` joins them), as
  `bert-jax predict` tags it.

  Returns:
    features: input_ids, input_mask, segment_ids, label_ids int32 [N, L]; label_weights float32
      [N, L], 1.0 on each word's first sub-token.
    meta: example_index [N], the example of each feature (a sentence's runs in order); word_positions, one int
      array per feature: the first sub-token's position of each of its words.
  """
  del opts
  runs, owners = windows(examples, tokenizer, max_seq_length)
  features, meta = featurize_truncated(task, runs, tokenizer, max_seq_length)
  return features, dict(meta, example_index=np.asarray(owners, np.int64))


def featurize_truncated(task, examples, tokenizer, max_seq_length):
  """`[CLS] sub-tokens [SEP]` per sentence, one feature each; words past the window are dropped (probing's
  inputs, and each of `featurize`'s runs, which fit). `meta["word_positions"]` is -1 for words that did not
  fit."""
  index = {name: i for i, name in enumerate(task.label_names)}
  n = len(examples)
  features = {k: np.zeros([n, max_seq_length], np.int32)
              for k in ("input_ids", "input_mask", "segment_ids", "label_ids")}
  features["label_weights"] = np.zeros([n, max_seq_length], np.float32)
  features["input_ids"][:] = tokenizer.pad_id
  word_positions = []
  for row, ex in enumerate(examples):
    ids, positions = [tokenizer.cls_id], np.full([len(ex.words)], -1, np.int64)
    for w, (word, tag) in enumerate(zip(ex.words, ex.tags or [None] * len(ex.words))):
      pieces = word_pieces(tokenizer, word)
      if len(ids) + len(pieces) > max_seq_length - 1:
        if len(ids) > 1:
          break
        pieces = pieces[:max_seq_length - 2]   # a first word longer than the window: its first pieces
      positions[w] = len(ids)
      features["label_ids"][row, len(ids)] = 0 if tag is None else index[tag]
      features["label_weights"][row, len(ids)] = 1.0
      ids.extend(pieces)
    ids.append(tokenizer.sep_id)
    features["input_ids"][row, :len(ids)] = ids
    features["input_mask"][row, :len(ids)] = 1
    word_positions.append(positions)
  return features, {"example_index": np.arange(n), "word_positions": word_positions}


def word_pieces(tokenizer, word: str) -> list[int]:
  """A word's sub-token ids, spelled as in the running text (byte-level BPE's "Ġ"); at least one, since every
  word needs a first sub-token to be tagged at."""
  return tokenizer.encode(tokenizer.space_prefix + word) or [tokenizer.unk_id]


def windows(examples, tokenizer, max_seq_length: int) -> tuple[list, list[int]]:
  """Each example cut into runs of consecutive whole words that each fit `featurize_truncated`'s window, so that
  every word gets a tag of the model's (one window would drop the words past it: scored as "O", which need not
  be a tag of the model's at all). Returns (the runs, as examples of their own; the index in `examples` of
  the one each run comes from); `join` puts their predictions back together."""
  runs, owners = [], []
  for i, ex in enumerate(examples):
    start, used = 0, 2   # [CLS] and [SEP]
    for w, word in enumerate(ex.words):
      n = len(word_pieces(tokenizer, word))
      if used + n > max_seq_length and w > start:
        runs.append(_run(ex, start, w))
        owners.append(i)
        start, used = w, 2
      used += n
    runs.append(_run(ex, start, len(ex.words)))
    owners.append(i)
  return runs, owners


def _run(ex, start: int, stop: int):
  return dataclasses.replace(ex, words=ex.words[start:stop], tags=None if ex.tags is None else ex.tags[start:stop])


def join(tags: list[list[str]], owners: list[int]) -> list[list[str]]:
  """The tags of `windows`' runs, each example's runs joined in order."""
  joined = [[] for _ in range(max(owners, default=-1) + 1)]
  for run_tags, owner in zip(tags, owners):
    joined[owner] += run_tags
  return joined


def decode(task, predictions, meta) -> list[list[str]]:
  """Word-level tags per example: argmax at each word's first sub-token, its features' runs joined."""
  best = np.asarray(predictions).argmax(-1)  # [N, L]
  tags = []
  for row, positions in enumerate(meta["word_positions"]):
    tags.append([task.label_names[best[row, p]] if p >= 0 else "O" for p in positions])
  return join(tags, list(meta["example_index"]))


def evaluate(task, predictions, examples, meta, **opts) -> dict:
  """Entity-level precision/recall/F1 (conlleval), per-type F1, token accuracy; token accuracy only
  when the tags are not BIO (the task option `span_f1` False)."""
  del opts
  return score(task, [e.tags for e in examples], decode(task, predictions, meta))


def score(task, gold, predicted) -> dict:
  """The task's scores of predicted tag sequences against gold ones (see `evaluate`)."""
  scores = metrics.entity_scores(gold, predicted)
  return scores if task.options.get("span_f1", True) else {"token_accuracy": scores["token_accuracy"]}


def write_predictions(task, path, predictions, examples, meta, **opts) -> None:
  """conlleval's input: `word gold predicted` per line, a blank line after each sentence."""
  del opts
  with open(path, "w", encoding="utf-8") as f:
    for ex, tags in zip(examples, decode(task, predictions, meta), strict=True):
      f.writelines(f"{w} {g} {p}\n" for w, g, p in zip(ex.words, ex.tags or ["-"] * len(tags), tags))
      f.write("\n")
