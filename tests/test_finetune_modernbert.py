"""ModernBERT finetuning: its heads (Hugging Face's ModernBertFor*), both poolings, and `bert-jax finetune`
from a Hugging Face ModernBERT directory with its tokenizer.json."""

import json
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.finetune import init as finetune_init
from bert_jax.finetune import tasks
from bert_jax.finetune import trainer
from bert_jax.finetune import task_model
from bert_jax.interop import export
from bert_jax.models import config as config_lib
from bert_jax.models import heads
from configs.finetune import sst2
from conftest import shared_path
from test_finetune_train import make_sentiment_data, tiny_config

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]   # the reference checkpoint's ids 0..3


def _modern_config():
  hf = json.loads(shared_path("families", "modernbert", "config.json").read_text())
  return config_lib.BertConfig.from_hf_dict(hf)


def _init(model, ids, mask):
  return nn.unbox(model.init({"params": jax.random.key(0)}, ids, mask, jnp.zeros_like(ids))["params"])


@pytest.mark.slow
def test_poolings_shapes_padding_and_params():
  cfg = _modern_config()
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(5, cfg.vocab_size, (3, 24)), jnp.int32)
  mask = jnp.asarray(np.arange(24)[None] < np.array([[24], [10], [17]]), jnp.int32)
  cls = heads.BertForSequenceClassification(cfg, 3, pooling="cls")
  mean = heads.BertForSequenceClassification(cfg, 3, pooling="mean")
  params = _init(cls, ids, mask)
  assert set(params) == {"bert", "head", "classifier"} and "pooler" not in params["bert"]
  assert set(params["head"]) == {"dense", "norm"} and "bias" not in params["head"]["dense"]  # no biases
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, _init(mean, ids, mask))
  out_cls, out_mean = cls.apply({"params": params}, ids, mask, ids), mean.apply({"params": params}, ids, mask, ids)
  assert out_cls.shape == out_mean.shape == (3, 3) and out_cls.dtype == jnp.float32
  assert not np.allclose(out_cls, out_mean, atol=1e-4)
  # Padding (whatever its ids) changes neither pooling: the mean is over real tokens only.
  garbage = jnp.where(mask == 1, ids, 7)
  for model, want in ((cls, out_cls), (mean, out_mean)):
    np.testing.assert_allclose(model.apply({"params": params}, garbage, mask, ids), want, atol=1e-5)
  # The mean by hand, from the encoder's output.
  seq = heads.model.BertEncoder(cfg).apply({"params": params["bert"]}, ids, mask, pool=False)["sequence_output"]
  m = np.asarray(mask, np.float32)[..., None]
  np.testing.assert_allclose(heads.pool_sequence(seq, mask, "mean"), (np.asarray(seq) * m).sum(1) / m.sum(1),
                             atol=1e-5)
  with pytest.raises(ValueError, match="pooling"):
    heads.BertForSequenceClassification(cfg, 3, pooling="max").init(jax.random.key(0), ids, mask, ids)


@pytest.mark.slow
def test_token_and_span_heads_on_modernbert_and_bert_defaults():
  cfg = _modern_config()
  ids = jnp.ones((2, 12), jnp.int32)
  task = tasks.get_task("conll2003")
  tagger = task_model.build_model(cfg, task)
  params = _init(tagger, ids, ids)
  assert set(params) == {"bert", "head", "classifier"} and "pooler" not in params["bert"]
  assert tagger.apply({"params": params}, ids, ids, ids).shape == (2, 12, task.num_labels)
  qa = task_model.build_model(cfg, tasks.get_task("squad_v1"))
  params = _init(qa, ids, ids)
  assert set(params) == {"bert", "head", "qa_outputs"}
  assert qa.apply({"params": params}, ids, ids, ids)["start_logits"].shape == (2, 12)
  assert task_model.build_model(cfg, tasks.get_task("sst2")).pooling == "cls"
  assert task_model.build_model(cfg, tasks.get_task("sst2", classifier_pooling="mean")).pooling == "mean"
  # BERT keeps its pooler and bare classifiers.
  bert = config_lib.BertConfig.from_preset("tiny", vocab_size=32, max_position_embeddings=16)
  sst2 = task_model.build_model(bert, tasks.get_task("sst2"))
  params = _init(sst2, ids, ids)
  assert sst2.pooling == "pooler" and set(params) == {"bert", "classifier"} and "pooler" in params["bert"]
  assert set(_init(task_model.build_model(bert, task), ids, ids)) == {"bert", "classifier"}


def _modernbert_with_tokenizer(directory, sentences, pooling):
  """A copy of the reference ModernBERT directory with a byte-level BPE tokenizer.json of < 512 ids and
  `classifier_pooling` in its config.json."""
  shutil.copytree(shared_path("families", "modernbert"), directory)
  config = json.loads((directory / "config.json").read_text())
  (directory / "config.json").write_text(json.dumps({**config, "classifier_pooling": pooling}))
  tk = Tokenizer(models.BPE(unk_token="[UNK]"))
  tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tk.decoder = decoders.ByteLevel()
  tk.train_from_iterator(sentences, trainers.BpeTrainer(
      vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  tk.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
  tk.save(str(directory / "tokenizer.json"))
  (directory / "tokenizer_config.json").write_text(json.dumps(
      {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
       "unk_token": "[UNK]", "model_input_names": ["input_ids", "attention_mask"]}))
  return tk


@pytest.mark.slow
def test_finetune_from_a_hugging_face_modernbert_directory(tmp_path):
  data = make_sentiment_data(tmp_path / "data")
  sentences = [line.split("\t")[0] for line in (tmp_path / "data" / "train.tsv").read_text().splitlines()[1:]]
  tk = _modernbert_with_tokenizer(tmp_path / "modernbert", sentences, "mean")
  assert tk.get_vocab_size() <= 512
  config = tiny_config(data)
  config.init_checkpoint, config.vocab_file = str(tmp_path / "modernbert"), ""   # its tokenizer.json
  config.num_epochs, config.learning_rate, config.predict_split = 2, 1e-3, ""
  config.model.hidden_dropout = config.model.attention_dropout = 0.0
  results = trainer.finetune(config, str(tmp_path / "run"))
  log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  losses = [r["train/loss"] for r in log if "train/loss" in r]
  assert results["finished"] and losses[-1] < 0.5 * losses[0], (losses, results)
  assert results["best"] >= 0.9, results
  record = json.loads((tmp_path / "run" / "task.json").read_text())
  assert record["task_opts"]["classifier_pooling"] == "mean"   # from config.json; predict rebuilds it
  assert task_model.build_model(_modern_config(), tasks.from_record(record)).pooling == "mean"
  saved = tokenizer_lib.load_tokenizer(tmp_path / "run")   # the workdir keeps the tokenizer.json
  assert saved.kind == "tokenizer_json" and saved.encode_pair("good movie")[0] == tk.encode("good movie").ids
  with pytest.raises(ValueError, match="not written as a transformers class"):   # never a silently headless export
    export.export(str(tmp_path / "run"), str(tmp_path / "exported"))


def test_classifier_pooling_from_task_opts_then_the_checkpoint(tmp_path):
  shutil.copytree(shared_path("families", "modernbert"), tmp_path / "m")
  config = sst2.get_config()
  config.init_checkpoint = str(tmp_path / "m")
  modern, bert = _modern_config(), config_lib.BertConfig.from_preset("tiny")
  assert finetune_init.classifier_pooling(config, modern) == "cls"   # the reference config.json says so
  hf = json.loads((tmp_path / "m" / "config.json").read_text())
  (tmp_path / "m" / "config.json").write_text(json.dumps({**hf, "classifier_pooling": "mean"}))
  assert finetune_init.classifier_pooling(config, modern) == "mean"
  assert finetune_init.classifier_pooling(config, bert) == "pooler"
  config.task_opts.classifier_pooling = "cls"
  assert finetune_init.classifier_pooling(config, modern) == finetune_init.classifier_pooling(config, bert) == "cls"
  config.task_opts.classifier_pooling = "max"
  with pytest.raises(ValueError, match="classifier_pooling"):
    finetune_init.classifier_pooling(config, modern)
