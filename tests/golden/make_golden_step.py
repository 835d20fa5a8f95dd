"""Writes bert_pretraining_step.npz: one MLM+NSP step of Hugging Face's BertForPreTraining on MiniLM.

The reference for tests/test_golden_step.py, made once so the test needs no torch. It runs with torch and
transformers only (never bert_jax):

  python -m venv /tmp/hf_venv && /tmp/hf_venv/bin/pip install torch 'transformers<5' numpy safetensors
  /tmp/hf_venv/bin/python tests/golden/make_golden_step.py [MODEL_DIR [OUT_FILE]]

MODEL_DIR defaults to ../shared/data/minilm beside the repository, OUT_FILE to bert_pretraining_step.npz
beside this script. Repeated runs write identical files (this one: torch 2.14.1, transformers 4.57.6).

MiniLM is a BertModel, so the pretraining heads (transform dense + LayerNorm, output bias, NSP dense) are
drawn from a seeded numpy RNG and stored with the step; the decoder stays tied to the word embeddings.
The weights are float32 as stored, the step is computed in float64 (`model.double()`), so the reference
carries no rounding of its own and a test's tolerance covers only the float32 rounding of the side tested.

Stored (HF layout and names, `bert.` prefix):
  input_ids, attention_mask, token_type_ids [B, L]; mlm_labels [B, L] (-100 where not predicted);
  next_sentence_label [B]; loss, mlm_loss, nsp_loss (scalars);
  head/<name>: the head tensors;
  grad_norm/<name>, grad_sum/<name>, grad_index/<name> (flat indices: the 64 largest |g| and 64 uniformly
  drawn others; all of a tensor with <= 128 entries) and grad_value/<name> for every parameter of the
  model (tied tensors once, under their bert./cls. name).
"""

import pathlib
import sys

import numpy as np
import torch
import transformers

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_MODEL_DIR = HERE.parents[2] / "shared" / "data" / "minilm"
DEFAULT_OUT_FILE = HERE / "bert_pretraining_step.npz"
SEED = 0
SEQ_LENGTH = 32
TOP, RANDOM = 64, 64
# (sentence A, sentence B, next_sentence_label): 0 = B follows A, 1 = B is a random sentence (as HF).
PAIRS = [
    ("the cat sat on the mat near the door.", "it was waiting for its owner to come home.", 0),
    ("rain fell over the city all night.", "the museum opens at nine in the morning.", 1),
    ("she opened the book and began to read.", "the first chapter was about a small village by the sea.", 0),
]


def make_batch(tokenizer, rng):
  """Token ids [B, L] with padding, and MLM labels with 80/10/10 [MASK]/random/kept (Devlin et al. 2019, 3.1)."""
  ids, types, mask, labels = (np.zeros((len(PAIRS), SEQ_LENGTH), np.int64) for _ in range(4))
  labels[:] = -100
  kinds = set()
  for row, (a, b, _) in enumerate(PAIRS):
    tokens_a, tokens_b = tokenizer.tokenize(a), tokenizer.tokenize(b)
    tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
    assert len(tokens) <= SEQ_LENGTH, (len(tokens), tokens)
    n = len(tokens)
    ids[row, :n] = tokenizer.convert_tokens_to_ids(tokens)
    types[row, len(tokens_a) + 2:n] = 1
    mask[row, :n] = 1
    candidates = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
    chosen = rng.choice(candidates, size=max(2, round(0.15 * len(candidates))), replace=False)
    for pos in sorted(chosen):
      labels[row, pos] = ids[row, pos]
      u = rng.random()
      if u < 0.8:
        ids[row, pos], kind = tokenizer.mask_token_id, "mask"
      elif u < 0.9:
        ids[row, pos], kind = rng.integers(1000, tokenizer.vocab_size), "random"
      else:
        kind = "kept"
      kinds.add(kind)
  assert kinds == {"mask", "random", "kept"}, kinds  # the seed gives every kind of masked token
  assert (mask == 0).any()  # some padding
  nsp = np.array([label for _, _, label in PAIRS], np.int64)
  return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, mlm_labels=labels,
              next_sentence_label=nsp)


def set_heads(hf_model, rng) -> dict:
  """Seeded non-trivial head weights (LayerNorm not identity, biases not zero); returns them by name."""
  h = hf_model.config.hidden_size
  values = {
      "cls.predictions.transform.dense.weight": rng.normal(0, 1 / np.sqrt(h), (h, h)),
      "cls.predictions.transform.dense.bias": rng.normal(0, 0.1, h),
      "cls.predictions.transform.LayerNorm.weight": 1 + rng.normal(0, 0.1, h),
      "cls.predictions.transform.LayerNorm.bias": rng.normal(0, 0.1, h),
      "cls.predictions.bias": rng.normal(0, 0.1, hf_model.config.vocab_size),
      "cls.seq_relationship.weight": rng.normal(0, 1 / np.sqrt(h), (2, h)),
      "cls.seq_relationship.bias": rng.normal(0, 0.1, 2),
  }
  values = {k: v.astype(np.float32) for k, v in values.items()}
  params = dict(hf_model.named_parameters())
  with torch.no_grad():
    for name, value in values.items():
      params[name].copy_(torch.from_numpy(value))
  decoder = hf_model.cls.predictions.decoder
  assert decoder.weight is hf_model.bert.embeddings.word_embeddings.weight
  assert decoder.bias is hf_model.cls.predictions.bias
  return values


def gradient_summary(name, grad, rng) -> dict:
  """Norm, sum and values at fixed indices of one gradient: the stored part of it (all of it is ~90 MB)."""
  flat = grad.reshape(-1)
  if flat.size <= TOP + RANDOM:
    index = np.arange(flat.size)
  else:
    top = np.argpartition(-np.abs(flat), TOP)[:TOP]
    others = np.setdiff1d(np.arange(flat.size), top)
    index = np.sort(np.concatenate([top, rng.choice(others, RANDOM, replace=False)]))
  return {f"grad_norm/{name}": np.linalg.norm(flat), f"grad_sum/{name}": flat.sum(),
          f"grad_index/{name}": index.astype(np.int32), f"grad_value/{name}": flat[index]}


def main(model_dir=DEFAULT_MODEL_DIR, out_file=DEFAULT_OUT_FILE):
  rng = np.random.default_rng(SEED)
  tokenizer = transformers.BertTokenizer(f"{model_dir}/vocab.txt", do_lower_case=True)
  hf_model = transformers.BertForPreTraining.from_pretrained(model_dir, attn_implementation="eager")
  hf_model.eval()  # no dropout; gradients are still computed
  heads = set_heads(hf_model, rng)
  hf_model.double()
  assert hf_model.cls.predictions.decoder.weight is hf_model.bert.embeddings.word_embeddings.weight
  batch = make_batch(tokenizer, rng)
  inputs = {k: torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
  out = hf_model(**inputs, labels=torch.from_numpy(batch["mlm_labels"]),
                 next_sentence_label=torch.from_numpy(batch["next_sentence_label"]))
  out.loss.backward()
  # The loss again from the logits, in parts: HF's is mean MLM CE over labelled positions + mean NSP CE.
  ce = torch.nn.functional.cross_entropy
  vocab = hf_model.config.vocab_size
  mlm_loss = ce(out.prediction_logits.view(-1, vocab), torch.from_numpy(batch["mlm_labels"]).view(-1))
  nsp_loss = ce(out.seq_relationship_logits, torch.from_numpy(batch["next_sentence_label"]))
  assert torch.allclose(mlm_loss + nsp_loss, out.loss)
  record = {k: v.astype(np.int32) for k, v in batch.items()}
  record.update(loss=out.loss.detach().numpy(), mlm_loss=mlm_loss.detach().numpy(),
                nsp_loss=nsp_loss.detach().numpy())
  record.update({f"head/{k}": v for k, v in heads.items()})
  for name, param in hf_model.named_parameters():
    record.update(gradient_summary(name, param.grad.numpy(), rng))
  np.savez_compressed(out_file, **record)
  print(f"loss {out.loss.item():.6f} (mlm {mlm_loss.item():.6f}, nsp {nsp_loss.item():.6f}); "
        f"{sum(k.startswith('grad_norm/') for k in record)} gradients -> {out_file}")


if __name__ == "__main__":
  main(*sys.argv[1:])
