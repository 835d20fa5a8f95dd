"""ELMo-style scalar mix of all encoder layers (Peters et al. 2018, eq. 1) and the finetuning models on it.

  mix = gamma * sum_j softmax(w)_j * h_j      over the embeddings and every layer's output

With a frozen encoder (trainer: `freeze_encoder`) this is BERT's feature-based approach (Devlin et al.
2019, 5.3): only the mix and the head learn. Params are `{"bert", "scalar_mix", <head>}` with the head
named as in `heads.py` (`classifier`, `qa_outputs`), so the encoder still moves by `params["bert"]`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import dropout
from bert_jax.models import encoder as model
from bert_jax.models import heads
from bert_jax.models import projections


class ScalarMix(nn.Module):
  """Softmax-normalised weights over [num_layers + 1, ...] hidden states, times a learned gamma.

  Params: `weights` [num_layers + 1] (logits of the mix), `scale` (gamma).
  """

  @nn.compact
  def __call__(self, hidden_NBLH):
    n = hidden_NBLH.shape[0]
    # Zero logits: the mix starts as the plain average, as in AllenNLP's ScalarMix.
    weights = self.param("weights", nn.initializers.zeros_init(), (n,), jnp.float32)
    # Named "scale" (like LayerNorm's) so that optimizer.decay_mask exempts it from weight decay.
    gamma = self.param("scale", nn.initializers.ones_init(), (), jnp.float32)
    w = jax.nn.softmax(weights)  # float32 on purpose: a handful of weights, normalised exactly
    mixed = jnp.einsum("n,n...->...", w, hidden_NBLH.astype(jnp.float32))
    return (gamma * mixed).astype(hidden_NBLH.dtype)


class ScalarMixModel(nn.Module):
  """Encoder -> scalar mix of all layers -> a finetuning head.

  `kind` is the task kind: "classification"/"regression" read the mixed [CLS] vector (the pooler was
  trained on the last layer only, so it is skipped; a causal model's last real token), "token_classification"
  every position, "span" (question answering) start/end scores.
  """
  config: model.BertConfig
  kind: str
  num_labels: int = 2

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True, **encoder_kwargs):
    cfg = self.config
    out = model.BertEncoder(cfg, name="bert")(input_ids, input_mask, segment_ids, deterministic=deterministic,
                                              output_hidden_states=True, **encoder_kwargs)
    x = ScalarMix(name="scalar_mix")(out["hidden_states"])
    if self.kind in ("classification", "regression"):   # a causal model's last token: [CLS] sees only itself
      x = heads.pool_sequence(x, input_mask, "last" if cfg.causal else "cls")
    x = dropout.Dropout(cfg.hidden_dropout, bits=cfg.dropout_bits)(x, deterministic=deterministic)
    features = 2 if self.kind == "span" else self.num_labels
    name = "qa_outputs" if self.kind == "span" else "classifier"
    logits = projections.linear(cfg, features, model.dense_init(cfg, ("embed", None)), model.zeros((None,)),
                                name=name)(x)
    logits = logits.astype(jnp.float32)
    if self.kind == "span":
      return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
    return logits
