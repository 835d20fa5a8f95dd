"""Exported directories load in `transformers` and give our outputs (skipped without torch/transformers)."""

import jax
import numpy as np
import pytest

from bert_jax.interop import checkpoints_hf
from bert_jax.models import heads
from bert_jax.models import encoder as model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.slow
def test_transformers_loads_export_with_heads(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  cfg = model.BertConfig.from_preset("tiny", vocab_size=60, max_position_embeddings=24, scan_layers=True)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 60, size=(2, 10)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  seg = np.array([[0] * 5 + [1] * 5] * 2, np.int32)
  batch = {"input_ids": ids, "input_mask": mask, "segment_ids": seg}
  m = heads.BertForPreTraining(cfg, mlm_all_positions=True)
  params = jax.jit(m.init)(jax.random.key(3), batch)["params"]
  # Jitted: one compilation each instead of one per operation.
  ours = jax.jit(lambda p, b: m.apply({"params": p}, b))(params, batch)
  hidden = jax.jit(lambda p: model.BertEncoder(cfg).apply({"params": p}, ids, mask, seg))(params["bert"])
  checkpoints_hf.save_hf(tmp_path, cfg, params)

  as_torch = lambda x: torch.tensor(np.asarray(x, np.int64))
  inputs = dict(input_ids=as_torch(ids), attention_mask=as_torch(mask), token_type_ids=as_torch(seg))
  with torch.no_grad():
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()(**inputs)
    bare = transformers.BertModel.from_pretrained(tmp_path).eval()(**inputs)
  real = mask == 1
  errors = {
      "mlm_logits": np.abs(hf.prediction_logits.numpy() - ours["mlm_logits"])[real].max(),
      "nsp_logits": np.abs(hf.seq_relationship_logits.numpy() - ours["nsp_logits"]).max(),
      "last_hidden_state": np.abs(bare.last_hidden_state.numpy() - hidden["sequence_output"])[real].max(),
      "pooler_output": np.abs(bare.pooler_output.numpy() - hidden["pooled_output"]).max(),
  }
  print("max abs err vs transformers:", errors)
  assert max(errors.values()) <= 1e-4, errors


@pytest.mark.slow
def test_import_of_a_transformers_saved_pretraining_model(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  torch.manual_seed(0)
  hf_cfg = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=24)
  hf_model = transformers.BertForPreTraining(hf_cfg).eval()
  with torch.no_grad():  # non-trivial LayerNorms and biases, so a swapped tensor would show
    for p in hf_model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  hf_model.save_pretrained(tmp_path)
  cfg, params = checkpoints_hf.load_hf(tmp_path)
  assert set(params) == {"bert", "mlm", "nsp"}
  ids = np.array([[2, 7, 9, 11, 3, 5, 6, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  seg = np.array([[0, 0, 0, 0, 0, 1, 1, 0]], np.int32)
  batch = {"input_ids": ids, "input_mask": mask, "segment_ids": seg}
  m = heads.BertForPreTraining(cfg, mlm_all_positions=True)
  ours = jax.jit(lambda p, b: m.apply({"params": p}, b))(params, batch)
  with torch.no_grad():
    as_torch = lambda x: torch.tensor(x, dtype=torch.long)
    hf = hf_model(input_ids=as_torch(ids), attention_mask=as_torch(mask), token_type_ids=as_torch(seg))
  np.testing.assert_allclose(ours["mlm_logits"][0, :7], hf.prediction_logits.numpy()[0, :7], atol=1e-4)
  np.testing.assert_allclose(ours["nsp_logits"], hf.seq_relationship_logits.numpy(), atol=1e-4)
