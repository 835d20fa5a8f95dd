"""ELECTRA (Clark et al. 2020): the Hugging Face generator and discriminator of ../shared/data/families/electra
read as our encoder and heads (transformers' outputs on fixed inputs), and written back."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from bert_jax.models import heads
from conftest import shared_path


@functools.cache
def _load(kind):
  path = shared_path("families", "electra", kind)
  return (path, *checkpoints_hf.load_hf(path))


def _examples(path):
  """Every example of reference.npz right-padded into one batch: (inputs, hidden states, logits, real)."""
  ref = np.load(path / "reference.npz")
  names = sorted({k.split("/")[0] for k in ref.files})
  length = max(ref[f"{n}/input_ids"].shape[1] for n in names)

  def stacked(key, seq_axis):
    pad = lambda x: np.pad(x, [(0, length - x.shape[a] if a == seq_axis else 0) for a in range(x.ndim)])
    return np.concatenate([pad(ref[f"{n}/{key}"]) for n in names])

  inputs = {ours: stacked(theirs, 1).astype(np.int32) for ours, theirs in
            (("input_ids", "input_ids"), ("input_mask", "attention_mask"), ("segment_ids", "token_type_ids"))}
  return inputs, stacked("hidden_states", 2), stacked("logits", 1), inputs["input_mask"] == 1


def _discriminator_logits(cfg, head, x_BLH):
  """transformers' ElectraDiscriminatorPredictions: dense, hidden_act, dense_prediction -> [B, L]."""
  h = model.gelu(cfg, x_BLH @ head["dense"]["kernel"] + head["dense"]["bias"])
  return (h @ head["prediction"]["kernel"] + head["prediction"]["bias"])[..., 0]


@functools.cache
def _run(kind):
  """Max abs errors against transformers at real positions: {"hidden_states", "logits"}."""
  path, cfg, params = _load(kind)
  inputs, ref_hidden, ref_logits, real = _examples(path)

  @jax.jit
  def fn(params, inputs):
    enc = model.BertEncoder(cfg).apply({"params": params["bert"]}, inputs["input_ids"], inputs["input_mask"],
                                       inputs["segment_ids"], output_hidden_states=True)
    if kind == "generator":
      logits = heads.BertForPreTraining(cfg, use_nsp=False, mlm_all_positions=True).apply(
          {"params": params}, inputs)["mlm_logits"]
    else:
      logits = _discriminator_logits(cfg, params["discriminator"], enc["sequence_output"])
    return jnp.moveaxis(enc["hidden_states"], 0, 1), logits

  hidden, logits = fn(params, inputs)
  err_hidden = np.abs(np.asarray(hidden) - ref_hidden).transpose(0, 2, 1, 3)[real].max()
  return {"hidden_states": float(err_hidden), "logits": float(np.abs(np.asarray(logits) - ref_logits)[real].max())}


@pytest.mark.parametrize("kind", ["discriminator", "generator"])
def test_import_matches_transformers_outputs(kind):
  errors = _run(kind)
  print(kind, "max abs err vs transformers:", errors)
  assert max(errors.values()) <= 1e-4, errors


def test_configs_read_as_the_encoder_switches():
  _, disc, disc_params = _load("discriminator")
  _, gen, gen_params = _load("generator")
  # Embedding size 32: projected to the discriminator's 64, not to the generator's 32 (no embeddings_project).
  assert (disc.embedding_size, disc.hidden_size, disc.share_layers, disc.hidden_act) == (32, 64, False, "gelu")
  assert (gen.embedding_size, gen.hidden_size, gen.num_heads) == (None, 32, 2)
  assert set(disc_params) == {"bert", "discriminator"} and set(gen_params) == {"bert", "mlm"}
  assert "projection" in disc_params["bert"]["embeddings"] and "projection" not in gen_params["bert"]["embeddings"]
  assert gen_params["mlm"]["transform"]["kernel"].shape == (32, 32)  # generator_predictions.dense: H -> E


@pytest.mark.parametrize("kind", ["discriminator", "generator"])
def test_export_writes_the_same_directory_and_reimports_identically(kind, tmp_path):
  path, cfg, params = _load(kind)
  checkpoints_hf.save_hf(tmp_path, cfg, params, model_type="electra")
  keys = ("model_type", "architectures", "embedding_size", "hidden_size", "num_hidden_layers", "intermediate_size",
          "vocab_size", "type_vocab_size", "max_position_embeddings", "hidden_act")
  written, original = ({k: json.loads((p / "config.json").read_text()).get(k) for k in keys} for p in (tmp_path, path))
  assert written == original
  # The very tensors transformers saved, names and values (no pooler, no tied decoder), and back again.
  jax.tree.map(np.testing.assert_array_equal, checkpoints_hf.read_safetensors(tmp_path),
               checkpoints_hf.read_safetensors(path))
  assert checkpoints_hf.load_hf(tmp_path)[0] == cfg
  jax.tree.map(np.testing.assert_array_equal, checkpoints_hf.load_hf(tmp_path)[1], params)


def test_electra_config_errors_name_what_transformers_lacks():
  cfg = model.BertConfig(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
  assert checkpoints_hf.electra_config(checkpoints_hf.electra_hf_dict(cfg)) == cfg
  with pytest.raises(ValueError, match="ELECTRA shares no layers"):
    checkpoints_hf.electra_hf_dict(model.BertConfig(embedding_size=8, share_layers=True))
  bad = {"electra.embeddings.word_embeddings.weight": np.zeros((3, 16), np.float32)}
  with pytest.raises(ValueError, match="does not match the electra config"):
    checkpoints_hf.from_state_dict(cfg, bad, model_type="electra")
