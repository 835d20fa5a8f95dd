"""checkpoint_loader: a pretraining run's record, the paths that name a run, finetuned workdirs, errors.

`trained_run` (one tiny pretraining run per test session) is shared with test_fill_mask and test_embed.
"""

import dataclasses
import functools
import os

import jax
import numpy as np
import pytest

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax import failures
from bert_jax.data import bpe
from bert_jax.data import prepare
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.data import vocab_training
from bert_jax.models import encoder as model
from bert_jax import train
from conftest import shared_path
from test_train import tiny_config

pytestmark = pytest.mark.slow  # the first test to ask for `trained_run` trains it (about 30 s on 2 cores)


def trained_run(tmp_path_factory) -> str:
  """The workdir of a tiny pretraining run (checkpoints at steps 5 and 10) and its run record."""
  return _train_once(tmp_path_factory.getbasetemp())


@functools.cache
def _train_once(basetemp) -> str:
  root = basetemp / "tiny_pretraining"
  root.mkdir()
  rng = np.random.default_rng(1)
  pairs = [("king", "crown"), ("knight", "sword"), ("queen", "castle"), ("dragon", "river")]
  docs = ["\n".join("the {} keeps the {} .".format(*pairs[rng.integers(len(pairs))]) for _ in range(6))
          for _ in range(40)]
  (root / "corpus.txt").write_text("\n\n".join(docs) + "\n")
  data = str(root / "prepared")
  prepare.prepare_corpus(str(root / "corpus.txt"), data, train_vocab_size=128, num_shards=1, num_workers=1)
  config = tiny_config(data, train_steps=10, checkpoint_every=5, eval_steps=0, log_every=10)
  workdir = str(root / "run")
  train.train_and_evaluate(config, workdir)
  # The loop is to write this at start; written here until it does (the same call, so harmless twice).
  checkpoint_loader.write_run_record(workdir, train.bert_config(config), data, config.data.do_lower_case)
  return workdir


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  return trained_run(tmp_path_factory)


def assert_same(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_run_record_then_load_from_the_workdir_its_checkpoints_or_a_step(run, monkeypatch):
  assert {"bert_config.json", "vocab.txt", "tokenizer_config.json"} <= set(os.listdir(run))
  cfg, params, tok = checkpoint_loader.load(run)
  assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.scan_layers) == (128, 32, 1, False)
  assert set(params) == {"bert", "mlm", "nsp"}
  assert_same(params, checkpointing.restore_params(os.path.join(run, "checkpoints")))
  assert tok.do_lower_case and tok.convert_tokens_to_ids(["king"]) != [tok.unk_id]
  monkeypatch.chdir(os.path.dirname(run))   # relative paths, as typed on a command line
  name = os.path.basename(run)
  for path in (f"{name}/checkpoints", f"{name}/checkpoints/10"):
    found = checkpoint_loader.find(path)
    assert (found.kind, found.directory) == ("bert_jax", run)
    assert_same(checkpoint_loader.load_model(path)[1], params)
  step5 = checkpoint_loader.load_model(f"{name}/checkpoints/5")[1]
  assert not np.array_equal(step5["mlm"]["output_bias"], params["mlm"]["output_bias"])


def test_scanned_layout_on_request(run):
  cfg, params = checkpoint_loader.load_model(run, scan_layers=True)
  assert cfg.scan_layers and set(params["bert"]["encoder"]) == {"layers"}
  assert params["bert"]["encoder"]["layers"]["intermediate"]["kernel"].shape == (1, 32, 64)


def test_finetuned_workdir_its_best_and_a_step(run, tmp_path):
  cfg, params = checkpoint_loader.load_model(run)
  workdir = tmp_path / "finetuned"
  saved = {"bert": params["bert"], "classifier": {"kernel": np.ones((32, 2), np.float32),
                                                  "bias": np.zeros(2, np.float32)}}
  best = checkpointing.Checkpointer(str(workdir / "best"), keep=1, async_save=False)
  best.save(3, {"params": saved})
  best.close()
  checkpoint_loader.write_run_record(str(workdir), cfg, os.path.join(run, "vocab.txt"), do_lower_case=False)
  for path in (workdir, workdir / "best", workdir / "best" / "3"):
    assert checkpoint_loader.find(path).directory == str(workdir)
    loaded_cfg, loaded, tok = checkpoint_loader.load(path)
    assert loaded_cfg == cfg and not tok.do_lower_case
    assert_same(loaded, saved)
  assert not checkpoint_loader.lower_case(workdir)


def test_errors_name_the_path_and_what_was_looked_for(run, tmp_path):
  with pytest.raises(FileNotFoundError, match=f"{tmp_path}/missing does not exist"):
    checkpoint_loader.find(tmp_path / "missing")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match=f"{tmp_path}/empty is not a checkpoint: looked for a Hugging Face"):
    checkpoint_loader.load(tmp_path / "empty")
  with pytest.raises(ValueError, match="checkpoint kind 'orbax'"):
    checkpoint_loader.find(run, kind="orbax")
  # A run from before its workdir had a record: the config must be given.
  (tmp_path / "old_run").mkdir()
  os.symlink(os.path.join(run, "checkpoints"), tmp_path / "old_run" / "checkpoints")
  with pytest.raises(FileNotFoundError, match="without its model config .*bert_config.json"):
    checkpoint_loader.load_model(tmp_path / "old_run")
  cfg, _ = checkpoint_loader.load_model(tmp_path / "old_run", bert_config_json=os.path.join(run, "bert_config.json"))
  assert cfg == checkpoint_loader.load_model(run)[0]


def run_record(workdir, cfg: model.BertConfig, vocab_path: str, do_lower_case: bool = True) -> str:
  """A workdir with a run record and a step directory, which is all `find` asks of a run (no weights)."""
  os.makedirs(os.path.join(workdir, "checkpoints", "1", "state"))
  checkpoint_loader.write_run_record(str(workdir), cfg, vocab_path, do_lower_case)
  return os.path.join(workdir, "checkpoints")


def test_run_record_of_a_byte_level_bpe_reloads_with_the_same_ids(tmp_path):
  texts = ["The king keeps the crown.", "A knight's sword, the queen's castle; dragons cross rivers!"] * 20
  vocab = vocab_training.train_byte_level_bpe(texts, vocab_size=320, out_dir=str(tmp_path / "prepared"))
  # add_prefix_space is not RoBERTa's default: only tokenizer_config.json beside the vocabulary carries it.
  bpe.ByteLevelBPETokenizer(vocab, add_prefix_space=True).save(str(tmp_path / "prepared"))
  tok = tokenizer_lib.load_tokenizer(vocab)
  assert tok.add_prefix_space and tok.encode("The king") != bpe.ByteLevelBPETokenizer(vocab).encode("The king")
  cfg = model.BertConfig.from_preset("tiny", vocab_size=tok.vocab_size, type_vocab_size=1,
                                     position_pad_id=tok.pad_id)
  # As pretraining writes it (train.train_and_evaluate): from the tokenizer's source file.
  run = run_record(tmp_path / "run", cfg, tok.source_file, tok.do_lower_case)
  assert {"vocab.json", "merges.txt", "tokenizer_config.json", "bert_config.json"} <= set(os.listdir(tmp_path / "run"))
  back = checkpoint_loader.load_tokenizer(run)
  assert back.kind == "byte_bpe" and back.add_prefix_space and back.special_tokens == tok.special_tokens
  for text in texts[:2] + ["Unseen: Dragons crossing 3 rivers, naïvely."]:
    assert back.encode_pair(text, "the crown") == tok.encode_pair(text, "the crown")
  assert checkpoint_loader.family_problem(run, cfg) is None


def test_run_record_of_albert_sentencepiece_keeps_its_preprocessing(tmp_path):
  spiece = shared_path("families", "albert", "spiece.model")
  tok = tokenizer_lib.load_tokenizer(str(spiece), do_lower_case=True)
  assert not tok.keep_accents   # ALBERT's: accents dropped, which its tokenizer_config.json says
  cfg = checkpoint_loader.load_model(spiece.parent)[0]
  run = run_record(tmp_path / "run", cfg, tok.source_file, tok.do_lower_case)
  back = checkpoint_loader.load_tokenizer(run)
  assert (back.kind, back.do_lower_case, back.keep_accents, back.remove_space) == ("sentencepiece", True, False, True)
  for text in ("Café au lait, naïve résumé:  the   Zoë Saldaña   case 1,000", "Plain text."):
    assert back.encode_pair(text) == tok.encode_pair(text)


def _vocab(directory) -> str:
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "vocab.txt")
  with open(path, "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "king"]) + "\n")
  return path


def test_init_from_another_family_stops_in_check_inputs_naming_both(tmp_path):
  config = tiny_config("embedded:shakespeare")
  bert = train.bert_config(config)
  vocab = _vocab(tmp_path / "vocab")
  albert_run = run_record(tmp_path / "albert", dataclasses.replace(bert, embedding_size=16, share_layers=True), vocab)
  causal_run = run_record(tmp_path / "ltr", dataclasses.replace(bert, causal=True), vocab)
  same_run = run_record(tmp_path / "same", dataclasses.replace(bert, hidden_dropout=0.0, dtype="bfloat16"), vocab)
  assert checkpoint_loader.family_problem(same_run, bert) is None   # dropout and dtype are no structure
  assert checkpoint_loader.family_problem(tmp_path / "missing", bert) is None   # checkpoint_problem's to say

  problem = checkpoint_loader.family_problem(albert_run, bert)
  assert problem == (f"{albert_run} holds an albert encoder (L=1 H=32 A=2 I=64 E=16, shared layers, vocab 128, "
                     "32 positions, 2 token types) but the config describes a bert encoder (L=1 H=32 A=2 I=64, "
                     "vocab 128, 32 positions, 2 token types): they differ in embedding_size, share_layers")
  assert checkpoint_loader.family_problem(os.path.join(causal_run, "1"), bert).endswith("differ in causal")
  eps_run = run_record(tmp_path / "eps", dataclasses.replace(bert, layer_norm_eps=1e-5), vocab)
  assert checkpoint_loader.family_problem(eps_run, bert).endswith(
      "differ in layer_norm_eps (1e-05 in the checkpoint, 1e-12 in the config: set "
      "--config.model.layer_norm_eps=1e-05)")
  held_by = {albert_run: "an albert encoder (L=1 H=32 A=2 I=64 E=16, shared layers,",
             causal_run: "a bert encoder (L=1 H=32 A=2 I=64, causal,"}
  for init_from, held in held_by.items():
    config.init_from = init_from
    with pytest.raises(failures.UserError) as e:
      train.check_inputs(config)
    message = str(e.value)   # one problem, on one line
    assert message.startswith(f"invalid inputs:\n  init_from: {init_from} holds {held}"), message
    assert len(message.splitlines()) == 2 and "but the config describes a bert encoder (" in message


@pytest.mark.parametrize("family", ["albert", "roberta"])
def test_init_from_a_hugging_face_directory_of_another_family(family):
  config = tiny_config("embedded:shakespeare", init_from=str(shared_path("families", family)))
  with pytest.raises(failures.UserError, match=f"init_from: {config.init_from} holds an? {family} encoder .* but "
                     r"the config describes a bert encoder \(L=1 H=32 A=2 I=64, vocab 128"):
    train.check_inputs(config)


@pytest.mark.parametrize("family", ["electra/discriminator", "distilbert"])
def test_init_from_an_electra_or_distilbert_directory_names_its_family(family):
  # ELECTRA's encoder config reads as ALBERT's (E 32 projected to H 64): config.json's model_type names it.
  config = tiny_config("embedded:shakespeare", init_from=str(shared_path("families", *family.split("/"))))
  with pytest.raises(failures.UserError, match=f"holds an? {family.split('/')[0]} encoder"):
    train.check_inputs(config)


def test_a_modernbert_run_initialises_its_own_config_and_its_context_extension(tmp_path):
  """RoPE's bases shape no parameter: an unset local base reads back as the global one, and the extension phase
  raises the global base on purpose (10k -> 160k); a position table against RoPE still differs."""
  from bert_jax.models import modernbert_keys  # pylint: disable=g-import-not-at-top
  bert = model.BertConfig(vocab_size=40, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=24,
                          max_position_embeddings=32)
  phase1 = dataclasses.replace(bert, **modernbert_keys.SWITCHES, rope_theta=10_000.0, norm_bias=False,
                               dense_bias=False, global_attn_every_n_layers=3, local_attention=4)
  run = run_record(tmp_path / "phase1", phase1, _vocab(tmp_path / "vocab"))
  assert checkpoint_loader.family_problem(run, phase1) is None
  extension = dataclasses.replace(phase1, rope_theta=160_000.0, local_rope_theta=10_000.0)
  assert checkpoint_loader.family_problem(run, extension) is None
  with_table = dataclasses.replace(phase1, rope_theta=None)
  assert checkpoint_loader.family_problem(run, with_table).endswith("differ in rope")
