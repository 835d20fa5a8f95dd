"""`bench train`'s synthetic batch is the batch the train step compiles against, for every objective."""

import numpy as np
import pytest

from bert_jax import objectives, train
from bert_jax.objectives import base
from bert_jax.tools import bench_train
from configs import tiny

# The fields each objective asks of a config (its `validate`), on top of the tiny config.
OBJECTIVES = {
    "bert": {},
    "roberta": {"data.format": "full_sentences", "model.type_vocab_size": 1},
    "spanbert": {"data.format": "doc_sentences", "data.span_masking": True},
    "ltr": {"data.format": "full_sentences", "model.causal": True},
    "albert": {"data.format": "sop", "model.share_layers": True, "model.embedding_size": 64},
    "electra": {"data.format": "full_sentences"},
    # No checkpoint: the teacher's size is a preset (compile-only uses).
    "distilbert": {"data.format": "full_sentences", "model.type_vocab_size": 0, "distill.teacher_preset": "tiny"},
    "modernbert": {"data.format": "doc_sentences", "model.type_vocab_size": 0, "model.rope_theta": 10000.0,
                   "model.geglu": True, "model.pre_norm": True, "model.final_norm": True,
                   "model.global_attn_every_n_layers": 2, "model.local_attention": 8},
}
CASES = [(name, packing) for name in objectives.NAMES for packing in (False, True)
         if name in OBJECTIVES and not (name == "ltr" and packing)]


def _config(objective: str, packing: bool):
  c = tiny.get_config()
  c.objective, c.data.packing, c.global_batch_size = objective, packing, 16
  for key, value in OBJECTIVES[objective].items():
    section, _, name = key.rpartition(".")
    c[section][name] = value
  train.validate(c, num_devices=8)
  return c


def test_every_objective_is_covered():
  missing = set(objectives.NAMES) - set(OBJECTIVES)
  assert not missing, f"add the config fields of objectives {sorted(missing)} to OBJECTIVES"


@pytest.mark.parametrize("objective,packing", CASES)
def test_synthetic_batch_has_the_abstract_batch_layout(objective, packing):
  config = _config(objective, packing)
  batch, abstract = bench_train.synthetic_batch(config), train.abstract_batch(config)
  assert list(batch) == list(abstract)
  for name, spec in abstract.items():
    assert (batch[name].shape, batch[name].dtype) == (spec.shape, spec.dtype), name


@pytest.mark.parametrize("objective,packing", CASES)
def test_synthetic_batch_values_lie_in_the_schema_ranges(objective, packing):
  config = _config(objective, packing)
  batch = bench_train.synthetic_batch(config)
  vocab = train.bert_config(config).vocab_size
  for name, field in objectives.get(config).batch_schema(config.data, config.global_batch_size).items():
    high = vocab if field.high == "vocab" else field.high
    values = batch[name]
    # Integers lie in [0, high); float weights in [0, high].
    assert 0 <= values.min() and (values.max() <= high if values.dtype.kind == "f" else values.max() < high), name
  # One-segment formats have one token type (RoBERTa's type vocabulary has a single entry).
  if config.data.format in base.SINGLE_FORMATS:
    np.testing.assert_array_equal(batch["segment_ids"], 0)
  else:
    assert set(np.unique(batch["segment_ids"])) == {0, 1}


@pytest.mark.slow
def test_times_a_distillation_step_with_a_random_teacher():
  config = _config("distilbert", False)
  config.mesh.data, config.mesh.fsdp = -1, 2   # the 8 test devices
  times = bench_train.time_train_steps(config, steps=1, warmup=1)
  assert len(times) == 1 and times[0] > 0
