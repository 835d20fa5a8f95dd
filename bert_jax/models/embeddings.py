"""BERT's input embeddings (Devlin et al. 2019, 3): word + position + token-type, LayerNorm, dropout, and the
position ids they read (0..L-1, RoBERTa's offset ones, a packed batch's per-example ones).

Switches of the encoder that act here: ALBERT's factorized embeddings (`embedding_size`; Lan et al. 2020,
3.1), RoBERTa's position ids (`position_pad_id`), DistilBERT's missing token types (`type_vocab_size=0`) and
RoPE (`rope_theta`: no position table).
"""

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models import dropout
from bert_jax.models import embedding_lookup
from bert_jax.models import projections
from bert_jax.models.config import BertConfig
from bert_jax.models.layer_norm import layer_norm
from bert_jax.models.projections import constrain as _constrain, dense_init, zeros


def _check_positions_fit(cfg: BertConfig, length: int) -> None:
  """Raises unless the default positions of `length` tokens are rows of the position table."""
  offset = 0 if cfg.position_pad_id is None else cfg.position_pad_id + 1
  if length + offset > cfg.max_position_embeddings:
    # Out-of-range ids would embed as NaN (jnp.take fills), silently, not fail.
    after = f" less the {offset} ids RoBERTa's positions start after" if offset else ""
    raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                     f"{cfg.max_position_embeddings}{after}")


def default_position_ids(cfg: BertConfig, input_ids):
  """Position ids when none are given: 0..L-1, or RoBERTa's (see `BertConfig.position_pad_id`)."""
  length = input_ids.shape[-1]
  _check_positions_fit(cfg, length)
  if cfg.position_pad_id is None:
    return jnp.broadcast_to(jnp.arange(length), input_ids.shape)
  real = (input_ids != cfg.position_pad_id).astype(jnp.int32)
  return jnp.cumsum(real, axis=-1) * real + cfg.position_pad_id


def packed_position_ids(cfg: BertConfig, position_ids, example_ids):
  """A packed batch's position ids, each token's offset in its example (data/instances.py), as the rows of
  the position table: as they are, or RoBERTa's (`position_pad_id`): pad + 1 + offset, pad at padding, so
  that a packed example computes what it computes alone. Unpacked (no example ids): as they are."""
  if cfg.position_pad_id is None or position_ids is None or example_ids is None:
    return position_ids
  return jnp.where(example_ids > 0, position_ids + cfg.position_pad_id + 1, cfg.position_pad_id)


class BertEmbeddings(nn.Module):
  """Word + position + token-type embeddings, LayerNorm, dropout (then ALBERT's projection to hidden_size)."""
  config: BertConfig

  def setup(self):
    cfg = self.config
    embed = lambda n, names, name: nn.Embed(n, cfg.embedding_dim, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                                            embedding_init=dense_init(cfg, names), name=name)
    self.word_embeddings = embed(cfg.vocab_size, ("vocab", "embed"), "word_embeddings")
    if cfg.rope_theta is None:   # RoPE: positions act in the attention, no table
      self.position_embeddings = embed(cfg.max_position_embeddings, ("position", "embed"), "position_embeddings")
    if cfg.type_vocab_size:   # 0: no token types (DistilBERT)
      self.token_type_embeddings = embed(cfg.type_vocab_size, ("type_vocab", "embed"), "token_type_embeddings")
    self.layer_norm = layer_norm(cfg, "layer_norm")
    self.dropout = dropout.Dropout(cfg.hidden_dropout, bits=cfg.dropout_bits)
    if cfg.embedding_size is not None:
      # ALBERT's `embedding_hidden_mapping_in`; the small embedding width stays unsharded.
      self.projection = projections.linear(cfg, cfg.hidden_size, dense_init(cfg, (None, "embed")), zeros(("embed",)))

  def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
    x = self.embed(input_ids, segment_ids, position_ids, deterministic)
    if self.config.embedding_size is not None:
      x = self.projection(x)
    return _constrain(x, "activation_batch", "activation_length", "activation_embed")

  def embed(self, input_ids, segment_ids, position_ids, deterministic: bool):
    """The embeddings before any projection to hidden_size: [B, L, embedding_dim]. `position_ids` None:
    the default positions (`default_position_ids`)."""
    cfg = self.config
    if cfg.embedding_lookup_on_shards:
      x = embedding_lookup.lookup(self.word_embeddings.embedding, input_ids, cfg.dtype)
    else:
      x = self.word_embeddings(input_ids)
    if cfg.rope_theta is None:
      x = x + self._positions(input_ids, position_ids)
    if self.config.type_vocab_size:
      x = x + self.token_type_embeddings(segment_ids)
    return self.dropout(self.layer_norm(x), deterministic=deterministic)

  def _positions(self, input_ids, position_ids):
    """The position embeddings. The default 0..L-1 of every row (no ids given, no RoBERTa offset) are the
    table's first L rows [L, E], added to each row: the same sum as a lookup, whose gather and table-sized
    scatter of the gradient moved 38 MB a core in BERT-large phase 1 on v3:8x8 (docs/performance.md);
    their gradient is a sum over the rows. Other ids are looked up, [B, L, E]."""
    cfg = self.config
    if position_ids is None and cfg.position_pad_id is None:
      length = input_ids.shape[-1]
      _check_positions_fit(cfg, length)
      return jnp.asarray(self.position_embeddings.embedding[:length], cfg.dtype)
    if position_ids is None:
      position_ids = default_position_ids(cfg, input_ids)
    return self.position_embeddings(position_ids)
