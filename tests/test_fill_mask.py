"""fill-mask: the same top-k from a pretraining run, its Hugging Face export and its Google TF export; the
clear error without an MLM head; the command end to end."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from bert_jax import checkpoint_loader
from bert_jax.interop import checkpoints_hf
from bert_jax.interop import checkpoints_tf
from bert_jax.tools import fill_mask
from conftest import shared_path
from test_checkpoint_loader import trained_run

pytestmark = pytest.mark.slow  # `trained_run`, unless test_checkpoint_loader has trained it already
TEXTS = ["the king keeps the [MASK] .", "the [MASK] keeps the [MASK] ."]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  return checkpoint_loader.load(trained_run(tmp_path_factory))


@pytest.fixture(scope="module")
def expected(pretrained):
  return fill_mask.predict(*pretrained, TEXTS, top_k=5)


def test_predictions_from_a_pretraining_run(expected):
  assert [len(masks) for masks in expected] == [1, 2]
  for masks in expected:
    for candidates in masks:
      tokens, probs = zip(*candidates)
      assert len(candidates) == 5 and all(isinstance(t, str) for t in tokens)
      assert list(probs) == sorted(probs, reverse=True) and probs[-1] > 0.0 and sum(probs) <= 1.0 + 1e-6
  assert fill_mask.format_predictions(TEXTS, expected).splitlines()[:2] == [
      TEXTS[0], "  [MASK] 1: " + "  ".join(f"{t} {p:.3f}" for t, p in expected[0][0])]


def test_hugging_face_export_with_the_mlm_head_gives_the_same_top_k(pretrained, expected, tmp_path):
  cfg, params, tok = pretrained
  checkpoints_hf.save_hf(tmp_path, cfg, params, vocab_file=tok.vocab_file)
  assert checkpoint_loader.find(tmp_path).kind == "hf"
  assert fill_mask.predict(*checkpoint_loader.load(tmp_path), TEXTS, top_k=5) == expected
  # As BertForMaskedLM saves it: no pooler, no next-sentence head.
  state = {k: v for k, v in load_file(str(tmp_path / "model.safetensors")).items()
           if not k.startswith(("bert.pooler.", "cls.seq_relationship."))}
  save_file(state, str(tmp_path / "model.safetensors"))
  _, masked_lm, _ = loaded = checkpoint_loader.load(tmp_path)
  assert set(masked_lm) == {"bert", "mlm"}
  assert fill_mask.predict(*loaded, TEXTS, top_k=5) == expected


def test_google_tf_checkpoint_with_the_mlm_head_gives_the_same_top_k(pretrained, expected, tmp_path):
  pytest.importorskip("tensorflow")
  cfg, params, tok = pretrained
  checkpoints_tf.save_tf(tmp_path / "bert_model.ckpt", cfg, params)
  shutil.copyfile(tok.vocab_file, tmp_path / "vocab.txt")
  for path in (tmp_path / "bert_model.ckpt", tmp_path):
    assert checkpoint_loader.find(path).kind == "tf"
    assert fill_mask.predict(*checkpoint_loader.load(path), TEXTS, top_k=5) == expected


def test_no_mlm_head_or_no_mask_are_clear_errors(pretrained):
  cfg, params, tok = pretrained
  with pytest.raises(ValueError, match=r"has no MLM head \(its params hold \['bert'\]"):
    fill_mask.predict(cfg, {"bert": params["bert"]}, tok, TEXTS)
  with pytest.raises(ValueError, match="no \\[MASK\\] in 'the king'"):
    fill_mask.predict(cfg, params, tok, ["the king"])
  with pytest.raises(ValueError, match="more than the model's 32 positions"):
    fill_mask.predict(cfg, params, tok, ["the king " * 20 + "[MASK]"])
  with pytest.raises(ValueError, match=r"left-to-right \(causal\) language model: its head predicts the next"):
    fill_mask.predict(dataclasses.replace(cfg, causal=True), params, tok, TEXTS)   # an LTR run's


def test_minilm_has_no_mlm_head():
  cfg, params, tok = checkpoint_loader.load(shared_path("minilm"))  # an HF BertModel: encoder only
  with pytest.raises(ValueError, match="no MLM head"):
    fill_mask.predict(cfg, params, tok, ["paris is the [MASK] of france ."])


def test_command_with_a_relative_checkpoint_path(tmp_path_factory, expected, tmp_path):
  run = trained_run(tmp_path_factory)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  command = [sys.executable, "-m", "bert_jax.cli", "fill-mask", f"--checkpoint={os.path.basename(run)}",
             f"--output={tmp_path / 'new' / 'out.jsonl'}", *TEXTS]   # a folder not there yet
  result = subprocess.run(command, cwd=os.path.dirname(run), env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.splitlines()[0] == TEXTS[0] and result.stdout.count("[MASK] 1:") == 2
  records = [json.loads(line) for line in (tmp_path / "new" / "out.jsonl").read_text().splitlines()]
  assert [r["text"] for r in records] == TEXTS
  for record, masks in zip(records, expected):
    got = [[(c["token"], c["prob"]) for c in candidates] for candidates in record["masks"]]
    assert [[t for t, _ in c] for c in got] == [[t for t, _ in c] for c in masks]
    np.testing.assert_allclose([[p for _, p in c] for c in got], [[p for _, p in c] for c in masks], rtol=1e-6)


@pytest.mark.parametrize("family, pieces, shown", [
    ("roberta", ["Ġyou", "Ġmaterial"], [" you", " material"]),   # byte-level BPE: a word's space shown as one
    ("albert", ["▁you", "▁material"], ["you", "material"]),      # SentencePiece: the word
    ("minilm", ["paris", "##ing"], ["paris", "##ing"]),           # WordPiece: a later piece says it is one
])
def test_predictions_are_spelled_as_text_not_as_vocabulary_pieces(family, pieces, shown):
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  path = shared_path("minilm") if family == "minilm" else shared_path("families", family)
  tokenizer = tokenizer_lib.load_tokenizer(str(path))
  assert fill_mask.spelled(tokenizer, tokenizer.convert_tokens_to_ids(pieces)) == shown
