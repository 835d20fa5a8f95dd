"""The encoder's attention probabilities (`output_attentions`), per-head mask (`head_mask`) and pruned heads."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import checkpoints_hf
from bert_jax.models import encoder as model
from bert_jax.models import pruning

_BASE = dict(vocab_size=40, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48,
             max_position_embeddings=24, hidden_dropout=0.0, attention_dropout=0.0)
# One tiny config per family the encoder implements (their switches as the HF readers set them).
FAMILIES = {
    "bert": {},
    "roberta": dict(position_pad_id=1),
    "albert": dict(embedding_size=16, share_layers=True),
    "electra": dict(embedding_size=16),
    "distilbert": dict(type_vocab_size=0),
    "modernbert": dict(rope_theta=160000.0, local_rope_theta=10000.0, geglu=True, pre_norm=True, final_norm=True,
                       norm_bias=False, dense_bias=False, global_attn_every_n_layers=3, local_attention=4),
}
IDS = np.array([[2, 5, 7, 9, 11, 13, 3, 0], [2, 8, 6, 3, 0, 0, 0, 0]], np.int32)
MASK = (IDS > 0).astype(np.int32)


def _setup(family, **overrides):
  cfg = model.BertConfig(**{**_BASE, **FAMILIES[family], **overrides})
  ids = np.where(MASK == 1, IDS, cfg.position_pad_id or 0)
  params = jax.tree.map(np.asarray, nn.unbox(model.BertEncoder(cfg).init(jax.random.key(0), ids, MASK)["params"]))
  return cfg, params, ids


def _apply(cfg, params, ids, **kwargs):
  return model.BertEncoder(cfg).apply({"params": params}, ids, MASK, **kwargs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.slow
def test_probabilities_sum_to_one_over_real_keys_and_are_zero_on_padding(family):
  cfg, params, ids = _setup(family)
  out = _apply(cfg, params, ids, output_attentions=True)
  probs = np.asarray(out["attentions"])
  assert probs.shape == (cfg.num_layers, 2, cfg.num_heads, 8, 8) and probs.dtype == np.float32
  real_q = MASK.astype(bool)[None, :, None, :]
  np.testing.assert_allclose(probs.sum(-1)[np.broadcast_to(real_q, probs.shape[:-1])], 1.0, atol=1e-5)
  assert (probs * (1 - MASK)[None, :, None, None, :] == 0).all()   # padded keys
  assert (probs * (1 - MASK)[None, :, None, :, None] == 0).all()   # padded queries
  # The explicit path gives what the fused kernel gives (at real positions: a padded query outside every
  # real key's window has nothing to attend to).
  real = MASK.astype(bool)
  np.testing.assert_allclose(np.asarray(out["sequence_output"])[real],
                             np.asarray(_apply(cfg, params, ids)["sequence_output"])[real], atol=1e-5)
  assert _apply(cfg, params, ids)["attentions"] is None


def test_probabilities_are_the_softmax_of_scaled_query_key_scores():
  cfg, params, ids = _setup("bert")
  out = _apply(cfg, params, ids, output_attentions=True, output_hidden_states=True)
  att = params["encoder"]["layer_1"]["attention"]
  x = np.asarray(out["hidden_states"][1])
  q = np.einsum("blh,hnk->bnlk", x, att["query"]["kernel"]) + att["query"]["bias"][None, :, None]
  k = np.einsum("blh,hnk->bnlk", x, att["key"]["kernel"]) + att["key"]["bias"][None, :, None]
  scores = np.einsum("bnqk,bnsk->bnqs", q, k) / np.sqrt(cfg.head_dim)
  scores = np.where(MASK[:, None, None, :] == 1, scores, -np.inf)
  expected = np.exp(scores - scores.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  got = np.asarray(out["attentions"][1])
  np.testing.assert_allclose(got[0, :, :7], expected[0, :, :7], atol=1e-5)   # the real queries
  np.testing.assert_allclose(got[1, :, :4], expected[1, :, :4], atol=1e-5)


def test_a_local_layer_attends_only_within_its_window():
  cfg, params, ids = _setup("modernbert")
  probs = np.asarray(_apply(cfg, params, ids, output_attentions=True)["attentions"])
  far = np.abs(np.arange(8)[:, None] - np.arange(8)[None]) > cfg.local_attention // 2
  assert (probs[1][..., far] == 0).all() and (probs[2][..., far] == 0).all()
  assert (probs[0][0][..., far] > 0).any()   # layer 0 is global


def _zero_out_rows(cfg, params, heads_by_layer):
  """The params with the output projection's rows of the given heads zeroed: the head's contribution removed."""
  params = jax.tree.map(np.copy, params)
  for layer, heads in heads_by_layer.items():
    name = "shared_layer" if cfg.share_layers else f"layer_{layer}"
    params["encoder"][name]["attention"]["out"]["kernel"][list(heads)] = 0.0
  return params


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_masked_head_changes_nothing_at_one_and_removes_exactly_its_contribution_at_zero(family):
  cfg, params, ids = _setup(family)
  base = _apply(cfg, params, ids)["sequence_output"]
  ones = jnp.ones((cfg.num_layers, cfg.num_heads))
  np.testing.assert_array_equal(_apply(cfg, params, ids, head_mask=ones)["sequence_output"], base)
  # ALBERT applies one layer set everywhere: a head is removed from every layer at once there.
  removed = {l: [1] for l in range(cfg.num_layers)} if cfg.share_layers else {0: [1], 2: [0, 3]}
  mask = ones
  for l, hs in removed.items():
    mask = mask.at[l, jnp.array(hs)].set(0.0)
  masked = _apply(cfg, params, ids, head_mask=mask)["sequence_output"]
  surgery = _apply(cfg, _zero_out_rows(cfg, params, removed), ids)["sequence_output"]
  np.testing.assert_allclose(masked, surgery, atol=1e-5)
  assert np.abs(np.asarray(masked) - np.asarray(base)).max() > 1e-3


@pytest.mark.slow
def test_head_mask_gradient_matches_finite_differences():
  cfg, params, ids = _setup("bert")
  w = jax.random.normal(jax.random.key(1), (2, 8, cfg.hidden_size))
  loss = lambda hm: jnp.sum(w * _apply(cfg, params, ids, head_mask=hm)["sequence_output"])
  hm = jnp.ones((cfg.num_layers, cfg.num_heads))
  grad = np.asarray(jax.grad(loss)(hm))
  eps = 1e-2
  for l, h in [(0, 0), (1, 3), (2, 2)]:
    fd = (loss(hm.at[l, h].add(eps)) - loss(hm.at[l, h].add(-eps))) / (2 * eps)
    np.testing.assert_allclose(grad[l, h], fd, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("family", ["bert", "modernbert", "albert"])
def test_scanned_layers_give_the_same_attentions_and_masked_outputs(family):
  cfg, params, ids = _setup(family)
  mask = jnp.ones((cfg.num_layers, cfg.num_heads)).at[1, 2].set(0.0)
  kwargs = dict(output_attentions=True, head_mask=mask)
  plain = _apply(cfg, params, ids, **kwargs)
  scanned = _apply(dataclasses.replace(cfg, scan_layers=True), model.scan_params(params), ids, **kwargs)
  np.testing.assert_allclose(scanned["attentions"], plain["attentions"], atol=1e-6)
  np.testing.assert_allclose(scanned["sequence_output"], plain["sequence_output"], atol=1e-5)


def test_attentions_under_dropout_are_the_probabilities_before_dropout():
  cfg, params, ids = _setup("bert", attention_dropout=0.5)
  out = _apply(cfg, params, ids, output_attentions=True, deterministic=False, rngs={"dropout": jax.random.key(2)})
  clean = _apply(cfg, params, ids, output_attentions=True)
  np.testing.assert_allclose(out["attentions"][0], clean["attentions"][0], atol=1e-6)  # layer 0 sees the same input
  assert np.abs(np.asarray(out["sequence_output"] - clean["sequence_output"])).max() > 1e-3


@pytest.mark.parametrize("family", ["bert", "modernbert", "distilbert"])
@pytest.mark.slow
def test_a_pruned_model_computes_what_the_masked_model_computes(family):
  cfg, params, ids = _setup(family)
  heads = {0: [1], 1: [0, 1, 2, 3], 2: [3, 0]}   # layer 1 loses every head
  small_cfg, small = pruning.prune_heads(cfg, params, heads)
  assert small_cfg.pruned_heads == ((0, (1,)), (1, (0, 1, 2, 3)), (2, (0, 3)))
  assert [small_cfg.layer_num_heads(i) for i in range(3)] == [3, 0, 2]
  assert small["encoder"]["layer_2"]["attention"]["query"]["kernel"].shape == (32, 2, 8)
  mask = np.ones((3, 4), np.float32)
  for l, hs in heads.items():
    mask[l, hs] = 0.0
  masked = _apply(cfg, params, ids, head_mask=mask, output_attentions=True)
  pruned = _apply(small_cfg, small, ids, output_attentions=True)
  np.testing.assert_allclose(pruned["sequence_output"], masked["sequence_output"], atol=1e-5)
  # Kept heads keep their place in the attentions; pruned ones are 0.
  np.testing.assert_allclose(pruned["attentions"][2][:, 1:3], masked["attentions"][2][:, 1:3], atol=1e-6)
  assert (np.asarray(pruned["attentions"][1]) == 0).all()
  n = lambda p: sum(x.size for x in jax.tree.leaves(p))
  assert n(params) - n(small) == 7 * 4 * 8 * 32 + (7 * 3 * 8 if cfg.dense_bias else 0)
  with pytest.raises(ValueError, match="pruned_heads"):
    _apply(small_cfg, small, ids, head_mask=mask)


def test_pruning_twice_composes_in_the_original_numbering():
  cfg, params, ids = _setup("bert")
  once_cfg, once = pruning.prune_heads(cfg, params, {0: [0, 2]})
  twice_cfg, twice = pruning.prune_heads(*pruning.prune_heads(cfg, params, {0: [2]}), {0: [0]})
  assert twice_cfg.pruned_heads == once_cfg.pruned_heads == ((0, (0, 2)),)
  assert twice_cfg.kept_heads(0) == (1, 3)
  np.testing.assert_array_equal(twice["encoder"]["layer_0"]["attention"]["query"]["kernel"],
                                once["encoder"]["layer_0"]["attention"]["query"]["kernel"])


def test_pruning_needs_per_layer_attention_weights():
  cfg, params, _ = _setup("albert")
  with pytest.raises(ValueError, match="per-layer"):
    pruning.prune_heads(cfg, params, {0: [1]})
  with pytest.raises(ValueError, match="outside"):
    model.BertConfig(**_BASE, pruned_heads={3: [0]})


def test_a_pruned_model_round_trips_through_a_hugging_face_directory(tmp_path):
  cfg, params, ids = _setup("bert")
  small_cfg, small = pruning.prune_heads(cfg, {"bert": params}, {0: [1, 2], 2: [0]})
  d = small_cfg.to_hf_dict()
  assert d["pruned_heads"] == {"0": [1, 2], "2": [0]}   # transformers' key: it prunes these, then loads
  assert model.BertConfig.from_hf_dict(d).pruned_heads == small_cfg.pruned_heads
  checkpoints_hf.save_hf(tmp_path, small_cfg, small)
  cfg2, params2 = checkpoints_hf.load_hf(tmp_path)
  assert cfg2.pruned_heads == small_cfg.pruned_heads
  np.testing.assert_allclose(_apply(cfg2, params2["bert"], ids)["sequence_output"],
                             _apply(small_cfg, small["bert"], ids)["sequence_output"], atol=1e-6)
