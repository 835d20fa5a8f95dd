"""Golden step: our pretraining loss and every gradient on MiniLM equal Hugging Face's BertForPreTraining.

The reference, tests/golden/bert_pretraining_step.npz, is written once by tests/golden/make_golden_step.py
with torch and transformers (its docstring has the command): one MLM+NSP batch of real text with padding
and [MASK]/random/kept tokens, seeded pretraining heads (MiniLM is a bare BertModel), HF's loss and, for
every parameter, the gradient's L2 norm, its sum and its values at 128 fixed indices, all in HF layout and
computed in float64. Our gradients are converted to HF layout by `checkpoints_hf.to_state_dict`, the
tested export path, so no second name table is involved.

Tolerance: relative 1e-4, with a floor where float32 rounding, not the model, decides:
  loss, norm: |ours - ref| <= 1e-4 |ref|
  values:     |ours - ref| <= 1e-4 (|ref| + 1e-2 max|ref|), max over the parameter's stored values (its
              largest entry among them): relative 1e-4 on entries above 1% of the largest, 1e-6 of the
              largest below. A float32 backward pass is no more exact than that: HF's own float32 gradients
              exceed 1e-4 |ref| by up to 4.2e-7 of the largest entry against this float64 reference.
  sum:        |ours - ref| <= 1e-4 (|ref| + 1e-2 sqrt(n) norm), sqrt(n) norm bounding sum |g|; many sums
              are 0 in exact arithmetic (weights feeding a LayerNorm, the embeddings, the output bias).
A parameter whose reference gradient norm is below 1e-6 of the largest norm has a zero gradient in exact
arithmetic (the attention key biases: softmax ignores a shift shared by all keys); ours must be as small.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import checkpoints_hf
from bert_jax.models import heads
from bert_jax.models import encoder as model
from bert_jax.objectives import bert as bert_objective
from tests.conftest import shared_path

GOLDEN = pathlib.Path(__file__).parent / "golden" / "bert_pretraining_step.npz"
RTOL = 1e-4
FLOOR = 1e-2  # of the gradient's scale: below it, relative error is float32 rounding
ZERO = 1e-6   # of the largest gradient norm: a gradient that is exactly 0 in exact arithmetic


def our_batch(ref) -> dict:
  """The stored HF batch in our layout: per-token labels (-100: none) -> masked_lm_positions/ids/weights."""
  labels = ref["mlm_labels"]
  rows = [np.flatnonzero(row != -100) for row in labels]
  positions = np.zeros((len(rows), max(map(len, rows))), np.int32)
  weights = np.zeros(positions.shape, np.float32)
  for r, index in enumerate(rows):
    positions[r, :len(index)], weights[r, :len(index)] = index, 1
  ids = np.where(weights > 0, np.take_along_axis(labels, positions, axis=1), 0)
  return {"input_ids": ref["input_ids"], "input_mask": ref["attention_mask"], "segment_ids": ref["token_type_ids"],
          "masked_lm_positions": positions, "masked_lm_ids": ids.astype(np.int32), "masked_lm_weights": weights,
          "next_sentence_labels": ref["next_sentence_label"]}


@pytest.fixture(scope="module")
def step():
  """(reference arrays, our loss, our gradients as {HF name: array})."""
  path = shared_path("minilm")
  ref = dict(np.load(GOLDEN))
  cfg = model.BertConfig.from_hf_dict(json.loads((path / "config.json").read_text()), dtype=jnp.float32)
  head_tensors = {k.removeprefix("head/"): v for k, v in ref.items() if k.startswith("head/")}
  params = checkpoints_hf.from_state_dict(cfg, {**checkpoints_hf.read_safetensors(path), **head_tensors})
  assert set(params) == {"bert", "mlm", "nsp"}
  bert = heads.BertForPreTraining(cfg)

  def loss_fn(p, batch):
    outputs = bert.apply({"params": p}, batch, deterministic=True)
    return bert_objective.loss(bert_objective.loss_sums(outputs, batch))

  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params, our_batch(ref))
  return ref, float(loss), checkpoints_hf.to_state_dict(cfg, grads)


def reference_names(ref) -> set:
  return {k.removeprefix("grad_norm/") for k in ref if k.startswith("grad_norm/")}


def test_loss_matches(step):
  ref, loss, _ = step
  error = abs(loss - ref["loss"]) / ref["loss"]
  print(f"loss {loss:.7f} vs {float(ref['loss']):.7f}: relative error {error:.1e}")
  assert error <= RTOL


def test_every_parameter_has_a_reference_gradient(step):
  ref, _, grads = step
  assert len(grads) == 110  # 5 embedding + 6 x 16 layer + 2 pooler + 7 head tensors (decoder tied)
  assert set(grads) == reference_names(ref)


def _excess(ours, ref, floor):
  """|ours - ref| / (RTOL (|ref| + floor)): the tolerance holds where this is <= 1."""
  return np.abs(ours - ref) / (RTOL * (np.abs(ref) + floor))


def _relative(ours, ref, floor):
  """Max relative error over the entries of |ref| above the floor (0 when there are none)."""
  ours, ref = np.atleast_1d(ours), np.atleast_1d(ref)
  big = np.abs(ref) > floor
  return float((np.abs(ours[big] - ref[big]) / np.abs(ref[big])).max(initial=0.0))


def test_gradients_match(step):
  ref, _, grads = step
  largest_norm = max(ref[f"grad_norm/{n}"] for n in reference_names(ref))
  excess, relative = {}, {"norm": 0.0, "sum": 0.0, "values": 0.0}
  for name, grad in grads.items():
    g = grad.reshape(-1).astype(np.float64)
    norm, total = ref[f"grad_norm/{name}"], ref[f"grad_sum/{name}"]
    if norm < ZERO * largest_norm:
      assert np.linalg.norm(g) < ZERO * largest_norm, (name, np.linalg.norm(g), norm)
      continue
    values = ref[f"grad_value/{name}"]
    ours_values = g[ref[f"grad_index/{name}"]]
    sum_floor, value_floor = FLOOR * np.sqrt(g.size) * norm, FLOOR * np.abs(values).max()
    excess[name] = max(_excess(np.linalg.norm(g), norm, 0.0), _excess(g.sum(), total, sum_floor),
                       _excess(ours_values, values, value_floor).max())
    relative["norm"] = max(relative["norm"], _relative(np.linalg.norm(g), norm, 0.0))
    relative["sum"] = max(relative["sum"], _relative(g.sum(), total, sum_floor))
    relative["values"] = max(relative["values"], _relative(ours_values, values, value_floor))
  worst = max(excess, key=excess.get)
  print(f"{len(excess)} gradients compared; max relative errors {relative}; "
        f"worst {worst} at {excess[worst]:.2f} of the tolerance")
  assert excess[worst] <= 1, (worst, excess[worst])
