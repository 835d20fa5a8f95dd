"""The "hash" implementation of `jax.random` keys (`config.dropout_rng`): fold_in, split and bits by the
32-bit integer hash of the "hash" dropout bits (`dropout.mix`), in place of threefry's twenty rounds.

A dropout key is folded once for each dropout of the model: flax's `make_rng` folds the module's path into
it (`fold_in`), and a scanned stack splits it by layer. With threefry each fold is a hash of about 120 scalar
ops that the compiled step carries for every dropout of every layer: 8,470 of the 17,434 instructions of
BERT-large's phase 1 step on v3:8x8 (docs/performance.md, "Dropout's random bits"). Here a fold is two
rounds of a Feistel network whose round function is `mix` (about 40 ops, bijective in the key for each
folded value: two values never give one key), and a key's bits are `mix(mix(index + k0) ^ k1)` of each
element's index, the "hash" dropout bits' formula, so the same bits on every mesh. Not a cryptographic
generator and not meant for anything but dropout: its statistics are tested against threefry's
(`tests/test_dropout_key.py`).
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax import lax

from bert_jax.models import dropout

NAME = "hash"
_FOLD, _SPLIT, _ROUND = 0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35   # odd constants that set the three uses apart


def _mix(x):
  """`dropout.mix` on uint32 words."""
  return lax.bitcast_convert_type(dropout.mix(lax.bitcast_convert_type(x, jnp.int32)), jnp.uint32)


def _scramble(k):
  """Two Feistel rounds over a key's two words (uint32 [..., 2]): a bijection whose every output word
  depends on both input words."""
  a, b = k[..., 0], k[..., 1]
  b = b ^ _mix(a)
  a = a ^ _mix(b + np.uint32(_ROUND))
  return jnp.stack([a, b], axis=-1)


def _seed(seed):
  if seed.shape:
    raise TypeError(f"a hash key's seed is a scalar, not an array of shape {seed.shape}")
  if not np.issubdtype(seed.dtype, np.integer):
    raise TypeError(f"a hash key's seed is an integer, not {seed.dtype}")
  low = lax.convert_element_type(seed, np.uint32)
  high = (lax.convert_element_type(lax.shift_right_logical(seed, jnp.array(32, seed.dtype)), np.uint32)
          if seed.dtype.itemsize == 8 else jnp.zeros((), np.uint32))
  return _scramble(jnp.stack([high, low]))


def _fold_in(key, data):
  data = lax.convert_element_type(data, np.uint32)
  return _scramble(key ^ jnp.stack([data, data ^ np.uint32(_FOLD)]))


def _split(key, shape):
  n = int(np.prod(shape))
  i = lax.iota(np.uint32, n)
  keys = _scramble(key[None] ^ jnp.stack([i, i ^ np.uint32(_SPLIT)], axis=-1))
  return keys.reshape(*shape, 2)


def _words(key, shape):
  """uint32 `shape`: the hash of each element's row-major index under the key; more than 2^32 elements would
  repeat their bits, and are refused."""
  if int(np.prod(shape, dtype=np.float64)) > 2 ** 32:
    raise ValueError(f"hash keys index bits with 32 bits: {tuple(shape)} has more than 2^32 elements (their "
                     "bits would repeat); use dropout_rng 'threefry2x32'")
  index = lax.bitcast_convert_type(dropout.element_index(tuple(shape)), jnp.uint32)
  return _mix(_mix(index + key[0]) ^ key[1])


def _random_bits(key, bit_width, shape):
  if bit_width not in (8, 16, 32, 64):
    raise TypeError(f"bits of width 8, 16, 32 or 64, not {bit_width}")
  if bit_width == 64:
    words = _words(key, (*shape, 2)).astype(np.uint64)
    return lax.shift_left(words[..., 0], np.uint64(32)) | words[..., 1]
  words = _words(key, shape)
  if bit_width == 32:
    return words
  return lax.shift_right_logical(words, np.uint32(32 - bit_width)).astype(f"uint{bit_width}")


IMPL = jax.extend.random.define_prng_impl(key_shape=(2,), seed=_seed, split=_split, random_bits=_random_bits,
                                          fold_in=_fold_in, name=NAME, tag="hsh")


def impl(name: str):
  """What `jax.random.key(..., impl=)` takes for a `config.dropout_rng` name."""
  return IMPL if name == NAME else name
