"""A compiled step's optimized HLO text, read: its computations and ops, the bytes of an array as the
device stores it, where it lives, and what runs how often a step.

`hlo_bytes` (the bytes each op moves) and `hlo_flops` (the FLOPs of its matrix products) read the step
through this. Shapes are the on-device ones, with the TPU's tile padding: a layout's first tile
(`T(8,128)`) rounds the dims it covers up to whole tiles, as the device stores them and as XLA's cost
analysis counts them. A layout's `S(n)` names the memory space: 0 (none printed) the device's HBM, 5 the
host's, any other on-chip memory the TPU compiler assigns (`S(1)`: its alternate memory, the 128 MiB
VMEM of a v5e or v6e core; `S(3)` on v4, where a small step keeps most of its arrays, its 128 MiB CMEM as
we read it; small `S(2)`, `S(4)`, `S(6)` scalars).

What runs: the entry computation, loop bodies and conditions (a body once per trip: XLA's
`known_trip_count`, else the constant N of the loop's `i < N` condition; a loop with neither once), both
branches of a conditional, called computations; not the computations inside fusions, which run as one op.
"""

import collections
import dataclasses
import math
import re

DTYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32,
    "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128, "token": 0,
}
# f8e4m3fn, f8e5m2, f4e2m1fn, ...: the digit after "f" is the width.
_FLOAT_SMALL = re.compile(r"f(\d)e\d+m\d+\w*$")
ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\](\{[^{}]*\})?")   # dtype, dims, layout
_SPACE = re.compile(r"S\((\d+)\)")
_TILE = re.compile(r"T\(([\d,]+)\)")   # a layout's first tile; the sub-tiles after it print without the T
HBM_SPACE, HOST_SPACE = 0, 5
_INSTR = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%(\S+)\s*\(.*\{\s*$")
TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
TARGET = re.compile(r'custom_call_target="([^"]*)"')

def dtype_bytes(dtype: str) -> float:
  if dtype in DTYPE_BITS:
    return DTYPE_BITS[dtype] / 8
  if match := _FLOAT_SMALL.match(dtype):
    return int(match.group(1)) / 8
  raise ValueError(f"unknown HLO element type {dtype!r}")


def array_bytes(dtype: str, dims: str, layout: str = "") -> float:
  """Bytes of one array as it is stored: with a tiled layout (a TPU's "{1,0:T(8,128)(2,1)}"), the dims
  the first tile covers, the most minor ones in the layout's order, rounded up to the tile's."""
  sizes = [int(d) for d in dims.split(",") if d]
  return dtype_bytes(dtype) * math.prod(padded_dims(sizes, layout))


def padded_dims(sizes: list[int], layout: str) -> list[int]:
  """The stored sizes of an array's dims, major to minor in its layout, each the logical size rounded up
  to the first tile's: [4, 128, 8, 64] in "{1,3,2,0:T(8,128)(2,1)}" -> [4, 8, 64, 128] (no rounding);
  [2048, 16] in "{0,1:T(8,128)}" -> [16, 2048] (16 rows of 2048, already whole tiles); [4, 16] in
  "{1,0:T(4,128)}" -> [4, 128]. A layout without a tile, or none printed, leaves the sizes as they are
  (in logical order)."""
  order, _, attributes = (layout or "").strip("{}").partition(":")
  tile = _TILE.search(attributes)
  if not sizes or not order or tile is None:
    return sizes
  minor_to_major = [int(d) for d in order.split(",")]
  stored = [sizes[d] for d in reversed(minor_to_major)]
  tile_dims = [int(t) for t in tile.group(1).split(",")]
  if len(tile_dims) > len(stored):   # a tile of more dims than the array: the missing ones are of size 1
    stored = [1] * (len(tile_dims) - len(stored)) + stored
  covered = len(tile_dims)
  return stored[:-covered] + [-(-size // t) * t for size, t in zip(stored[-covered:], tile_dims)]


def memory_space(layout: str) -> int:
  """The memory space of an array's printed layout: "{1,0:T(8,128)S(1)}" -> 1; none printed -> 0 (HBM)."""
  return int(m.group(1)) if (m := _SPACE.search(layout or "")) else HBM_SPACE


def shape_bytes(shape: str) -> float:
  """Bytes of an HLO shape as printed, a tuple's elements summed: "(f32[2,3]{1,0}, s32[])" -> 28."""
  return sum(array_bytes(dtype, dims, layout) for dtype, dims, layout in ARRAY.findall(shape))


def is_on_chip(layout: str) -> bool:
  """Whether a layout puts its array in an on-chip memory space (neither HBM nor the host's)."""
  return memory_space(layout) not in (HBM_SPACE, HOST_SPACE)


def on_chip_share(shape: str, first_only: bool = False) -> float:
  """The fraction of a shape's bytes in on-chip memory spaces; of its first array only with `first_only`
  (an asynchronous slice's start: the source it reads)."""
  if "S(" not in shape:   # no memory space printed: all in HBM
    return 0.0
  arrays = ARRAY.findall(shape)[:1] if first_only else ARRAY.findall(shape)
  total = sum(array_bytes(dtype, dims, layout) for dtype, dims, layout in arrays)
  on_chip = sum(array_bytes(dtype, dims, layout) for dtype, dims, layout in arrays if is_on_chip(layout))
  return on_chip / total if total else 0.0


@dataclasses.dataclass(frozen=True)
class Op:
  name: str
  shape: str       # the result's shape, as printed
  opcode: str
  operands: tuple  # operand names
  attrs: str       # everything after the operand list
  args: str = ""   # the operand list as printed (a parameter's number)
  root: bool = False


def _depths(text: str, start: int = 0):
  """(index, depth after it) of each bracket in text[start:] outside quoted strings (any kind nests)."""
  depth, quoted, i = 0, False, start
  while i < len(text):
    c = text[i]
    if quoted:
      if c == "\\":
        i += 1
      elif c == '"':
        quoted = False
    elif c == '"':
      quoted = True
    elif c in "([{)]}":
      depth += 1 if c in "([{" else -1
      yield i, depth
    i += 1


def _closing(text: str, start: int) -> int:
  """Index of the bracket closing the one at text[start] (brackets of any kind nest; quotes skipped)."""
  for i, depth in _depths(text, start):
    if depth == 0:
      return i
  raise ValueError(f"unbalanced HLO text: {text[start:start + 80]!r}")


def _depth(text: str) -> int:
  """Brackets opened less brackets closed in `text`, outside quoted strings."""
  depth = 0
  for _, depth in _depths(text):
    pass
  return depth


def parse_op(line: str) -> Op | None:
  """One instruction line of HLO text, or None for a line that is not one."""
  match = _INSTR.match(line)
  if not match:
    return None
  name, rest = match.group(2), match.group(3)
  if rest.startswith("("):   # a tuple shape
    end = _closing(rest, 0) + 1
  else:   # an array shape and its layout hold no spaces
    end = rest.index(" ")
  shape, rest = rest[:end], rest[end:].lstrip()
  paren = rest.index("(")
  opcode = rest[:paren]
  close = _closing(rest, paren)
  operands = tuple(re.findall(r"%([^\s,()]+)", rest[paren + 1:close]))
  return Op(name, shape, opcode, operands, rest[close + 1:], rest[paren + 1:close], bool(match.group(1)))


def parse_module(text: str) -> tuple[str, dict[str, list[Op]]]:
  """(entry computation name, computation name -> its ops) of a module's HLO text. An instruction whose
  attributes are printed over several lines (a Pallas kernel's `kernel_metadata`, some of whose lines
  begin with "}" or are "}" alone) is read as one line, to where its brackets close; a computation ends
  at a "}" alone outside an instruction."""
  computations, entry, current, body, depth = {}, None, None, [], 0
  for line in text.splitlines():
    if current is None:
      if header := _HEADER.match(line):
        current, body, depth = header.group(2), [], 0
        if header.group(1):
          entry = current
      continue
    if depth > 0:   # the instruction goes on
      body[-1] += " " + line.strip()
      depth += _depth(line)
    elif line.strip() == "}":
      computations[current] = [op for op in map(parse_op, body) if op]
      current = None
    elif _INSTR.match(line):
      body.append(line)
      depth = _depth(line)
  if current is not None:
    raise ValueError(f"HLO computation {current!r} does not end")
  if entry is None:
    raise ValueError("no ENTRY computation in the HLO text")
  return entry, computations


def trip_count(op: Op, computations: dict[str, list[Op]]) -> int | None:
  """A while loop's trip count: XLA's `known_trip_count`, else read from a condition `i < N` on a constant
  N (JAX's scans and fori loops count from 0 in steps of 1); None when neither is there."""
  if m := TRIPS.search(op.attrs):
    return int(m.group(1))
  if not (m := re.search(r"\bcondition=%([^\s,}]+)", op.attrs)):
    return None
  cond = computations.get(m.group(1), [])
  local = {o.name: o for o in cond}
  root = root_op(cond)
  if root is None or root.opcode != "compare" or "direction=LT" not in root.attrs or len(root.operands) != 2:
    return None
  bound = local.get(root.operands[1])
  if bound is None or bound.opcode != "constant" or not bound.args.strip().lstrip("-").isdigit():
    return None
  return max(int(bound.args), 0)


def _called(op: Op, computations: dict[str, list[Op]]) -> list[tuple[str, int]]:
  """Computations an executed op runs as ops of their own (not fusions), with how often per run of `op`
  (a loop of unknown trip count: once)."""
  attrs = op.attrs
  if op.opcode == "while":
    trips = trip_count(op, computations) or 1
    found = dict(re.findall(r"\b(body|condition)=%([^\s,}]+)", attrs))
    return [(found[k], trips + (k == "condition")) for k in ("body", "condition") if k in found]
  if op.opcode == "conditional":
    if m := re.search(r"branch_computations=\{([^}]*)\}", attrs):
      return [(n, 1) for n in re.findall(r"%([^\s,}]+)", m.group(1))]
    return [(n, 1) for n in re.findall(r"\b(?:true|false)_computation=%([^\s,}]+)", attrs)]
  if op.opcode == "call":
    return [(n, 1) for n in re.findall(r"\bto_apply=%([^\s,}]+)", attrs)]
  return []


def fused_ops(op: Op, computations: dict[str, list[Op]]) -> list[Op] | None:
  """The ops of the computation a fusion calls, or None for an op that is no fusion."""
  if op.opcode != "fusion" or not (m := re.search(r"\bcalls=%([^\s,}]+)", op.attrs)):
    return None
  return computations.get(m.group(1), [])


def root_op(ops: list[Op]) -> Op | None:
  return next((o for o in ops if o.root), None)


def shapes_by_name(computations: dict[str, list[Op]]) -> dict[str, str]:
  """Every op's result shape, as printed, by its name (names are unique in a module)."""
  return {op.name: op.shape for ops in computations.values() for op in ops}


def run_counts(entry: str, computations: dict[str, list[Op]]) -> tuple[list[str], collections.Counter]:
  """Every computation that runs ops of its own, breadth-first from the entry, and how often it runs a step
  (a loop body per trip)."""
  runs, order = collections.Counter({entry: 1}), [entry]
  for comp in order:
    for op in computations.get(comp, []):
      for callee, n in _called(op, computations):
        if callee not in runs:
          order.append(callee)
        runs[callee] += runs[comp] * n
  return order, runs


