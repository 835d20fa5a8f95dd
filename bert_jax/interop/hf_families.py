"""The Hugging Face families of the BERT kind and how each names its tensors and classes (`FAMILIES`), read by
`checkpoints_hf`'s conversion.

ELECTRA (Clark et al. 2020) is BERT's encoder with ALBERT's embeddings projection when its `embedding_size`
differs from the hidden size, and no pooler: `ElectraForMaskedLM` (the generator; `generator_predictions`
and `generator_lm_head` are our "mlm") and `ElectraForPreTraining` (the discriminator;
`discriminator_predictions` is our "discriminator": {"dense", "prediction"}, one logit per token). Its
config reads as a BertConfig with or without `embedding_size`, so the family is passed by name
(`model_type="electra"`) where the config cannot tell it; `checkpoints_hf.load_hf` reads it from config.json.

DistilBERT (Sanh et al. 2019) is BERT's encoder without token types (`type_vocab_size=0`) or pooler, under
other names (`transformer.layer.{i}.attention.q_lin`, `sa_layer_norm`, `ffn.lin1` ...);
`DistilBertForMaskedLM`'s `vocab_transform`, `vocab_layer_norm` and `vocab_projector` (its weight tied to the
word embeddings, its bias the MLM bias) are our "mlm".

ModernBERT (Warner et al. 2024; `ModernBertModel`, `ModernBertForMaskedLM`) fuses query, key and value into
one tensor; its table and conversion are `modernbert_hf`'s.
"""

import dataclasses

from bert_jax.interop import modernbert_hf
from bert_jax.models import encoder as model

# Buffers, not weights: the position ids are arange(max_position_embeddings).
IGNORED = ("embeddings.position_ids",)
# Finetuning heads: our params key = the HF tensor prefix. Saved at the top level, beside the encoder's.
HEADS = ("classifier", "qa_outputs")
# RobertaForSequenceClassification's head is our pooler and classifier under other names: a dense layer and tanh on
# the first token, then the output layer (`RobertaClassificationHead`; its encoder saves no pooler). HF name -> ours.
ROBERTA_SEQUENCE_HEAD = {"classifier.dense.": "pooler.dense.", "classifier.out_proj.": "classifier."}


def sequence_head_from_hf(name: str) -> str:
  """A RobertaForSequenceClassification tensor's name (the family's prefix stripped) as ours."""
  return _renamed(name, ROBERTA_SEQUENCE_HEAD)


def sequence_head_to_hf(name: str, prefix: str) -> str:
  """Our pooler's and classifier's tensor names (the pooler's under the family's `prefix`) as
  RobertaForSequenceClassification's."""
  ours_to_hf = {(prefix if ours.startswith("pooler.") else "") + ours: hf for hf, ours in ROBERTA_SEQUENCE_HEAD.items()}
  return _renamed(name, ours_to_hf)


def _renamed(name: str, prefixes: dict) -> str:
  """`name` with the first of `prefixes` it starts with replaced by its value."""
  return next((new + name.removeprefix(old) for old, new in prefixes.items() if name.startswith(old)), name)


@dataclasses.dataclass(frozen=True)
class Family:
  """How one `model_type` names its tensors and classes."""
  prefix: str        # of the encoder's tensors in a checkpoint with heads
  classes: str       # class names: f"{classes}Model", f"{classes}ForMaskedLM", ...
  layer: str         # layer {i}'s tensors (ALBERT: group {i}, the only group when layers are shared)
  layer_names: dict  # our layer submodule -> its HF module under `layer`
  pooler: str        # the pooler's dense layer
  mlm: tuple         # HF modules of our mlm transform, layer_norm; then the bias tensor
  decoder: str       # the tied decoder (weight = word embeddings, bias = the mlm bias): never written
  nsp: str | None    # the sentence-pair head on the pooled output
  pretraining: str | None  # the class written for params with MLM and NSP heads
  masked_lm: str     # the class written for params with an MLM head only
  projection: str = "encoder.embedding_hidden_mapping_in"  # embeddings -> hidden size (embedding_size set)
  discriminator: str | None = None  # ELECTRA's replaced-token head (dense, act, dense_prediction)


_BERT_LAYER = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
               "out": "attention.output.dense", "attention_layer_norm": "attention.output.LayerNorm",
               "intermediate": "intermediate.dense", "output": "output.dense",
               "output_layer_norm": "output.LayerNorm"}
FAMILIES = {
    "bert": Family("bert.", "Bert", "encoder.layer.{i}.", _BERT_LAYER, "pooler.dense",
                   ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"),
                   "cls.predictions.decoder", "cls.seq_relationship", "BertForPreTraining", "BertForPreTraining"),
    "albert": Family("albert.", "Albert", "encoder.albert_layer_groups.{i}.albert_layers.0.",
                     {"query": "attention.query", "key": "attention.key", "value": "attention.value",
                      "out": "attention.dense", "attention_layer_norm": "attention.LayerNorm",
                      "intermediate": "ffn", "output": "ffn_output", "output_layer_norm": "full_layer_layer_norm"},
                     "pooler",
                     ("predictions.dense", "predictions.LayerNorm", "predictions.bias"), "predictions.decoder",
                     "sop_classifier.classifier", "AlbertForPreTraining", "AlbertForMaskedLM"),
    "roberta": Family("roberta.", "Roberta", "encoder.layer.{i}.", _BERT_LAYER, "pooler.dense",
                      ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias"), "lm_head.decoder", None, None,
                      "RobertaForMaskedLM"),
    # No pooler is saved (None): ours is newly initialised on import and never written.
    "distilbert": Family("distilbert.", "DistilBert", "transformer.layer.{i}.",
                         {"query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
                          "out": "attention.out_lin", "attention_layer_norm": "sa_layer_norm",
                          "intermediate": "ffn.lin1", "output": "ffn.lin2", "output_layer_norm": "output_layer_norm"},
                         None, ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias"), "vocab_projector",
                         None, None, "DistilBertForMaskedLM"),
    "electra": Family("electra.", "Electra", "encoder.layer.{i}.", _BERT_LAYER, None,
                      ("generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head.bias"),
                      "generator_lm_head", None, None, "ElectraForMaskedLM", projection="embeddings_project",
                      discriminator="discriminator_predictions"),
    # Names and conversion: modernbert_hf (one fused Wqkv per layer); no pooler, no sentence-pair head.
    "modernbert": Family(modernbert_hf.PREFIX, "ModernBert", "layers.{i}.", {}, None, modernbert_hf.HEAD,
                         "decoder", None, None, "ModernBertForMaskedLM"),
}


def family(cfg: model.BertConfig, model_type: str | None = None) -> Family:
  """The tensor names of `model_type`'s Hugging Face family; None: `cfg.model_type`."""
  return FAMILIES[model_type or cfg.model_type]


def top_level(fam: Family) -> tuple:
  """Prefixes of the tensors saved beside the encoder's, not under its prefix."""
  heads_ = [h for h in (fam.nsp, fam.discriminator, *HEADS) if h]
  return mlm_names(fam) + tuple(f"{h}." for h in heads_)


def mlm_names(fam: Family) -> tuple:
  """Prefixes of the MLM head's tensors."""
  transform, norm, bias = fam.mlm
  return (f"{transform}.", f"{norm}.", bias, f"{fam.decoder}.")


def tied(fam: Family) -> dict:
  """Tied copies: checked equal on import, never written on export (DistilBERT's decoder bias is the MLM bias
  itself, no copy)."""
  tied = {f"{fam.decoder}.weight": "embeddings.word_embeddings.weight", f"{fam.decoder}.bias": fam.mlm[2]}
  return {name: target for name, target in tied.items() if name != target}
