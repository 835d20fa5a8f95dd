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
(BertForPreTraining, AlbertForPreTraining, RobertaForMaskedLM), or BertModel (...) when it has no MLM head.
The directory also gets the vocabulary and a tokenizer_config.json (lower-casing, maximum length), so
`AutoTokenizer` loads it. A scalar-mix head has no `transformers` class: an error; so has a RoBERTa sequence
classifier (RobertaForSequenceClassification's head is two layers on <s>, ours the pooler and one).
"""

import json
import pathlib

from absl import app
from absl import flags

from bert_jax import checkpoint_loader
from bert_jax.interop import checkpoints_hf
from bert_jax.finetune import trainer

FLAGS = flags.FLAGS
# The class of a finetuned BERT head; other families change the stem (`checkpoints_hf.Family.classes`).
ARCHITECTURES = {"classification": "BertForSequenceClassification", "regression": "BertForSequenceClassification",
                 "tagging": "BertForTokenClassification", "span": "BertForQuestionAnswering"}


def define_flags() -> None:
  """The command's flags, defined when the CLI runs it."""
  flags.DEFINE_string("checkpoint", None, "A finetuned workdir, or any checkpoint bert-jax reads.")
  flags.DEFINE_string("output", None, "The Hugging Face directory to write.")


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


def export(checkpoint, output) -> str:
  """Writes the Hugging Face directory `output` for `checkpoint` (see the module docstring); returns
  its class name."""
  cfg, params, tokenizer = checkpoint_loader.load(checkpoint)
  record = trainer.read_task_record(checkpoint)
  max_length = cfg.max_position_embeddings
  if record is None:
    params = {k: v for k, v in params.items() if k in ("bert", "mlm", "nsp")}
    fields, pooler = {}, None   # as the class written has one
  else:
    if record.get("scalar_mix"):
      raise ValueError(f"{checkpoint}: a scalar-mix model (finetuned with scalar_mix) has no transformers class; "
                       "finetune without scalar_mix to export")
    classes = checkpoints_hf.family(cfg).classes
    if classes == "Roberta" and record["kind"] in ("classification", "regression"):
      raise ValueError(f"{checkpoint}: RobertaForSequenceClassification's head (dense, tanh, out_proj on <s>, no "
                       "pooler) is not written; export a tagging or span model, or the encoder")
    head = "qa_outputs" if record["kind"] == "span" else "classifier"
    params, fields = {"bert": params["bert"], head: params[head]}, head_config(record, classes)
    pooler = record["kind"] in ("classification", "regression")   # the HF token and QA classes have none
    max_length = record["max_seq_length"]
  checkpoints_hf.save_hf(output, cfg, params, config_fields=fields, pooler=pooler)
  tokenizer.save(str(output))
  (pathlib.Path(output) / checkpoint_loader.TOKENIZER_CONFIG).write_text(json.dumps(
      {"do_lower_case": tokenizer.do_lower_case, "model_max_length": max_length,
       "tokenizer_class": checkpoints_hf.family(cfg).classes + "Tokenizer"}, indent=1) + "\n")
  return json.loads((pathlib.Path(output) / "config.json").read_text())["architectures"][0]


def main(argv) -> None:
  """`bert-jax export` (see the module docstring)."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for name in ("checkpoint", "output"):
    if FLAGS[name].value is None:
      raise app.UsageError(f"--{name} is required")
  try:
    architecture = export(FLAGS.checkpoint, FLAGS.output)
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"bert-jax export: {e}") from None
  print(f"wrote {architecture} to {FLAGS.output}")
