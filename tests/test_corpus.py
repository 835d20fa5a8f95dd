"""Corpus readers: formats, byte-range parts, bad-input counters, TFDS without downloads, Shakespeare."""

import collections
import gzip
import json
import random

import hypothesis
import pytest

from bert_jax.data import corpus
from bert_jax.data import sentence_splitter


def _read(spec, **kwargs):
  counters = collections.Counter()
  return list(corpus.read_documents(spec, counters=counters, **kwargs)), counters


def _read_in_parts(spec, n, **kwargs):
  parts = corpus.plan(spec, n, **kwargs)
  assert len(parts) == n
  return [d for group in parts for part in group for d in corpus.read_part(part)]


def test_split_sentences():
  text = ('Mr. Smith went to Washington, D.C. on Jan. 5. He paid $3.50 for "coffee." Then he left! '
          'The U.S. Senate met. It was 5 p.m. The end... Really? "Yes," said J. R. R. Tolkien.\n'
          'New paragraph without a period\nÉl dijo.  Über   alles.')
  assert sentence_splitter.split_sentences(text) == [
      "Mr. Smith went to Washington, D.C. on Jan. 5.", 'He paid $3.50 for "coffee."', "Then he left!",
      "The U.S. Senate met.", "It was 5 p.m.", "The end...", "Really?", '"Yes," said J. R. R. Tolkien.',
      "New paragraph without a period", "Él dijo.", "Über alles."]
  assert sentence_splitter.split_sentences("the U.S. Army. The U.S. He left.") == [
      "the U.S. Army.", "The U.S.", "He left."]
  assert sentence_splitter.split_sentences("He said no. Then he left. See No. 5 and pp. 10-12. Vol. 2 is out.") == [
      "He said no.", "Then he left.", "See No. 5 and pp. 10-12.", "Vol. 2 is out."]
  assert sentence_splitter.split_sentences("") == [] and sentence_splitter.split_sentences(" \n\n ") == []


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(hypothesis.strategies.lists(hypothesis.strategies.sampled_from(
    list("aZ9 .!?\"')(\n\u00e9\u201c\u201d\u2026") + ["Mr", "U.S", "The", " "])))
def test_split_sentences_keeps_every_character(pieces):
  text = "".join(pieces)
  sentences = sentence_splitter.split_sentences(text)
  assert "".join("".join(sentences).split()) == "".join(text.split())
  assert all(s and s == s.strip() and "\n" not in s for s in sentences)


def _random_documents(n, seed=0):
  rng = random.Random(seed)
  words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
  return [[" ".join(rng.choices(words, k=rng.randint(1, 12))).capitalize() + "."
           for _ in range(rng.randint(1, 6))] for _ in range(n)]


def test_text_format_and_byte_range_parts(tmp_path):
  documents = _random_documents(300)
  lines = []
  for i, document in enumerate(documents):
    lines += document + [""] * (1 + i % 3)  # one to three blank lines between documents
  path = tmp_path / "corpus.txt"
  path.write_text("\n".join(lines), encoding="utf-8")
  got, counters = _read(str(path))
  assert got == documents
  assert counters["single_sentence_documents"] == sum(len(d) == 1 for d in documents)
  for n in (2, 3, 7, 50):
    assert _read_in_parts(str(path), n) == documents, n


def test_json_lines_bad_input_counted(tmp_path):
  documents = _random_documents(120, seed=1)
  rows = [json.dumps({"body": " ".join(d), "id": i}).encode() for i, d in enumerate(documents)]
  rows[10:10] = [b"{not json", json.dumps({"other": "x"}).encode(), json.dumps({"body": "   "}).encode(),
                 b'{"body": "Caf\xe9 au lait. Second one."}',  # Latin-1, not UTF-8
                 json.dumps({"body": "Long line. " + "Y" * 300}).encode()]
  path = tmp_path / "corpus.jsonl"
  path.write_bytes(b"\n".join(rows) + b"\n")
  got, counters = _read(str(path), text_key="body", max_sentence_chars=200)
  assert got[:10] == documents[:10] and got[-110:] == documents[10:]
  assert got[10] == ["Caf\ufffd au lait.", "Second one."]  # undecodable byte replaced, counted
  assert got[11] == ["Long line."]
  assert counters["bad_json_lines"] == 1 and counters["missing_text_field"] == 1
  assert counters["empty_documents"] == 1 and counters["undecodable_lines"] == 1
  assert counters["long_lines"] == 1
  for n in (2, 5, 13):
    parts = corpus.plan(str(path), n, text_key="body")
    read = lambda p: corpus.read_part(p, text_key="body", max_sentence_chars=200)  # noqa: E731
    assert [d for g in parts for p in g for d in read(p)] == got


def test_json_lines_under_another_name_are_named_not_read_as_plain_text(tmp_path):
  (tmp_path / "news.jl").write_text("\n" + json.dumps({"text": "One. Two."}) + "\n")
  with pytest.raises(ValueError, match=r"news.jl starts with a JSON object but its name does not end in .jsonl"):
    corpus.plan(str(tmp_path / "news.jl"), 2)
  (tmp_path / "plain.txt").write_text("{a brace} starts this sentence.\n[1, 2] is a list.\n")   # not an object
  assert _read(str(tmp_path / "plain.txt"))[0] == [["{a brace} starts this sentence.", "[1, 2] is a list."]]


def test_gzip_globs_directories_and_binary_files(tmp_path):
  documents = _random_documents(40, seed=2)
  text = "\n\n".join("\n".join(d) for d in documents)
  (tmp_path / "a").mkdir()
  with gzip.open(tmp_path / "a" / "part1.txt.gz", "wt", encoding="utf-8") as f:
    f.write(text)
  with gzip.open(tmp_path / "a" / "part2.jsonl.gz", "wt", encoding="utf-8") as f:
    f.write("".join(json.dumps({"text": " ".join(d)}) + "\n" for d in documents))
  (tmp_path / "a" / "image.bin").write_bytes(b"\x89PNG\x00\x00\x01binary")
  (tmp_path / "a" / ".hidden").write_text("Not read.\n")
  got, counters = _read(str(tmp_path / "a"))
  assert got == documents + documents and counters["binary_files"] == 1
  got, counters = _read(str(tmp_path / "a" / "*.gz"))
  assert got == documents + documents and counters["binary_files"] == 0
  assert _read_in_parts(str(tmp_path / "a" / "*.gz"), 4) == documents + documents
  with pytest.raises(FileNotFoundError):
    _read(str(tmp_path / "nothing-*.txt"))


def test_gzip_files_go_whole_to_the_emptiest_parts_and_plain_bytes_level_them():
  """A .gz file is read whole: several of them spread over the parts, none left empty while files remain;
  plain files' bytes fill up the parts with fewer .gz bytes; without .gz files, the cuts are at k*T/n."""
  sized = lambda parts, sizes: [sum((sizes[r.path] if r.end is None else r.end) - r.start  # noqa: E731
                                    for r in p) for p in parts]
  gz = {"a.gz": 300, "b.gz": 200, "c.gz": 200, "d.gz": 100}
  assert sized(corpus._cut_files(list(gz.items()), 2), gz) == [400, 400]
  assert sized(corpus._cut_files(list(gz.items()), 4), gz) == [300, 200, 200, 100]
  mixed = {"big.jsonl.gz": 600, "x.txt": 500, "y.txt": 400}
  parts = corpus._cut_files(list(mixed.items()), 3)
  assert [r.path for r in parts[0]] == ["big.jsonl.gz"] and sized(parts, mixed) == [600, 450, 450]
  plain = {"x.txt": 1000, "y.txt": 1001}
  parts = corpus._cut_files(list(plain.items()), 3)
  cuts = [k * 2001 // 3 for k in range(4)]
  assert sized(parts, plain) == [b - a for a, b in zip(cuts, cuts[1:])]
  assert parts[1] == [corpus.FileRange("x.txt", 667, None), corpus.FileRange("y.txt", 0, 334)]
  assert sum(not p for p in corpus._cut_files([("only.gz", 10)], 3)) == 2   # prepare logs them


def test_absurdly_long_lines_are_skipped_without_reading_them_whole(tmp_path, monkeypatch):
  monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 100)
  path = tmp_path / "corpus.txt"
  path.write_text("First.\nSecond.\n" + "x" * 1000 + "\nThird.\n\n" + "y" * 250 + "\n\nNext doc.\n")
  documents, counters = _read(str(path))
  assert documents == [["First.", "Second.", "Third."], ["Next doc."]]
  assert counters["long_lines"] == 2
  assert _read_in_parts(str(path), 7) == documents


def test_damaged_gzip_and_byte_order_mark(tmp_path):
  rows = "".join(json.dumps({"text": f"Sentence {i}. Another one."}) + "\n" for i in range(2000))
  data = gzip.compress(rows.encode())
  (tmp_path / "truncated.jsonl.gz").write_bytes(data[:len(data) // 2])
  (tmp_path / "not-gzip.jsonl.gz").write_bytes(b"plain text\n")
  (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": "With a BOM. Read."}).encode())
  documents, counters = _read(str(tmp_path))
  assert documents[0] == ["With a BOM.", "Read."]
  assert 500 < len(documents) - 1 < 2000
  assert documents[1:] == [[f"Sentence {i}.", "Another one."] for i in range(len(documents) - 1)]
  assert counters["truncated_files"] == 1 and counters["binary_files"] == 1


def test_shakespeare_from_the_installed_package():
  plays = corpus.shakespeare_plays()
  assert len(plays) == 38 and "tragedies/othello.md" in plays
  documents, counters = _read(corpus.SHAKESPEARE)
  assert 700 < len(documents) < 900  # one per scene (prologues and epilogues included)
  sentences = [s for d in documents for s in d]
  assert len(sentences) > 40_000
  assert not any(c in s for s in sentences for c in "*_[]#\\")  # markup and stage directions gone
  assert not any(s.startswith(("Exit", "Exeunt")) for s in sentences)
  assert sum(s.startswith("Enter ") for s in sentences) <= 3  # "Enter our gates" is spoken
  othello = next(d for d in documents if d[0].startswith("Tush! never tell me"))
  assert othello[0].endswith("shouldst know of this.")
  assert _read_in_parts(corpus.SHAKESPEARE, 5) and counters["empty_documents"] <= 5


def test_tfds_not_prepared_is_a_clear_error_not_a_download(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"not prepared in .*tfds build imdb_reviews"):
    _read("tfds:imdb_reviews:train:text", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="explicit data_dir"):
    _read("tfds:imdb_reviews")
  assert corpus.parse_tfds_spec("tfds:wikipedia/20230601.en") == ("wikipedia/20230601.en", "train", "text")
  assert corpus.parse_tfds_spec("tfds:x:validation:body") == ("x", "validation", "body")


def test_tfds_mock_data_with_prepared_metadata(tmp_path):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  builder = tfds.builder("imdb_reviews", data_dir=str(tmp_path))
  builder.data_path.mkdir(parents=True)
  builder.info.write_to_directory(builder.data_path)  # metadata only: "prepared", no records
  with tfds.testing.mock_data(num_examples=7, data_dir=str(tmp_path)):
    documents, _ = _read("tfds:imdb_reviews:train:text", data_dir=str(tmp_path))
  assert len(documents) == 7 and all(isinstance(s, str) for d in documents for s in d)


def prepare_tiny_tfds_dataset(data_dir: str) -> str:
  """Prepares a 12-document TFDS dataset in `data_dir` (generated here, nothing downloaded); its spec."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  global _TINY_BUILDER
  if _TINY_BUILDER is None:

    class BertJaxTinyText(tfds.core.GeneratorBasedBuilder):
      VERSION = tfds.core.Version("1.0.0")

      def _info(self):
        features = tfds.features.FeaturesDict({"body": tfds.features.Text()})
        return tfds.core.DatasetInfo(builder=self, features=features)

      def _split_generators(self, dl_manager):
        del dl_manager  # nothing to download
        return {"train": self._generate_examples()}

      def _generate_examples(self):
        for i in range(12):
          yield i, {"body": f"Document {i} starts here. It has two sentences."}

    _TINY_BUILDER = BertJaxTinyText
  _TINY_BUILDER(data_dir=data_dir).download_and_prepare()
  return "tfds:bert_jax_tiny_text:train:body"


_TINY_BUILDER = None


def test_tfds_real_prepared_dataset_and_even_parts(tmp_path):
  spec = prepare_tiny_tfds_dataset(str(tmp_path))
  documents, _ = _read(spec, data_dir=str(tmp_path))
  expected = [[f"Document {i} starts here.", "It has two sentences."] for i in range(12)]
  assert sorted(documents) == sorted(expected)
  assert sorted(_read_in_parts(spec, 3, data_dir=str(tmp_path))) == sorted(documents)
