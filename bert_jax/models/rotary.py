"""Rotary position embeddings (RoPE; Su et al. 2021, 3.4) as Hugging Face's ModernBERT applies them.

Queries and keys are rotated by an angle proportional to their position, so the score of query i and key j
depends on i - j only. The halves layout of GPT-NeoX / Hugging Face (`rotate_half`): dimension d is paired
with d + head_dim / 2, not with its neighbour. Angles are computed in float32 whatever the compute dtype.
"""

import jax.numpy as jnp


def rotary_tables(position_ids, head_dim: int, theta: float):
  """(cos, sin), each [B, L, head_dim] float32, of positions [B, L] with base `theta`."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = position_ids.astype(jnp.float32)[..., None] * inv_freq  # [B, L, head_dim / 2]
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x_BLNK, tables):
  """x rotated by `tables` = (cos, sin) [B, L, K] from `rotary_tables`; returns x's dtype."""
  cos, sin = (t[:, :, None, :] for t in tables)  # one angle for every head
  half = x_BLNK.shape[-1] // 2
  rotated = jnp.concatenate([-x_BLNK[..., half:], x_BLNK[..., :half]], axis=-1)
  return (x_BLNK * cos + rotated * sin).astype(x_BLNK.dtype)
