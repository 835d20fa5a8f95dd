"""The encoder's attention probabilities and hidden states for analysis, one numpy dict per example.

  results = forward.encode(cfg, params["bert"], examples, output_attentions=True)
  results[i]["attentions"]     # [num_layers, num_heads, S, S], S = example i's tokens
  results[i]["hidden_states"]  # [num_layers + 1, S, H] (with output_hidden_states)

`examples` are `embed.Example`s (`embed.read_examples` makes them from JSON lines). Batches are length-sorted
and padded as `bert-jax embed` pads them; one device_get per batch.
"""

import functools

import jax
import numpy as np

from bert_jax.models import encoder as model
from bert_jax.tools import embed


@functools.lru_cache(maxsize=8)
def _runner(cfg: model.BertConfig, output_attentions: bool, output_hidden_states: bool):
  encoder = model.BertEncoder(cfg)

  def run(params, ids, mask, types, head_mask):
    out = encoder.apply({"params": params}, ids, mask, types, pool=False, output_attentions=output_attentions,
                        output_hidden_states=output_hidden_states, head_mask=head_mask)
    return {k: out[k] for k in ("attentions", "hidden_states") if out[k] is not None}
  # Params are an argument, not a closure, so they are not folded into the compiled program as constants.
  return jax.jit(run)


def encode(cfg: model.BertConfig, params, examples, *, batch_size: int = 8, output_attentions: bool = False,
           output_hidden_states: bool = False, head_mask=None) -> list[dict]:
  """Per example, {"attentions": float32 [num_layers, num_heads, S, S], "hidden_states": float32
  [num_layers + 1, S, H]}, as asked, trimmed to its S tokens. `params`: the encoder's; `head_mask`:
  [num_layers, num_heads] or None (see `BertEncoder`)."""
  if not (output_attentions or output_hidden_states):
    raise ValueError("ask for output_attentions or output_hidden_states")
  run = _runner(cfg, output_attentions, output_hidden_states)
  examples = [embed.Example(*e) for e in examples]
  results = [None] * len(examples)
  for chunk, (ids, mask, types) in embed.padded_batches(cfg, examples, batch_size):
    out = jax.device_get(run(params, ids, mask, types, head_mask))
    for row, i in enumerate(chunk):
      n = len(examples[i].input_ids)
      result = {}
      if output_attentions:
        result["attentions"] = np.asarray(out["attentions"][:, row, :, :n, :n], np.float32)
      if output_hidden_states:
        result["hidden_states"] = np.asarray(out["hidden_states"][:, row, :n], np.float32)
      results[i] = result
  return results


def tokens(tokenizer, example) -> list[str]:
  """The example's tokens as the tokenizer writes them (word pieces, special tokens included)."""
  return list(tokenizer.convert_ids_to_tokens([int(t) for t in example.input_ids]))
