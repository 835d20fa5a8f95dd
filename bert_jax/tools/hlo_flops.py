"""The FLOPs of a compiled step's matrix products, from its optimized HLO text (`hlo_module`), each loop
body counted per trip, where XLA's cost analysis counts it once."""

import math
import re

from bert_jax.tools import hlo_module
from bert_jax.tools.hlo_module import Op


def matmul_flops(text: str) -> float:
  """The FLOPs of a compiled step's matrix products, each loop body counted per trip (XLA's cost analysis
  counts it once): every `dot` and `convolution` (TPU's compiler writes matmuls as convolutions), inside
  fusions too, at 2 x its result's elements x the size it contracts. No elementwise work: for a step with
  loops, a count of the matmuls it runs, recomputed ones (a remat policy's) included."""
  entry, computations = hlo_module.parse_module(text)
  shapes = hlo_module.shapes_by_name(computations)
  order, runs = hlo_module.run_counts(entry, computations)
  return sum(runs[comp] * _flops(op, computations, shapes) for comp in order for op in computations.get(comp, []))


def _dims(shape: str) -> list[int]:
  arrays = hlo_module.ARRAY.findall(shape)
  return [int(d) for d in arrays[0][1].split(",") if d] if arrays else []


def _flops(op: Op, computations: dict[str, list[Op]], shapes: dict[str, str], depth: int = 0) -> float:
  if op.opcode == "fusion":
    return 0.0 if depth > 8 else sum(_flops(o, computations, shapes, depth + 1)
                                     for o in hlo_module.fused_ops(op, computations) or [])
  if op.opcode not in ("dot", "convolution") or len(op.operands) < 2:
    return 0.0
  out = math.prod(_dims(op.shape))
  if op.opcode == "dot":
    lhs = _dims(shapes.get(op.operands[0], ""))
    m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", op.attrs)
    contracted = math.prod(lhs[int(d)] for d in m.group(1).split(",") if d) if m and lhs else 1
    return 2.0 * out * contracted
  # convolution: per output element, the kernel's input features times the window's taps that land on an
  # input element (not on padding, nor between the elements of a dilated input: TPU's batched matmuls lay
  # batch dims out as spatial dims with a window over a dilated input, which meets one element in each).
  lhs, rhs = _dims(shapes.get(op.operands[0], "")), _dims(shapes.get(op.operands[1], ""))
  labels = re.search(r"dim_labels=([^_\s,]*)_([^-\s,]*)->([^\s,]*)", op.attrs)
  if not lhs or not rhs or not labels or "i" not in labels.group(2):
    return 0.0
  lhs_labels, rhs_labels, out_labels = labels.groups()
  out_dims = _dims(op.shape)
  spatial = sorted(c for c in out_labels if c.isdigit())
  window = m.group(1) if (m := re.search(r"window=\{([^}]*)\}", op.attrs)) else ""
  def field(name, default):
    m = re.search(rf"\b{name}=([-\d_x]+)", window)
    return m.group(1).split("x") if m else [default] * len(spatial)
  sizes, strides = field("size", "1"), field("stride", "1")
  pads, lhs_dilate, rhs_dilate = field("pad", "0_0"), field("lhs_dilate", "1"), field("rhs_dilate", "1")
  pairs = 1
  for j, dim in enumerate(spatial):
    n_in, n_out = lhs[lhs_labels.index(dim)], out_dims[out_labels.index(dim)]
    size, stride, low = int(sizes[j]), int(strides[j]), int(pads[j].split("_")[0])
    d_in, d_k = int(lhs_dilate[j]), int(rhs_dilate[j])
    pairs *= sum(1 for o in range(n_out) for k in range(size)
                 if 0 <= (p := o * stride + k * d_k - low) <= (n_in - 1) * d_in and p % d_in == 0)
  per_position = math.prod(out_dims) // max(1, math.prod(out_dims[out_labels.index(d)] for d in spatial))
  return 2.0 * per_position * rhs[rhs_labels.index("i")] * pairs


