"""Analytic FLOPs: a hand count for a tiny model, and agreement with XLA's own count."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from bert_jax import flops
from bert_jax.models import heads
from bert_jax.models import encoder as model

TINY = model.BertConfig(vocab_size=1000, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512)


def test_hand_count_tiny():
  shapes = flops.Shapes(seq_length=64, mlm_positions=10)
  # Per token and layer: q, k, v 3*2*128*128 = 98,304; scores 2*64*128 = 16,384; values 16,384;
  # out 2*128*128 = 32,768; mlp 2*2*128*512 = 262,144; sum 425,984. x 64 tokens x 2 layers = 54,525,952.
  # Pooler 2*128*128 = 32,768; NSP 2*128*2 = 512; MLM transform 10*32,768 = 327,680;
  # MLM decoder 10*2*128*1000 = 2,560,000.
  forward = 54_525_952 + 32_768 + 512 + 327_680 + 2_560_000
  by_part = flops.forward_flops_per_row(TINY, shapes)
  assert sum(by_part.values()) == forward
  assert by_part["attention_scores"] == by_part["attention_values"] == 2 * 64 * 16_384
  assert flops.train_flops_per_row(TINY, shapes) == 3 * forward


def test_options_change_only_their_terms():
  base = flops.forward_flops_per_row(TINY, flops.Shapes(seq_length=64, mlm_positions=10))
  all_positions = flops.forward_flops_per_row(TINY, flops.Shapes(seq_length=64, mlm_positions=64))
  packed_no_nsp = flops.forward_flops_per_row(
      TINY, flops.Shapes(seq_length=64, mlm_positions=10, pooled_positions=4, use_nsp=False))
  assert all_positions["mlm_decoder"] == 6.4 * base["mlm_decoder"]
  assert packed_no_nsp["pooler"] == 4 * base["pooler"] and packed_no_nsp["nsp"] == 0
  for key in ("attention_qkv", "mlp", "embeddings"):
    assert base[key] == all_positions[key] == packed_no_nsp[key]


def _xla_train_flops(cfg, batch, mlm_all_positions):
  net = heads.BertForPreTraining(cfg, mlm_all_positions=mlm_all_positions)
  params = jax.eval_shape(lambda: net.init(jax.random.key(0), batch))["params"]

  def loss(params, batch):
    # A real cross-entropy: a plain sum would let XLA turn the head's weight gradient into a reduce.
    out = net.apply({"params": params}, batch)
    return -(jax.nn.log_softmax(out["mlm_logits"])[..., 1].sum()
             + jax.nn.log_softmax(out["nsp_logits"])[..., 0].sum())

  return jax.jit(jax.grad(loss)).lower(params, batch).compile().cost_analysis()["flops"]


@pytest.mark.parametrize("mlm_all_positions,geglu", [(False, False), (True, False), (False, True)])
def test_close_to_xla_cost_analysis(mlm_all_positions, geglu):
  batch_size, seq, preds = 4, 64, 10
  batch = {
      "input_ids": jnp.ones((batch_size, seq), jnp.int32),
      "input_mask": jnp.ones((batch_size, seq), jnp.int32),
      "segment_ids": jnp.zeros((batch_size, seq), jnp.int32),
      "masked_lm_positions": jnp.zeros((batch_size, preds), jnp.int32),
  }
  cfg = dataclasses.replace(TINY, geglu=geglu)   # GeGLU: a third matmul in every feed-forward block
  xla = _xla_train_flops(cfg, batch, mlm_all_positions)
  shapes = flops.Shapes(seq_length=seq, mlm_positions=seq if mlm_all_positions else preds)
  analytic = batch_size * flops.train_flops_per_row(cfg, shapes)
  # XLA also counts elementwise work (layer norm, softmax, GELU, dropout): measured 1.04 here,
  # 1.01-1.02 at L=4 H=256 with a 30k vocabulary. Matmuls must not be missing (>= 1) or doubled.
  assert 1.0 <= xla / analytic <= 1.12


def test_an_embedding_size_equal_to_the_hidden_size_still_counts_the_projection():
  """The model projects E -> H wherever an embedding size is set, E = H too: XLA's count grows by it."""
  batch_size, seq = 4, 64
  batch = {"input_ids": jnp.ones((batch_size, seq), jnp.int32), "input_mask": jnp.ones((batch_size, seq), jnp.int32),
           "segment_ids": jnp.zeros((batch_size, seq), jnp.int32),
           "masked_lm_positions": jnp.zeros((batch_size, 10), jnp.int32)}
  projected = dataclasses.replace(TINY, embedding_size=TINY.hidden_size)
  shapes = flops.Shapes(seq_length=seq, mlm_positions=10)
  analytic = batch_size * (flops.train_flops_per_row(projected, shapes) - flops.train_flops_per_row(TINY, shapes))
  xla = _xla_train_flops(projected, batch, False) - _xla_train_flops(TINY, batch, False)
  assert analytic == batch_size * 3 * seq * 2 * 128 * 128 and 0.98 <= xla / analytic <= 1.05   # 0.999


def test_splash_kernel_counts_the_window_only():
  """With the splash kernel a sliding-window layer is counted over window+1 keys (the kernel skips the
  blocks outside it); the dense path still counts every key; `kernel_attention_per_row` is the share XLA
  cannot see (zero without the kernel, or with attention dropout, which takes the explicit path)."""
  local = dataclasses.replace(TINY, num_layers=4, global_attn_every_n_layers=2, local_attention=16,
                              attention_dropout=0.0)
  shapes = flops.Shapes(seq_length=128, mlm_positions=10)
  splash = dataclasses.replace(local, attention_kernel="splash")
  assert flops.attended_keys(local, 128) == [128, 128, 128, 128]
  assert flops.attended_keys(splash, 128) == [128, 17, 128, 17]
  dense, sparse = flops.forward_flops_per_row(local, shapes), flops.forward_flops_per_row(splash, shapes)
  assert sparse["attention_scores"] == sparse["attention_values"] == 128 * (2 * 128 + 2 * 17) * 2 * 128
  assert {k: v for k, v in dense.items() if not k.startswith("attention_s") and k != "attention_values"} == {
      k: v for k, v in sparse.items() if not k.startswith("attention_s") and k != "attention_values"}
  kernel = flops.kernel_attention_per_row(splash, 128)
  assert kernel["model_flops"] == 3 * (sparse["attention_scores"] + sparse["attention_values"])
  # One block of 128 keys holds every key: the kernel computes all of them in every layer, and its
  # backward pass recomputes the scores (9 matmuls of S x keys x H against the forward's 2).
  assert kernel["flops"] == 4 * 9 * 2 * 128 * 128 * 128
  assert kernel["bytes"] == 0   # one key block: each operand read once, which the count by op has
  # At 8192 tokens a 129-key window inside 512-token blocks computes 3 key blocks a query block, 2 for the
  # first and the last: 46 pairs of 512 x 512 against the global layer's 256.
  long = dataclasses.replace(splash, num_layers=2, dtype=jnp.bfloat16)
  long_kernel = flops.kernel_attention_per_row(long, 8192)
  assert long_kernel["flops"] == 9 * 2 * (256 + 46) * 512 * 512 * 128
  # k and v read again by each query block past the first that reaches them, forward and twice backward.
  assert long_kernel["bytes"] == 3 * 2 * 128 * 512 * 2 * ((256 - 16) + (46 - 16))
  zero = {"model_flops": 0.0, "flops": 0.0, "bytes": 0.0}
  assert flops.kernel_attention_per_row(local, 128) == zero
  assert flops.kernel_attention_per_row(dataclasses.replace(splash, attention_dropout=0.1), 128) == zero


def test_flash_kernel_counts_the_queries_segment_ids_again_for_each_head():
  """Beyond one read of each operand (the count by op has those), the flash kernel reads the queries'
  segment ids once per head in each pass, int32 rows of 2 sublanes a tile."""
  flash = dataclasses.replace(TINY, num_layers=2, num_heads=4, attention_kernel="flash", attention_dropout=0.1,
                              dtype=jnp.bfloat16)
  kernel = flops.kernel_attention_per_row(flash, 128)
  assert kernel["flops"] == 2 * (2 + 5) * 2 * 128 * 128 * flash.hidden_size
  assert kernel["bytes"] == 2 * 2 * (4 - 1) * 128 * 4 * 2


def test_splash_kernel_skips_the_blocks_above_a_causal_diagonal():
  """A causal layer's splash kernel computes the key blocks on and below the diagonal only: at 2048
  tokens in 512-token blocks, 10 of the 16 pairs (each pair past the 4 diagonal ones reads k and v again)."""
  cfg = dataclasses.replace(TINY, num_layers=1, attention_kernel="splash", attention_dropout=0.0)
  full = flops.kernel_attention_per_row(cfg, 2048)
  causal = flops.kernel_attention_per_row(dataclasses.replace(cfg, causal=True), 2048)
  assert full["flops"] == 9 * 2 * 16 * 512 * 512 * cfg.hidden_size
  assert causal["flops"] == 9 * 2 * 10 * 512 * 512 * cfg.hidden_size
  assert causal["bytes"] / full["bytes"] == (10 - 4) / (16 - 4)
  assert causal["model_flops"] == full["model_flops"]   # the model's count is the paper's, every key


def test_the_step_kernel_share_counts_every_trained_encoder():
  """ELECTRA's generator runs the discriminator's attention kernel: `aot` adds what XLA cannot see in both."""
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  from configs import electra_small  # pylint: disable=g-import-not-at-top
  config = electra_small.get_config()
  config.model.attention_kernel, config.model.attention_dropout = "splash", 0.0
  disc, gen = objectives.encoder_configs(config)
  assert gen.attention_kernel == "splash" and gen.hidden_size < disc.hidden_size
  per_encoder = [flops.kernel_attention_per_row(c, config.data.seq_length) for c in (disc, gen)]
  total = objectives.kernel_attention_per_row(config)
  assert per_encoder[1]["flops"] > 0
  assert total == {k: per_encoder[0][k] + per_encoder[1][k] for k in total}
