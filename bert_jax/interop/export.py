"""`bert-jax export`: a checkpoint as a Hugging Face directory, for `transformers` and the serving stacks
built on it (`pipeline`, TorchServe, ONNX export by `optimum`).

    bert-jax export --checkpoint=runs/tweets --output=exported/tweets
    python -c "from transformers import pipeline; print(pipeline('text-classification', 'exported/tweets')('great'))"

A finetuned workdir (its task.json says the task) becomes the class of its head, with `id2label` and
`label2id` from its label set (Bert... here; Albert... and Roberta... for those families):

  classification, regression   BertForSequenceClassification (regression: `problem_type` "regression")
  tagging                      BertForTokenClassification
  span (SQuAD)                 BertForQuestionAnswering

Any other checkpoint (a pretraining run, a TF or HF checkpoint) becomes its family's pretraining class
(BertForPreTraining, AlbertForPreTraining, RobertaForMaskedLM, DistilBertForMaskedLM for an encoder without
token types), or BertModel (...) when it has no MLM head. An ELECTRA pretraining run (its params have a
"discriminator") becomes two directories: the discriminator, `ElectraForPreTraining`, in OUTPUT and the
generator, `ElectraForMaskedLM`, in OUTPUT/generator; neither has a pooler.

Each directory also gets the vocabulary (a SentencePiece model as spiece.model) and a tokenizer_config.json
(lower-casing, the tokenizer's own settings, the longest input the positions hold), so `AutoTokenizer` loads
it and tokenizes as we do. A RoBERTa sequence classifier becomes RobertaForSequenceClassification, whose head
is our pooler and classifier under other names. A scalar-mix head has no `transformers` class: an error; so
have a DistilBERT sequence classifier (its head has a ReLU where our pooler has tanh), a classifier on another
pooling than the pooler's, and ModernBERT's finetuning heads.
"""

import json
import pathlib

from absl import app
from absl import flags

from bert_jax import checkpoint_loader
from bert_jax import failures
from bert_jax import paths
from bert_jax.data import tokenizer as tokenizer_lib
from bert_jax.interop import checkpoints_hf
from bert_jax.interop import hf_families
from bert_jax.finetune import task_record
from bert_jax.objectives import electra

FLAGS = flags.FLAGS
# Where an ELECTRA run's generator is written, inside the discriminator's directory.
ELECTRA_GENERATOR = "generator"
HF_SENTENCEPIECE_FILE = "spiece.model"   # the name transformers' AlbertTokenizer reads
# The class of a finetuned BERT head; other families change the stem (`hf_families.Family.classes`).
ARCHITECTURES = {"classification": "BertForSequenceClassification", "regression": "BertForSequenceClassification",
                 "tagging": "BertForTokenClassification", "span": "BertForQuestionAnswering"}


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it."""
  flags.DEFINE_string("checkpoint", None, "A finetuned workdir, or any checkpoint bert-jax reads.")
  flags.DEFINE_string("output", None, "The Hugging Face directory to write.")
  flags.DEFINE_string("vocab", None, "The tokenizer to write beside the weights (vocab.txt, *.model, vocab.json, "
                      "tokenizer.json, or a directory holding one); default: the checkpoint's.")


def head_config(record: dict, classes: str = "Bert") -> dict:
  """config.json fields of a finetuned head: its class and label maps (`transformers.PretrainedConfig`).

  `classes`: the family's class name stem (Bert, Albert, Roberta).
  """
  kind = record["kind"]
  fields = {"architectures": [classes + ARCHITECTURES[kind].removeprefix("Bert")]}
  if kind == "span":
    return fields
  names = ["LABEL_0"] if kind == "regression" else list(record["label_names"])
  fields.update(id2label={str(i): n for i, n in enumerate(names)}, label2id={n: i for i, n in enumerate(names)})
  if kind == "regression":
    fields["problem_type"] = "regression"
  return fields


# What a classifier reads, by `classifier_pooling` (models/heads.py).
_POOLED = {"cls": "first token's vector without the pooler", "mean": "mean of the tokens' vectors",
           "last": "last token's vector"}


def export(checkpoint, output, vocab: str | None = None) -> str:
  """Writes the Hugging Face directory `output` for `checkpoint` (see the module docstring), with `vocab`'s
  tokenizer where given, else the checkpoint's; returns its class name."""
  cfg, params, tokenizer = checkpoint_loader.load(checkpoint, vocab=vocab)
  record = task_record.read(checkpoint)
  max_length = cfg.max_input_length
  if record is None and is_electra(checkpoint, params):
    return _export_electra(cfg, params, tokenizer, output, max_length)
  if record is None:
    params = {k: v for k, v in params.items() if k in ("bert", "mlm", "nsp")}
    # As the class written has one, unless the checkpoint saved none: a pooler `load` made up is not written
    # as if trained (transformers then initialises it anew and says so).
    fields, pooler = {}, None if checkpoint_loader.saved_pooler(checkpoint, params) else False
  else:
    if record.get("scalar_mix"):
      raise ValueError(f"{checkpoint}: a scalar-mix model (finetuned with scalar_mix) has no transformers class; "
                       "finetune without scalar_mix to export")
    classes = hf_families.family(cfg).classes
    pooling = record.get("task_opts", {}).get("classifier_pooling") or "pooler"
    if record["kind"] in ("classification", "regression") and pooling != "pooler":
      advice = ("" if cfg.causal else "; a model finetuned with classifier_pooling pooler exports")
      raise ValueError(f"{checkpoint}: a classifier on the {_POOLED[pooling]} (classifier_pooling {pooling}, with "
                       f"a dense-norm head) is not written as a transformers class yet{advice}")
    if "head" in params:
      raise ValueError(f"{checkpoint}: ModernBERT's finetuning head (dense, GELU and LayerNorm before the "
                       f"classifier) is not written as a transformers class yet")
    if classes == "DistilBert" and record["kind"] in ("classification", "regression"):
      raise ValueError(f"{checkpoint}: DistilBertForSequenceClassification's head (a dense layer and ReLU on the "
                       "first token, then the classifier) is not ours (the pooler's dense layer and tanh, then the "
                       "classifier): it has no transformers class; a tagging or span model exports")
    head = "qa_outputs" if record["kind"] == "span" else "classifier"
    params, fields = {"bert": params["bert"], head: params[head]}, head_config(record, classes)
    pooler = record["kind"] in ("classification", "regression")   # the HF token and QA classes have none
    max_length = record["max_seq_length"]
  checkpoints_hf.save_hf(output, cfg, params, config_fields=fields, pooler=pooler, tokenizer=tokenizer)
  _save_tokenizer(tokenizer, output, max_length, hf_families.family(cfg).classes)
  return json.loads((pathlib.Path(output) / "config.json").read_text())["architectures"][0]


# The tokenizer kind each family's own transformers tokenizer reads, and the class that reads each kind.
_FAMILY_TOKENIZER_KIND = {"Bert": "wordpiece", "Electra": "wordpiece", "DistilBert": "wordpiece",
                          "Albert": "sentencepiece", "Roberta": "byte_bpe"}
_KIND_TOKENIZER_CLASS = {"wordpiece": "BertTokenizer", "sentencepiece": "AlbertTokenizer",
                         "byte_bpe": "RobertaTokenizer", "tokenizer_json": "PreTrainedTokenizerFast"}


def tokenizer_class(kind: str, classes: str) -> str:
  """The transformers tokenizer class for a tokenizer of `kind` beside a model of the family `classes`:
  the family's own where it reads that kind, else the class that does (an ALBERT-shaped model, e.g. an
  ELECTRA with E != H, may have a WordPiece vocabulary)."""
  return classes + "Tokenizer" if _FAMILY_TOKENIZER_KIND.get(classes) == kind else _KIND_TOKENIZER_CLASS[kind]


_SPECIAL_NAMES = ("pad", "unk", "cls", "sep", "mask")


def _save_tokenizer(tokenizer, output, max_length: int, classes: str) -> None:
  """The tokenizer's files and its settings (SentencePiece's accents and spaces, the BPE's prefix space and
  special tokens, a tokenizer.json's own config) as transformers reads them, with `model_max_length`."""
  tokenizer.save(str(output))
  settings = checkpoint_loader.tokenizer_settings(str(output), tokenizer.do_lower_case)
  settings["model_max_length"] = max_length
  settings.setdefault("tokenizer_class", tokenizer_class(tokenizer.kind, classes))   # a tokenizer.json's names its own
  if tokenizer.kind != "tokenizer_json":
    # The special tokens by name, as the model's ids hold them: transformers' class defaults (AlbertTokenizer's
    # "<pad>", "<unk>") may be no token of this vocabulary (ours trains "[PAD]", "[UNK]"): padding then gave
    # an id past the embedding table.
    names = tokenizer.convert_ids_to_tokens([getattr(tokenizer, f"{t}_id") for t in _SPECIAL_NAMES])
    for t, name in zip(_SPECIAL_NAMES, names):
      settings.setdefault(f"{t}_token", name)
  (pathlib.Path(output) / checkpoint_loader.TOKENIZER_CONFIG).write_text(json.dumps(settings, indent=1) + "\n")
  if tokenizer.kind == "sentencepiece":   # transformers' AlbertTokenizer reads spiece.model
    (pathlib.Path(output) / tokenizer_lib.SPM_FILE).rename(pathlib.Path(output) / HF_SENTENCEPIECE_FILE)


def is_electra(checkpoint, params: dict) -> bool:
  """An ELECTRA model: a bert_jax run's params hold its "discriminator"; a Hugging Face directory says so in
  config.json (the encoder's config alone reads as BERT's or ALBERT's)."""
  return "discriminator" in params or checkpoint_loader.hf_model_type(checkpoint) == "electra"


def _export_electra(cfg, params, tokenizer, output, max_length: int) -> str:
  """A run's discriminator (OUTPUT) and generator (OUTPUT/generator); a Hugging Face directory's one model."""
  if "generator" in params:
    models, directories = electra_models(cfg, params), (output, pathlib.Path(output) / ELECTRA_GENERATOR)
  else:
    models, directories = [(cfg, {k: v for k, v in params.items() if k in ("bert", "discriminator", "mlm")})], [output]
  for directory, (model_cfg, model_params) in zip(directories, models):
    checkpoints_hf.save_hf(directory, model_cfg, model_params, model_type="electra", tokenizer=tokenizer)
    _save_tokenizer(tokenizer, directory, max_length, "Electra")
  return json.loads((pathlib.Path(output) / "config.json").read_text())["architectures"][0]


def electra_models(cfg, params) -> tuple:
  """An ELECTRA pretraining run's ((cfg, params) of the discriminator, of the generator), as
  `electra.hf_models` splits them; the generator's width is read from its params (a run records no
  `generator_hidden_fraction`), and its heads and intermediate size checked against them."""
  layer = params["generator"]["encoder"]["layer_0"]   # checkpoint_loader gives the unscanned layout
  hidden, heads, _ = layer["attention"]["query"]["kernel"].shape
  models = electra.hf_models(cfg, params, hidden / cfg.hidden_size)
  gen_cfg = models["generator"][0]
  found = (heads, layer["intermediate"]["kernel"].shape[1])
  if (gen_cfg.num_heads, gen_cfg.intermediate_size) != found:
    raise ValueError(f"the ELECTRA generator's params (heads, intermediate size) {found} are not those of a "
                     f"generator of width {hidden}: {(gen_cfg.num_heads, gen_cfg.intermediate_size)}")
  return models["discriminator"], models["generator"]


def main(argv) -> None:
  """`bert-jax export` (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for name in ("checkpoint", "output"):
    if FLAGS[name].value is None:
      raise app.UsageError(f"--{name} is required")
  # A checkpoint that is not there or cannot be exported: one paragraph, exit 2, as in every command.
  with failures.as_user_errors("bert-jax export", ValueError, FileNotFoundError, NotADirectoryError):
    architecture = export(FLAGS.checkpoint, paths.output_dir(FLAGS.output, "output"), FLAGS.vocab)
  print(f"wrote {architecture} to {FLAGS.output}")
  if (pathlib.Path(FLAGS.output) / ELECTRA_GENERATOR / "config.json").exists():
    print(f"wrote ElectraForMaskedLM (the generator) to {pathlib.Path(FLAGS.output) / ELECTRA_GENERATOR}")
