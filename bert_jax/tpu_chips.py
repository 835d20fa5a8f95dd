"""The TPU chips `aot` compiles for and configs name: per-chip peak, HBM and cores (one owner for them).

A topology is "<generation>:<shape>", e.g. "v3:8x8" (64 chips, 128 cores: JAX shows v3's two
TensorCores as two devices), "v5e:8x8", "v4:4x4x4".
"""

import dataclasses
import math

from bert_jax import failures

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """Per-chip figures from the Cloud TPU system-architecture pages (`source`)."""
  peak_flops: float       # bf16 FLOP/s per chip
  hbm_bytes: float        # HBM per chip
  hbm_bandwidth: float    # HBM bytes/s per chip
  cores: int              # TensorCores per chip that JAX shows as separate devices
  libtpu_name: str        # the generation's name in libtpu topology strings
  host_type: str          # a one-host accelerator type of the generation (only to quiet libtpu)
  megacore: bool          # v4/v5p: both TensorCores of a chip act as one device
  source: str


CHIPS = {
    # Two TensorCores per chip, each its own JAX device with half the chip: 61.5 TFLOP/s, 16 GiB, 450 GB/s.
    "v3": Chip(123e12, 32 * GiB, 900e9, 2, "v3", "v3-8", False, "https://cloud.google.com/tpu/docs/v3"),
    "v4": Chip(275e12, 32 * GiB, 1200e9, 1, "v4", "v4-8", True, "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip(197e12, 16 * GiB, 819e9, 1, "v5e", "v5litepod-4", False, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip(459e12, 95 * GiB, 2765e9, 1, "v5", "v5p-8", True, "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip(918e12, 32 * GiB, 1638e9, 1, "v6e", "v6e-4", False, "https://cloud.google.com/tpu/docs/v6e"),
}


def parse_topology(topology: str) -> tuple[str, Chip, str]:
  """"v3:8x8" -> ("v3", CHIPS["v3"], "8x8")."""
  generation, _, shape = topology.partition(":")
  if generation not in CHIPS or not shape:
    raise failures.UserError(f"topology {topology!r}: expected <generation>:<shape> with generation in "
                             f"{sorted(CHIPS)}, e.g. v3:8x8, v4:4x4x4, v5e:8x8, v6e:8x8")
  sides = shape.split("x")
  # libtpu takes a side of 0 with a floating-point exception that ends the process, and a non-number in a
  # traceback: both are refused here.
  if not 2 <= len(sides) <= 3 or not all(side.isdigit() and int(side) > 0 for side in sides):
    raise failures.UserError(f"topology {topology!r}: its shape is chips along each axis, two or three "
                             f"positive numbers joined by x, e.g. {generation}:8x8 or v4:4x4x4")
  return generation, CHIPS[generation], shape


def device_count(topology: str) -> int:
  """JAX devices of a topology: chips times the cores JAX shows per chip ("v3:8x8" -> 128)."""
  _, chip, shape = parse_topology(topology)
  return math.prod(int(n) for n in shape.split("x")) * chip.cores


def peak_flops_per_device(topology: str) -> float:
  """bf16 FLOP/s of one JAX device of the topology's chip (v3: half a chip, 61.5 TFLOP/s)."""
  _, chip, _ = parse_topology(topology)
  return chip.peak_flops / chip.cores
