"""`bert-jax embed` end to end on the MiniLM checkpoint, against transformers' reference outputs, and on a
bert_jax pretraining run."""

import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import checkpoint_loader
from bert_jax.tools import embed
from bert_jax.models import encoder as model
from test_checkpoint_loader import trained_run
from tests.conftest import REPO_ROOT
from tests.conftest import assert_one_line_errors
from tests.conftest import shared_path

TOLERANCE = 1e-4


def run_cli(*args):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-m", "bert_jax.cli", "embed", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def assert_matches_reference(out, ref, i, j):
  """Output example i against reference example j."""
  np.testing.assert_array_equal(out[f"input_ids_{i}"], ref[f"input_ids_{j}"])
  for key in ("hidden_states", "last_hidden_state", "pooler_output"):
    err = np.abs(out[f"{key}_{i}"] - ref[f"{key}_{j}"]).max()
    assert err <= TOLERANCE, (key, i, err)


@pytest.mark.slow
def test_embed_command_on_input_ids_and_text(tmp_path):
  ckpt = shared_path("minilm")
  ref = np.load(ckpt / "hf_reference.npz")
  lines = [json.dumps({"input_ids": ref[f"input_ids_{j}"].tolist(),
                       "token_type_ids": ref[f"token_type_ids_{j}"].tolist()}) for j in range(8)]
  # The same sentences as text (WordPiece from the checkpoint's vocab.txt).
  for pair in json.loads(str(ref["sentences"])):
    lines.append(json.dumps(dict(zip(("text", "text_b"), pair))))
  (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
  run_cli(f"--checkpoint={ckpt}", f"--input={tmp_path / 'in.jsonl'}", f"--output={tmp_path / 'out.npz'}",
          "--batch_size=4")
  out = np.load(tmp_path / "out.npz")
  assert out["hidden_states_0"].shape == ref["hidden_states_0"].shape == (7, 12, 384)
  for j in range(8):
    assert_matches_reference(out, ref, j, j)
    assert_matches_reference(out, ref, 8 + j, j)


def test_read_examples_errors_and_defaults():
  examples = embed.read_examples(['{"input_ids": [101, 7, 102]}', "", '{"input_ids": [101, 102], '
                                  '"token_type_ids": [0, 1]}'])
  assert len(examples) == 2
  np.testing.assert_array_equal(examples[0][1], [0, 0, 0])
  with pytest.raises(ValueError, match="line 1: text input needs a vocabulary"):
    embed.read_examples(['{"text": "hello"}'])
  with pytest.raises(ValueError, match="line 1: expected a `text` or an `input_ids`"):
    embed.read_examples(['{"ids": [1]}'])
  with pytest.raises(ValueError, match="more than max_length 2"):
    embed.read_examples(['{"input_ids": [1, 2, 3]}'], max_length=2)
  with pytest.raises(ValueError, match="3 input_ids but 2 token_type_ids"):
    embed.read_examples(['{"input_ids": [1, 2, 3], "token_type_ids": [0, 0]}'])
  with pytest.raises(ValueError, match=r"input, line 2: not JSON \(Expecting value\)"):
    embed.read_examples(['{"input_ids": [1]}', "plain text"])
  with pytest.raises(ValueError, match="line 1: a JSON list, not an object"):
    embed.read_examples(["[1, 2]"])
  # Ids past the model's tables would embed as NaN: refused with the model's config, naming the line.
  cfg = model.BertConfig(vocab_size=200, type_vocab_size=2)
  assert len(embed.read_examples(['{"input_ids": [0, 199], "token_type_ids": [0, 1]}'], cfg=cfg)) == 1
  with pytest.raises(ValueError, match=r"input, line 2: input_ids holds 200, but the model has 200 ids .*\(0 to 199\)"):
    embed.read_examples(['{"input_ids": [1]}', '{"input_ids": [1, 200]}'], cfg=cfg)
  with pytest.raises(ValueError, match="line 1: input_ids holds -1"):
    embed.read_examples(['{"input_ids": [-1]}'], cfg=cfg)
  with pytest.raises(ValueError, match="line 1: token_type_ids holds 5, but the model has 2 token types"):
    embed.read_examples(['{"input_ids": [1, 2], "token_type_ids": [0, 5]}'], cfg=cfg)
  no_types = model.BertConfig(vocab_size=200, type_vocab_size=0)   # DistilBERT's: the types are not read
  assert len(embed.read_examples(['{"input_ids": [1, 2], "token_type_ids": [0, 5]}'], cfg=no_types)) == 1


def test_a_text_pair_for_a_model_of_one_token_type_names_the_line(tmp_path):
  """RoBERTa's models have one token type: the tokenizer's second segment would embed as NaN."""
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
  tokenizer = tokenizer_lib.load_tokenizer(str(tmp_path / "vocab.txt"))
  one_type = model.BertConfig(vocab_size=7, type_vocab_size=1)
  assert len(embed.read_examples(['{"text": "a b"}'], tokenizer, cfg=one_type)) == 1
  with pytest.raises(ValueError, match="input, line 2: a text_b pair, but the model has one token type"):
    embed.read_examples(['{"text": "a"}', '{"text": "a", "text_b": "b"}'], tokenizer, cfg=one_type)


def test_an_input_with_no_examples_or_a_bad_line_is_one_message_naming_the_file(tmp_path):
  (tmp_path / "empty.jsonl").write_text("\n\n")
  (tmp_path / "bad.jsonl").write_text('{"input_ids": [101, 102]}\nnot json\n')
  (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  for name, message in (("empty.jsonl", "empty.jsonl holds no examples (JSON lines with `text` or `input_ids`)"),
                        ("bad.jsonl", "bad.jsonl, line 2: not JSON"),
                        ("latin1.jsonl", "latin1.jsonl, line 2: byte 0xe9 is not UTF-8")):
    result = subprocess.run([sys.executable, "-m", "bert_jax.cli", "embed", f"--checkpoint={shared_path('minilm')}",
                             f"--input={name}", "--output=out.npz"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "out.npz").exists()


def test_embed_examples_match_unpadded_forward_near_the_position_limit():
  # 18 tokens bucket to 32 rows of padding, past a 20-position table: real positions must not change.
  cfg = model.BertConfig.from_preset("tiny", vocab_size=32, max_position_embeddings=20, num_layers=1)
  rng = np.random.default_rng(0)
  examples = [(rng.integers(1, 32, n).astype(np.int32), np.zeros(n, np.int32)) for n in (18, 5)]
  # Random values of the right shapes: nothing to compile, unlike the initialisers.
  shapes = jax.eval_shape(model.BertEncoder(cfg).init, jax.random.key(0), examples[0][0][None])["params"]
  params = jax.tree.map(lambda s: rng.normal(0.0, 0.2, s.shape).astype(np.float32), nn.unbox(shapes))
  arrays = embed.embed_examples(cfg, params, examples, batch_size=2)
  alone = jax.jit(lambda p, ids, types: model.BertEncoder(cfg).apply({"params": p}, ids, None, types,
                                                                      output_hidden_states=True))
  for i, (ids, types) in enumerate(examples):
    ref = alone(params, ids[None], types[None])
    np.testing.assert_allclose(arrays[f"hidden_states_{i}"], ref["hidden_states"][:, 0], atol=1e-5)
    np.testing.assert_allclose(arrays[f"pooler_output_{i}"], ref["pooled_output"][0], atol=1e-5)


@pytest.mark.slow
def test_embed_command_reads_a_pretraining_run(tmp_path_factory, tmp_path):
  run = trained_run(tmp_path_factory)
  lines = ['{"text": "the king keeps the crown ."}', '{"input_ids": [2, 7, 3]}']
  (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
  run_cli(f"--checkpoint={run}/checkpoints/10", f"--input={tmp_path / 'in.jsonl'}",
          f"--output={tmp_path / 'new' / 'out.npz'}")   # a folder not there yet
  out = np.load(tmp_path / "new" / "out.npz")
  cfg, params, tok = checkpoint_loader.load(run)
  expected = embed.embed_examples(cfg, params["bert"], embed.read_examples(lines, tok), batch_size=8)
  assert sorted(out) == sorted(expected) and out["hidden_states_0"].shape == (2, 8, 32)
  for key, value in expected.items():
    np.testing.assert_allclose(out[key], value, atol=1e-5, err_msg=key)


def family_lines(ref) -> tuple[list[str], dict]:
  """Input lines for a reference.npz of ../shared/data/families: its texts and pairs as text, then the rows
  of `padded_texts` (the first texts, right-padded) as input_ids with their attention_mask. Returns the
  lines and {output index: (reference example, row)}."""
  lines, expected = [], {}
  for j, text in enumerate(ref["texts"]):
    expected[len(lines)] = (f"text{j}", 0)
    lines.append(json.dumps({"text": str(text)}))
  for j, (a, b) in enumerate(ref["pairs"]):
    expected[len(lines)] = (f"pair{j}", 0)
    lines.append(json.dumps({"text": str(a), "text_b": str(b)}))
  names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if f"padded_texts/{n}" in ref]
  for row in range(len(ref["padded_texts/input_ids"])):
    expected[len(lines)] = ("padded_texts", row)
    lines.append(json.dumps({n: ref[f"padded_texts/{n}"][row].tolist() for n in names}))
  return lines, expected


@pytest.mark.slow
@pytest.mark.parametrize("family", ["albert", "roberta"])
def test_embed_command_on_albert_and_roberta_directories(family, tmp_path):
  # Text through the directory's own tokenizer (spiece.model; vocab.json + merges.txt) and ids with their
  # attention mask give transformers' hidden states at the real positions; the texts also match the
  # reference's padded batch of the same texts.
  ckpt = shared_path("families", family)
  ref = np.load(ckpt / "reference.npz")
  lines, expected = family_lines(ref)
  (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
  run_cli(f"--checkpoint={ckpt}", f"--input={tmp_path / 'in.jsonl'}", f"--output={tmp_path / 'out.npz'}",
          "--batch_size=4")
  out = np.load(tmp_path / "out.npz")
  padded = ref["padded_texts/hidden_states"]
  errors = {}
  for i, (name, row) in expected.items():
    real = ref[f"{name}/attention_mask"][row].astype(bool)
    np.testing.assert_array_equal(out[f"input_ids_{i}"], ref[f"{name}/input_ids"][row])
    got = out[f"hidden_states_{i}"][:, real]
    errors[name, row] = np.abs(got - ref[f"{name}/hidden_states"][row][:, real]).max()
    if name.startswith("text") and int(name[4:]) < len(padded):   # the same text in the padded batch
      n = int(real.sum())
      errors["padded_texts", int(name[4:]), "text"] = np.abs(got - padded[int(name[4:])][:, :n]).max()
  assert len(errors) == len(ref["texts"]) + len(ref["pairs"]) + 2 * len(padded)
  assert max(errors.values()) <= TOLERANCE, errors
  print(f"{family}: max |hidden_states - transformers| = {max(errors.values()):.2e} over {len(errors)} "
        "comparisons")


def test_embed_examples_with_roberta_positions_up_to_the_table_limit():
  # RoBERTa's positions start after its pad id (1): a 20-position table holds 18 tokens, and 18 tokens
  # bucket to 32 rows of padding, which must be cut to 18, not 20.
  cfg = model.BertConfig.from_preset("tiny", vocab_size=32, max_position_embeddings=20, num_layers=1,
                                     type_vocab_size=1, position_pad_id=1)
  assert embed.longest_input(cfg) == 18
  rng = np.random.default_rng(0)
  examples = [(rng.integers(2, 32, n).astype(np.int32), np.zeros(n, np.int32)) for n in (18, 5)]
  shapes = jax.eval_shape(model.BertEncoder(cfg).init, jax.random.key(0), examples[0][0][None])["params"]
  params = jax.tree.map(lambda s: rng.normal(0.0, 0.2, s.shape).astype(np.float32), nn.unbox(shapes))
  arrays = embed.embed_examples(cfg, params, examples, batch_size=2)
  alone = jax.jit(lambda p, ids: model.BertEncoder(cfg).apply({"params": p}, ids, output_hidden_states=True))
  for i, (ids, _) in enumerate(examples):
    np.testing.assert_allclose(arrays[f"hidden_states_{i}"], alone(params, ids[None])["hidden_states"][:, 0],
                               atol=1e-5)
  with pytest.raises(ValueError, match="19 input_ids, more than max_length 18"):
    embed.read_examples(['{"input_ids": %s}' % list(range(2, 21))], max_length=embed.longest_input(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["electra/discriminator", "electra/generator", "distilbert"])
def test_embed_command_on_pooler_less_directories(family, tmp_path):
  # ids with their attention mask (and token types, where the family has them), as for BERT; every layer's
  # hidden states are transformers' at the real positions. These classes save no pooler: no made-up
  # pooler_output is written.
  ckpt = shared_path("families", *family.split("/"))
  ref = np.load(ckpt / "reference.npz")
  rows = [(name, row) for name in sorted({k.split("/")[0] for k in ref.files})
          for row in range(len(ref[f"{name}/input_ids"]))]
  keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if f"ex0/{k}" in ref]
  lines = [json.dumps({k: ref[f"{name}/{k}"][row].tolist() for k in keys}) for name, row in rows]
  (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
  run_cli(f"--checkpoint={ckpt}", f"--input={tmp_path / 'in.jsonl'}", f"--output={tmp_path / 'out.npz'}",
          "--batch_size=4")
  out = np.load(tmp_path / "out.npz")
  assert not any(k.startswith("pooler_output") for k in out.files)
  assert any(k.startswith("token_type_ids") for k in out.files) == (family != "distilbert")   # none read
  errors = []
  for i, (name, row) in enumerate(rows):
    real = ref[f"{name}/attention_mask"][row].astype(bool)
    errors.append(np.abs(out[f"hidden_states_{i}"][:, real] - ref[f"{name}/hidden_states"][row][:, real]).max())
  assert len(errors) == 6 and max(errors) <= TOLERANCE, errors
  print(f"{family}: max |hidden_states - transformers| = {max(errors):.2e} over {len(errors)} examples")


@pytest.mark.slow
def test_flags_out_of_range_and_an_output_folder_are_one_line_and_exit_2(tmp_path):
  (tmp_path / "out").mkdir()
  cases = {("--output=e.npz", "--batch_size=0"): "bert-jax embed: flag --batch_size=0: 0 is not a positive integer",
           ("--output=e.npz", "--max_length=2"): "bert-jax embed: flag --max_length=2: 2 is not integer >= 8",
           ("--output=out",):
               "bert-jax embed: --output=out is a folder: give the file to write, e.g. out/embeddings.npz"}
  assert_one_line_errors(["embed"], cases, tmp_path, common=("--checkpoint=nowhere", "--input=in.jsonl"))
