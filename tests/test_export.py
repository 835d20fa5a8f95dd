"""`bert-jax export`: finetuned heads as Hugging Face classes with their label maps. The comparisons with
`transformers` skip cleanly without torch/transformers."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax import checkpoint_loader
from bert_jax import checkpointing
from bert_jax.interop import checkpoints_hf
from bert_jax.interop import export
from bert_jax.models import heads
from bert_jax.models import encoder as model
from bert_jax.objectives import electra
from bert_jax.tools import predict
from bert_jax.finetune import trainer
from bert_jax.finetune import task_model
from test_finetune_own_data import make_tweets, tweet_config

TEXTS = ["great movie the plot", "awful movie and the plot", "the plot and"]


@pytest.fixture(scope="module")
def tweets_workdir(tmp_path_factory):
  """A tiny classifier finetuned on negative/neutral/positive tweets (one epoch)."""
  root = tmp_path_factory.mktemp("export")
  workdir = str(root / "run")
  trainer.finetune(tweet_config(make_tweets(root / "data")), workdir)
  return workdir


def _ours(workdir, texts):
  """Our logits [N, C] and the input ids of `texts`, from the finetuned workdir."""
  p = predict.Predictor.load(workdir)
  ids = [p.tokenizer.encode_pair(t, max_length=p.max_seq_length)[0] for t in texts]
  batch = np.zeros((len(texts), max(map(len, ids))), np.int32)
  for i, row in enumerate(ids):
    batch[i, :len(row)] = row
  mask = (batch != p.tokenizer.pad_id).astype(np.int32)
  logits = task_model.build_model(p.model_config, p.task).apply({"params": p.params}, batch, mask, np.zeros_like(batch))
  return np.asarray(logits), batch, mask


@pytest.mark.slow
def test_exported_classifier_reads_back_with_its_labels(tweets_workdir, tmp_path):
  assert export.export(tweets_workdir, tmp_path / "hf") == "BertForSequenceClassification"
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
  assert config["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}
  back = checkpoint_loader.load(tmp_path / "hf")
  ours = checkpoint_loader.load(tweets_workdir)
  jax.tree.map(np.testing.assert_array_equal, back.params, ours.params)  # encoder, pooler and classifier
  assert back.tokenizer.encode(TEXTS[0]) == ours.tokenizer.encode(TEXTS[0])


@pytest.mark.slow
def test_exported_classifier_in_transformers_same_logits_and_labels(tweets_workdir, tmp_path, monkeypatch):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  export.export(tweets_workdir, tmp_path / "hf")
  ours, ids, mask = _ours(tweets_workdir, TEXTS)
  hf_model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
  assert type(hf_model).__name__ == "BertForSequenceClassification"
  assert hf_model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  encoded = tokenizer(TEXTS, padding=True, return_tensors="pt")
  np.testing.assert_array_equal(encoded["input_ids"].numpy(), ids)  # the exported vocabulary and casing
  with torch.no_grad():
    logits = hf_model(**encoded).logits.numpy()
  error = float(np.abs(logits - ours).max())
  print("exported classifier: max abs logit error vs transformers", error)
  assert error <= 1e-4
  served = transformers.pipeline("text-classification", model=str(tmp_path / "hf"), tokenizer=tokenizer)(TEXTS[0])
  assert served[0]["label"] == ["negative", "neutral", "positive"][int(ours[0].argmax())]


@pytest.mark.parametrize("head, kind", [("classifier", "tagging"), ("qa_outputs", "span")])
def test_token_and_qa_heads_export_without_a_pooler_and_read_back(tmp_path, head, kind):
  cfg = model.BertConfig.from_preset("tiny", vocab_size=40, max_position_embeddings=16)
  module = {"tagging": heads.BertForTokenClassification(cfg, 5), "span": heads.BertForQuestionAnswering(cfg)}[kind]
  ids = np.array([[2, 7, 9, 11, 3, 0]], np.int32)
  params = nn.unbox(jax.jit(module.init)(jax.random.key(0), ids, (ids > 0).astype(np.int32), np.zeros_like(ids)))["params"]
  record = {"kind": kind, "label_names": ["O", "B-A", "I-A", "B-B", "I-B"] if kind == "tagging" else []}
  checkpoints_hf.save_hf(tmp_path, cfg, params, config_fields=export.head_config(record), pooler=False)
  state = checkpoints_hf.read_safetensors(tmp_path)
  assert f"{head}.weight" in state and not any("pooler" in n for n in state)
  _, back = checkpoints_hf.load_hf(tmp_path)  # a fresh pooler, as transformers gives these classes none
  np.testing.assert_array_equal(back[head]["kernel"], params[head]["kernel"])
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["architectures"] == [export.ARCHITECTURES[kind]]
  if kind == "tagging":
    assert config["id2label"]["1"] == "B-A"
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf_class = getattr(transformers, export.ARCHITECTURES[kind])
  hf_model = hf_class.from_pretrained(tmp_path).eval()
  with torch.no_grad():
    out = hf_model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(ids > 0, dtype=torch.long))
  ours = module.apply({"params": params}, ids, (ids > 0).astype(np.int32), np.zeros_like(ids))
  if kind == "tagging":
    np.testing.assert_allclose(out.logits.numpy()[0, :5], np.asarray(ours)[0, :5], atol=1e-4)
  else:
    np.testing.assert_allclose(out.start_logits.numpy()[0, :5], np.asarray(ours["start_logits"])[0, :5], atol=1e-4)


def test_a_roberta_classifier_exports_as_roberta_for_sequence_classification(tmp_path):
  """RobertaClassificationHead (dense and tanh on the first token, then out_proj) is our pooler and classifier."""
  cfg = model.BertConfig.from_preset("tiny", vocab_size=40, max_position_embeddings=18, type_vocab_size=1,
                                     position_pad_id=1)
  module = heads.BertForSequenceClassification(cfg, 3)
  ids = np.array([[0, 7, 9, 11, 2, 1]], np.int32)
  mask = (ids != 1).astype(np.int32)
  params = nn.unbox(jax.jit(module.init)(jax.random.key(0), ids, mask, np.zeros_like(ids)))["params"]
  record = {"kind": "classification", "label_names": ["neg", "neu", "pos"]}
  checkpoints_hf.save_hf(tmp_path, cfg, params, config_fields=export.head_config(record, "Roberta"), pooler=True)
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["architectures"] == ["RobertaForSequenceClassification"] and config["model_type"] == "roberta"
  state = checkpoints_hf.read_safetensors(tmp_path)
  assert {"classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight",
          "classifier.out_proj.bias", "roberta.encoder.layer.1.output.dense.weight"} <= set(state)
  assert not any("pooler" in n for n in state) and "classifier.weight" not in state
  np.testing.assert_array_equal(state["classifier.out_proj.weight"], np.asarray(params["classifier"]["kernel"]).T)
  _, back = checkpoints_hf.load_hf(tmp_path)
  jax.tree.map(np.testing.assert_array_equal, back, jax.tree.map(np.asarray, params))
  assert checkpoints_hf.saved_pooler(tmp_path)   # its head's first layer: embed and the API keep it
  ours = module.apply({"params": params}, ids, mask, np.zeros_like(ids))
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  hf_model = transformers.RobertaForSequenceClassification.from_pretrained(tmp_path).eval()
  with torch.no_grad():
    out = hf_model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long))
  np.testing.assert_allclose(out.logits.numpy(), np.asarray(ours), atol=1e-4)


def _pretraining_run(workdir, cfg: model.BertConfig, params: dict) -> str:
  """A workdir as a pretraining run leaves it: its params in checkpoints/<step>, its run record beside."""
  from test_checkpoint_loader import _vocab  # pylint: disable=g-import-not-at-top
  ckpt = checkpointing.Checkpointer(str(workdir / "checkpoints"), keep=1, async_save=False)
  ckpt.save(1, {"params": params})
  ckpt.close()
  checkpoint_loader.write_run_record(str(workdir), cfg, _vocab(workdir / "vocab"), do_lower_case=True)
  return str(workdir)


@pytest.mark.slow
def test_electra_run_exports_its_discriminator_and_generator(tmp_path):
  # Two layers: an ALBERT-style config.json of one layer cannot say whether it is shared.
  cfg = model.BertConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                         max_position_embeddings=16, embedding_size=8)
  ids = np.array([[2, 7, 4, 11, 3, 0]], np.int32)
  batch = {"input_ids": ids, "input_mask": (ids > 0).astype(np.int32), "segment_ids": np.zeros_like(ids),
           "masked_lm_positions": np.array([[2]], np.int32), "masked_lm_ids": np.array([[9]], np.int32),
           "masked_lm_weights": np.ones((1, 1), np.float32)}
  params = jax.tree.map(np.asarray, nn.unbox(jax.jit(electra.ElectraForPreTraining(cfg, 0.5).init)(
      jax.random.key(0), batch)["params"]))
  run = _pretraining_run(tmp_path / "run", cfg, params)
  assert export.export(run, tmp_path / "hf") == "ElectraForPreTraining"
  expected = electra.hf_models(cfg, params, 0.5)
  for directory, kind, architecture in ((tmp_path / "hf", "discriminator", "ElectraForPreTraining"),
                                        (tmp_path / "hf" / export.ELECTRA_GENERATOR, "generator", "ElectraForMaskedLM")):
    config = json.loads((directory / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("electra", [architecture])
    assert not any("pooler" in n for n in checkpoints_hf.read_safetensors(directory))
    assert (directory / "vocab.txt").exists()
    cfg2, back = checkpoints_hf.load_hf(directory)
    want_cfg, want = expected[kind]
    assert cfg2 == want_cfg
    jax.tree.map(np.testing.assert_array_equal, {**back, "bert": {k: v for k, v in back["bert"].items()
                                                                  if k != "pooler"}}, want)
  assert json.loads((tmp_path / "hf" / "generator" / "config.json").read_text())["hidden_size"] == 8


def test_distilbert_shaped_run_exports_as_distilbert_for_masked_lm(tmp_path):
  cfg = model.BertConfig.from_preset("tiny", vocab_size=40, max_position_embeddings=16, type_vocab_size=0)
  ids = np.ones((1, 4), np.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": 0 * ids, "masked_lm_positions": ids}
  params = jax.tree.map(np.asarray, nn.unbox(jax.jit(heads.BertForPreTraining(cfg, use_nsp=False).init)(
      jax.random.key(0), batch)["params"]))
  del params["bert"]["pooler"]   # a student encoder built without one
  run = _pretraining_run(tmp_path / "run", cfg, params)
  assert export.export(run, tmp_path / "hf") == "DistilBertForMaskedLM"
  names = set(checkpoints_hf.read_safetensors(tmp_path / "hf"))
  assert {"distilbert.transformer.layer.1.ffn.lin2.weight", "vocab_projector.bias"} <= names
  assert not any("pooler" in n or "token_type" in n for n in names)
  cfg2, back = checkpoints_hf.load_hf(tmp_path / "hf")
  assert cfg2 == cfg
  jax.tree.map(np.testing.assert_array_equal, {**back, "bert": {k: v for k, v in back["bert"].items()
                                                                if k != "pooler"}}, params)


def test_exported_tokenizers_keep_their_settings_and_transformers_names(tmp_path):
  """ALBERT's SentencePiece model as spiece.model (the name AlbertTokenizer reads) with its accent and space
  settings; RoBERTa's prefix space and its 256-token limit (its positions start after the pad id)."""
  import shutil  # pylint: disable=g-import-not-at-top
  from conftest import shared_path  # pylint: disable=g-import-not-at-top
  albert = tmp_path / "albert"
  shutil.copytree(shared_path("families", "albert"), albert)
  settings = json.loads((albert / "tokenizer_config.json").read_text())
  (albert / "tokenizer_config.json").write_text(json.dumps(dict(settings, keep_accents=True, do_lower_case=False)))
  export.export(str(albert), str(tmp_path / "albert_out"))
  assert (tmp_path / "albert_out" / "spiece.model").is_file()
  source, exported = (checkpoint_loader.load_tokenizer(str(d)) for d in (albert, tmp_path / "albert_out"))
  assert exported.keep_accents and not exported.do_lower_case
  assert exported.encode("Café Ünïcödé") == source.encode("Café Ünïcödé")
  roberta = tmp_path / "roberta"
  shutil.copytree(shared_path("families", "roberta"), roberta)
  settings = json.loads((roberta / "tokenizer_config.json").read_text())
  (roberta / "tokenizer_config.json").write_text(json.dumps(dict(settings, add_prefix_space=True)))
  export.export(str(roberta), str(tmp_path / "roberta_out"))
  source, exported = (checkpoint_loader.load_tokenizer(str(d)) for d in (roberta, tmp_path / "roberta_out"))
  assert exported.add_prefix_space and exported.encode("Hello world") == source.encode("Hello world")
  written = json.loads((tmp_path / "roberta_out" / "tokenizer_config.json").read_text())
  assert written["model_max_length"] == checkpoint_loader.load(str(roberta))[0].max_position_embeddings - 2


def test_tokenizer_class_is_the_one_that_reads_the_tokenizer():
  """A family's own class where it reads that kind of tokenizer, else the class that does."""
  assert export.tokenizer_class("wordpiece", "Albert") == "BertTokenizer"   # an ELECTRA with E != H
  assert export.tokenizer_class("wordpiece", "Electra") == "ElectraTokenizer"
  assert export.tokenizer_class("sentencepiece", "Albert") == "AlbertTokenizer"
  assert export.tokenizer_class("sentencepiece", "Bert") == "AlbertTokenizer"
  assert export.tokenizer_class("byte_bpe", "Roberta") == "RobertaTokenizer"
  assert export.tokenizer_class("tokenizer_json", "ModernBert") == "PreTrainedTokenizerFast"


def test_a_checkpoint_without_a_pooler_exports_without_one(tmp_path):
  """A BertForMaskedLM directory saved no pooler: the one `load` makes up is not written as if trained."""
  from conftest import shared_path  # pylint: disable=g-import-not-at-top
  cfg = model.BertConfig.from_preset("tiny", vocab_size=30522, max_position_embeddings=64)
  params = nn.unbox(jax.jit(model.BertEncoder(cfg).init)(jax.random.key(0), np.zeros([1, 8], np.int32)))["params"]
  h, v = cfg.hidden_size, cfg.vocab_size
  mlm = {"transform": {"kernel": np.full((h, h), 0.01, np.float32), "bias": np.zeros(h, np.float32)},
         "layer_norm": {"scale": np.ones(h, np.float32), "bias": np.zeros(h, np.float32)},
         "output_bias": np.zeros(v, np.float32)}
  checkpoints_hf.save_hf(tmp_path / "source", cfg, {"bert": jax.device_get(params), "mlm": mlm}, pooler=False)
  (tmp_path / "source" / "vocab.txt").write_text((shared_path("minilm") / "vocab.txt").read_text())
  assert not checkpoint_loader.saved_pooler(str(tmp_path / "source"))
  export.export(str(tmp_path / "source"), str(tmp_path / "out"))
  assert not checkpoint_loader.saved_pooler(str(tmp_path / "out"))


def test_a_pretraining_run_without_a_sentence_pair_head_has_no_trained_pooler(tmp_path):
  """Only NSP (or ALBERT's SOP, saved as "nsp") trains the pooler: RoBERTa's, SpanBERT's and the left-to-right
  runs carry it untrained, so `embed` writes no pooler_output and `export` no pooler for them."""
  cfg = model.BertConfig.from_preset("tiny", vocab_size=40, max_position_embeddings=16)
  ids = np.ones((1, 4), np.int32)
  batch = {"input_ids": ids, "input_mask": ids, "segment_ids": 0 * ids, "masked_lm_positions": ids}
  params = jax.tree.map(np.asarray, nn.unbox(jax.jit(heads.BertForPreTraining(cfg).init)(
      jax.random.key(0), batch)["params"]))
  assert "nsp" in params and "pooler" in params["bert"]
  with_nsp = _pretraining_run(tmp_path / "bert", cfg, params)
  assert checkpoint_loader.saved_pooler(with_nsp, checkpoint_loader.load_model(with_nsp)[1])
  mlm_only = _pretraining_run(tmp_path / "roberta_like", cfg, {k: v for k, v in params.items() if k != "nsp"})
  loaded = checkpoint_loader.load_model(mlm_only)[1]
  assert "pooler" in loaded["bert"] and not checkpoint_loader.saved_pooler(mlm_only, loaded)
  export.export(mlm_only, tmp_path / "hf")
  assert not checkpoint_loader.saved_pooler(str(tmp_path / "hf"))
  (tmp_path / "roberta_like" / "task.json").write_text("{}")   # a finetuned workdir: its pooler is kept
  assert checkpoint_loader.saved_pooler(mlm_only, loaded)


def test_a_trained_sentencepiece_vocabulary_exports_its_special_tokens_by_name(tmp_path):
  """Our SentencePiece training makes [PAD] 0 and [UNK] 1; AlbertTokenizer's defaults ("<pad>", "<unk>") are
  no pieces of it, so transformers padded with an id past the embedding table (NaN in its Flax model)."""
  from bert_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.data import vocab_training  # pylint: disable=g-import-not-at-top
  sentences = [f"the {w} rides to the {v} castle ." for w in ("king", "queen", "knight") for v in ("old", "new")]
  vocab_training.train_sentencepiece(sentences * 20, str(tmp_path / "spm"), 60, "unigram")
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  export._save_tokenizer(tok, tmp_path / "out", 128, "Albert")
  written = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
  assert {k: written[k] for k in ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")} == {
      "pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]"}
  assert written["tokenizer_class"] == "AlbertTokenizer" and (tmp_path / "out" / "spiece.model").is_file()


def test_an_encoder_saved_without_a_pooler_or_heads_reads_back(tmp_path):
  """A BertModel(add_pooling_layer=False), or our export of a token or QA model: a fresh pooler, as
  transformers makes one (it was a missing tensor)."""
  cfg = model.BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=64)
  params = jax.device_get(nn.unbox(jax.jit(model.BertEncoder(cfg).init)(
      jax.random.key(0), np.zeros([1, 8], np.int32)))["params"])
  checkpoints_hf.save_hf(tmp_path / "bare", cfg, {"bert": params}, pooler=False)
  cfg2, back = checkpoints_hf.load_hf(tmp_path / "bare")
  assert cfg2 == cfg and "pooler" in back["bert"]
  jax.tree.map(np.testing.assert_array_equal, {k: v for k, v in back["bert"].items() if k != "pooler"},
               {k: v for k, v in params.items() if k != "pooler"})


def test_a_checkpoint_loads_for_a_model_that_runs_the_splash_kernel(tmp_path):
  """The kernel shapes no parameter; finetuning with `model.attention_kernel=splash` passes it to the loader."""
  cfg = model.BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=128)
  params = jax.device_get(nn.unbox(jax.jit(model.BertEncoder(cfg).init)(
      jax.random.key(0), np.zeros([1, 8], np.int32)))["params"])
  checkpoints_hf.save_hf(tmp_path / "hf", cfg, {"bert": params})
  cfg2, back = checkpoints_hf.load_hf(tmp_path / "hf", attention_kernel="splash", attention_dropout=0.0)
  assert cfg2.attention_kernel == "splash"
  jax.tree.map(np.testing.assert_array_equal, back["bert"], params)


def test_a_checkpoint_without_a_tokenizer_loads_and_exports_with_one_given(tmp_path):
  """The families' ids-only checkpoints ship no tokenizer: `vocab=` (`--vocab`) gives one, and the export
  carries it, so the written directory loads on its own."""
  import bert_jax  # pylint: disable=import-outside-toplevel
  from conftest import shared_path  # pylint: disable=import-outside-toplevel
  distilbert = shared_path("families", "distilbert")
  with pytest.raises(FileNotFoundError, match="holds no vocab.txt.*--vocab"):
    bert_jax.load(distilbert)
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie"]
  (tmp_path / "vocab.txt").write_text("\n".join(words + [f"w{i}" for i in range(1000 - len(words))]) + "\n")
  loaded = bert_jax.load(distilbert, vocab=str(tmp_path / "vocab.txt"))
  out = loaded.encode(["the movie"])
  assert out["input_ids"].tolist() == [[2, 5, 6, 3]]
  assert out["sequence_output"].shape == (1, 4, loaded.config.hidden_size)
  assert export.export(distilbert, tmp_path / "hf", vocab=str(tmp_path / "vocab.txt")) == "DistilBertForMaskedLM"
  back = bert_jax.load(tmp_path / "hf")
  np.testing.assert_array_equal(back.encode(["the movie"])["sequence_output"], out["sequence_output"])
  (tmp_path / "big").mkdir()
  (tmp_path / "big" / "vocab.txt").write_text((tmp_path / "vocab.txt").read_text() + "w_extra\n")
  with pytest.raises(ValueError, match="has 1001 tokens but the model's embedding table has 1000"):
    bert_jax.load(distilbert, vocab=str(tmp_path / "big"))


@pytest.mark.slow
def test_the_commands_take_a_vocabulary_for_a_checkpoint_without_one(tmp_path):
  """`--vocab` of export, fill-mask and embed, typed as a path relative to where the command runs; a vocabulary
  larger than the embedding table is one line and exit 2 in embed as in load."""
  import os  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from conftest import shared_path  # pylint: disable=import-outside-toplevel
  distilbert = shared_path("families", "distilbert")
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "movie"]
  (tmp_path / "vocab.txt").write_text("\n".join(words + [f"w{i}" for i in range(1000 - len(words))]) + "\n")
  (tmp_path / "big.txt").write_text((tmp_path / "vocab.txt").read_text() + "w_extra\n")
  (tmp_path / "in.jsonl").write_text('{"text": "the movie"}\n')
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}

  def run(*args):
    return subprocess.run([sys.executable, "-m", "bert_jax.cli", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)

  exported = run("export", f"--checkpoint={distilbert}", "--vocab=vocab.txt", "--output=hf")
  assert exported.returncode == 0 and (tmp_path / "hf" / "vocab.txt").exists(), exported.stderr[-2000:]
  filled = run("fill-mask", f"--checkpoint={distilbert}", "--vocab=vocab.txt", "the [MASK]")
  assert filled.returncode == 0 and "[MASK] 1:" in filled.stdout, filled.stdout + filled.stderr[-2000:]
  refused = run("embed", f"--checkpoint={distilbert}", "--vocab=big.txt", "--input=in.jsonl", "--output=out.npz")
  assert refused.returncode == 2 and "has 1001 tokens but the model's embedding table has 1000" in refused.stderr
  assert not (tmp_path / "out.npz").exists()
