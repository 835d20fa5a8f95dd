"""Attention heads removed from the weights (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

  cfg, params = pruning.prune_heads(cfg, params, {0: [1, 5], 3: [2]})

The result computes what the unpruned model computes with those heads' `head_mask` entries at 0, with
smaller query/key/value/output projections. `cfg.pruned_heads` records what was removed, in the original
head numbering (as transformers' config `pruned_heads`, which it writes), so pruning twice composes.
"""

import dataclasses

import numpy as np

from bert_jax.models.config import BertConfig


def prune_heads(cfg: BertConfig, params: dict, heads: dict) -> tuple[BertConfig, dict]:
  """(config, params) with `heads` ({layer: [head, ...]}, original numbering) removed.

  `params`: a model's params holding the encoder under "bert" (a finetuned or pretraining model), or the
  encoder's own (with "encoder" at the top), unscanned. Other subtrees (heads) are kept as they are.
  """
  if cfg.share_layers or cfg.scan_layers or cfg.shared_sublayer == "attention":
    raise ValueError("pruning needs per-layer attention weights: not with share_layers, scan_layers or "
                     "shared_sublayer 'attention'")
  new_cfg = dataclasses.replace(cfg, pruned_heads=dict(cfg.pruned_heads) | {
      int(layer): tuple(set(dict(cfg.pruned_heads).get(int(layer), ())) | {int(h) for h in hs})
      for layer, hs in heads.items()})
  encoder_params = params["bert"] if "bert" in params else params
  layers = dict(encoder_params["encoder"])
  for i in range(cfg.num_layers):
    # Positions, in this layer's current weights, of the heads it keeps.
    keep = [cfg.kept_heads(i).index(h) for h in new_cfg.kept_heads(i)]
    layers[f"layer_{i}"] = _prune_attention(layers[f"layer_{i}"], keep)
  encoder_params = {**encoder_params, "encoder": layers}
  return new_cfg, ({**params, "bert": encoder_params} if "bert" in params else encoder_params)


def _prune_attention(layer: dict, keep: list) -> dict:
  attention = dict(layer["attention"])
  take = lambda x, axis: np.take(np.asarray(x), keep, axis=axis)
  for name in ("query", "key", "value"):
    proj = dict(attention[name])
    proj["kernel"] = take(proj["kernel"], 1)   # [H, N, K]
    if "bias" in proj:
      proj["bias"] = take(proj["bias"], 0)     # [N, K]
    attention[name] = proj
  attention["out"] = {**attention["out"], "kernel": take(attention["out"]["kernel"], 0)}  # [N, K, H]
  return {**layer, "attention": attention}


def silence_heads(cfg: BertConfig, params: dict, heads: dict) -> dict:
  """`params` with the output projection of `heads` ({layer: head}, original numbering, kept heads) at zero:
  the layer computes what it computes without them. A layer whose every head goes keeps one so silenced
  (`analyze prune`'s export: a checkpoint cannot hold the empty arrays of a layer with no heads)."""
  encoder_params = params["bert"] if "bert" in params else params
  layers = dict(encoder_params["encoder"])
  for layer, head in heads.items():
    attention = dict(layers[f"layer_{layer}"]["attention"])
    kernel = np.array(attention["out"]["kernel"])   # [N, K, H]
    kernel[cfg.kept_heads(layer).index(head)] = 0
    attention["out"] = {**attention["out"], "kernel": kernel}
    layers[f"layer_{layer}"] = {**layers[f"layer_{layer}"], "attention": attention}
  encoder_params = {**encoder_params, "encoder": layers}
  return {**params, "bert": encoder_params} if "bert" in params else encoder_params
