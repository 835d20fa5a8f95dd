"""The left-to-right baseline of Devlin et al. 2019, Table 5 ("LTR & No NSP"), at BERT-base's size.

    bert-jax pretrain --config=configs/ltr_base.py:phase1 --workdir=gs://bucket/ltr_base/phase1 ...

5.1: "A left-context-only model which is trained using a standard Left-to-Right (LTR) LM, rather than
an MLM. The left-only constraint was also applied at fine-tuning ... Additionally, this model was
pre-trained without the NSP task." and "trained on the same pre-training data, fine-tuning scheme, and
hyperparameters as BERT-BASE": `bert_base.py`'s schedule, with a causal mask (kept in the run record,
so finetuning keeps it), every next token predicted, one-segment inputs.
"""

from configs import bert_base


def get_config(arg: str = "phase1"):
  c = bert_base.get_config(arg)
  c.objective = "ltr"
  c.model.causal = True
  # Unrolled: with every next token predicted, phase1_tokens scanned is at its compute's edge on v3:4x4
  # (memory 44.3 ms, 19.9 GB by op, against compute 44.5 ms; unrolled 39.0 against 46.6 ms).
  c.model.scan_layers = False
  c.data.format = "full_sentences"
  return c
