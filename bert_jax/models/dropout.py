"""Dropout with its bits chosen by `BertConfig.dropout_bits` (DROPOUT_BITS); every dropout of the encoder
and its heads is this module (and `softmax_dropout.attend`, through `keep_mask`).

- "threefry": flax's `nn.Dropout`, `random.bernoulli` with the dropout key's generator (`dropout_rng`).
  Same module path and key as `nn.Dropout`, so the same bits.
- "hash": a counter hash per element: the key's first two words as two int32 seeds (`seeds_of`), then
  `mix(mix(index + seed0) ^ seed1)` of the element's index in the array (`mix`: Bob Jenkins' 32-bit integer
  hash; shifts, adds and xors, as the flash kernel's bits, `flash_dropout`), its high 16 bits compared with
  `rate * 2^16` (0.1 keeps 0.899994). Elementwise integer ops on iotas: XLA fuses them into the op that uses the mask
  and partitions them like any elementwise op, so the bits are the same on every mesh and on a resume.
  On this CPU it takes the bench model's step about 5% less time than threefry (docs/performance.md); the
  bits differ from threefry's, so a step's loss is a different draw. The index is one 32-bit word: an
  array of more than 2^32 elements (global shape) would repeat its bits, and is refused. BERT-large's v3
  configs draw their bits so: the same bytes by XLA's count, a shorter compile (docs/performance.md).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax import lax

DROPOUT_BITS = ("threefry", "hash")


def int32(c: int):
  return jnp.int32(np.uint32(c).view(np.int32))


def shift(x, n):
  return lax.shift_right_logical(x, jnp.int32(n))


def mix(x):
  """Bob Jenkins' 32-bit integer hash on int32, wrapping: shifts, adds and xors only (v3's vector unit has
  no 32-bit integer multiply; a multiplying hash cost it twice the bundles)."""
  x = (x + int32(0x7ED55D16)) + lax.shift_left(x, jnp.int32(12))
  x = (x ^ int32(0xC761C23C)) ^ shift(x, 19)
  x = (x + int32(0x165667B1)) + lax.shift_left(x, jnp.int32(5))
  x = (x + int32(0xD3A2646C)) ^ lax.shift_left(x, jnp.int32(9))
  x = (x + int32(0xFD7046C5)) + lax.shift_left(x, jnp.int32(3))
  return (x ^ int32(0xB55A4F09)) ^ shift(x, 16)


def threshold(rate: float):
  """An element is kept when its 16 bits are at least this: rate in steps of 2^-16."""
  return jnp.int32(min(int(round(rate * 2.0 ** 16)), 2 ** 16))


def element_index(shape) -> jax.Array:
  """Each element's row-major index in an array of `shape`, int32 (wrapping past 2^31)."""
  index, stride = jnp.zeros(shape, jnp.int32), 1
  for axis in reversed(range(len(shape))):
    index = index + lax.broadcasted_iota(jnp.int32, shape, axis) * int32(stride % 2 ** 32)
    stride *= shape[axis]
  return index


def seeds_of(key) -> jax.Array:
  """The hash's two int32 seeds: one key's first two words, no generator run. A dropout's key comes out of
  `fold_in` (flax's `make_rng`), whose words are a hash's output with threefry's and the hash keys; with
  `unsafe_rbg`'s key the folded value is xored into them. Before 2026-12-05 they were `jax.random.bits(key,
  (2,))`, a threefry hash more for each dropout: a run started before then and resumed after draws other
  masks from the resume on."""
  data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
  if data.ndim != 1:
    raise ValueError(f"the hash dropout bits take one key, not keys of shape {data.shape[:-1]}")
  return lax.bitcast_convert_type(data[:2], jnp.int32)


def keep_mask(key, rate: float, shape, bits: str = "threefry") -> jax.Array:
  """bool `shape`, True where an element is kept (with probability 1 - rate)."""
  if bits == "threefry":
    return jax.random.bernoulli(key, 1.0 - rate, shape)
  if bits != "hash":
    raise ValueError(f"dropout bits {bits!r}; one of {DROPOUT_BITS}")
  if int(np.prod(shape, dtype=np.float64)) > 2 ** 32:
    raise ValueError(f"hash dropout bits index elements with 32 bits: {tuple(shape)} has more than 2^32 "
                     "elements (their bits would repeat); use dropout_bits 'threefry'")
  seeds = seeds_of(key)
  return shift(mix(mix(element_index(tuple(shape)) + seeds[0]) ^ seeds[1]), 16) >= threshold(rate)


class Dropout(nn.Dropout):
  """`nn.Dropout` (same fields, name and key) whose bits are `bits`'s."""
  bits: str = "threefry"

  def __call__(self, inputs, deterministic: bool | None = None, rng=None):
    if self.bits == "threefry":
      return super().__call__(inputs, deterministic, rng)
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:
      return jnp.zeros_like(inputs)
    if self.broadcast_dims:
      raise ValueError("hash dropout bits draw one bit per element: no broadcast_dims")
    rng = self.make_rng(self.rng_collection) if rng is None else rng
    keep = keep_mask(rng, self.rate, inputs.shape, self.bits)
    return lax.select(keep, inputs / (1.0 - self.rate), jnp.zeros_like(inputs))
