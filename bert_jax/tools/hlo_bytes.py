"""Where a compiled step's memory traffic goes: the bytes each executed HLO op reads and writes.

`bert-jax aot --report` prints this for the step it compiled. It reads the optimized HLO text
(`compiled.as_text()`): every op that runs (in the entry computation, loop bodies and conditions,
conditional branches, called computations; not inside fusions, which run as one op) moves the bytes of
its operands and of its result. A loop body's ops are counted once per trip (XLA's `known_trip_count`,
else the constant N of the loop's `i < N` condition; a loop with neither is counted once and the summary
says so); both branches of a conditional are counted, as if each were taken. An asynchronous pair
(`copy-start` / `copy-done`) reads at the start and writes at the done; a TPU collective (a fusion chain
from AsyncCollectiveStart to AsyncCollectiveDone) reads its input at the start and writes its result at
the done, and the fusions between carry its buffers through without moving them (an output that is an
unchanged parameter aliased to that operand moves nothing). As in XLA's cost analysis, a slice reads
what it returns, not its operand (so does a fusion's parameter that only slices use, directly or in a
nested fusion), and an update in
place (a dynamic-update-slice, alone or at the root of a fusion, also when its buffer passes through a
nested fusion that aliases it, a relayout in place; a slice through such a relayout reads the slice)
reads and writes the update, not the buffer around it; ConcatBitcast and AllocateBuffer move nothing.
A Pallas kernel (a `tpu_custom_call`) moves its operands and result, as any op; one that declares no cost
(`pl.CostEstimate`) is one XLA's cost analysis counts as moving nothing, and its bytes are also summed
apart (`undeclared_kernel_bytes`), which `aot` adds to XLA's count.
Shapes are the on-device ones, with the TPU's tile padding: a layout's first tile (`T(8,128)`) rounds the
dims it covers up to whole tiles, as the device stores them and as XLA's cost analysis counts them; all
memory spaces are counted.

Each op's bytes are also split by where its arrays live (`on_chip_bytes`): a layout's `S(n)` names the
memory space, 0 (none printed) the device's HBM, 5 the host's, any other on-chip memory the TPU compiler
assigns (`S(1)`: its alternate memory, the 128 MiB VMEM of a v5e or v6e core; `S(3)` on v4, where a small
step keeps most of its arrays, its 128 MiB CMEM as we read it; small `S(2)`, `S(4)`, `S(6)`
scalars). An asynchronous copy or slice into `S(1)` reads HBM and writes on chip; a fusion whose operands
and result the compiler placed there moves no HBM bytes. XLA's cost analysis counts every space alike.

The sum is close to XLA's "bytes accessed" on BERT-large's shapes and not equal to it (v3:8x8 phase 1,
unrolled: 5.227 against 5.296 GB, -1.3%; with 4 layers -5%; on a one-layer tiny model on v4, 28% lower;
XLA counts loop bodies once, this count per trip). Without the tile padding, the same HLO counts 4.556
GB (-14%). The point is the ranking: which fusions, copies and collectives move the bytes, under the JAX
op names (`op_name` metadata) that made them, so that a regression or a waste (an f32 weight read where
bf16 would do, a materialised mask, a layout copy) shows by name.
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
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\](\{[^{}]*\})?")   # dtype, dims, layout
_SPACE = re.compile(r"S\((\d+)\)")
_TILE = re.compile(r"T\(([\d,]+)\)")   # a layout's first tile; the sub-tiles after it print without the T
HBM_SPACE, HOST_SPACE = 0, 5
_INSTR = re.compile(r"^\s*(ROOT\s+)?%(\S+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%(\S+)\s*\(.*\{\s*$")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_KIND = re.compile(r"\bkind=(\w+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')

# Ops that move no data of their own (bookkeeping, or control whose bodies are counted instead).
FREE_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
                      "call", "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency",
                      "domain", "iota"})
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")


def dtype_bytes(dtype: str) -> float:
  if dtype in DTYPE_BITS:
    return DTYPE_BITS[dtype] / 8
  if match := _FLOAT_SMALL.match(dtype):
    return int(match.group(1)) / 8
  raise ValueError(f"unknown HLO element type {dtype!r}")


def _array_bytes(dtype: str, dims: str, layout: str = "") -> float:
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
  return sum(_array_bytes(dtype, dims, layout) for dtype, dims, layout in _ARRAY.findall(shape))


def is_on_chip(layout: str) -> bool:
  """Whether a layout puts its array in an on-chip memory space (neither HBM nor the host's)."""
  return memory_space(layout) not in (HBM_SPACE, HOST_SPACE)


def on_chip_share(shape: str, first_only: bool = False) -> float:
  """The fraction of a shape's bytes in on-chip memory spaces; of its first array only with `first_only`
  (an asynchronous slice's start: the source it reads)."""
  if "S(" not in shape:   # no memory space printed: all in HBM
    return 0.0
  arrays = _ARRAY.findall(shape)[:1] if first_only else _ARRAY.findall(shape)
  total = sum(_array_bytes(dtype, dims, layout) for dtype, dims, layout in arrays)
  on_chip = sum(_array_bytes(dtype, dims, layout) for dtype, dims, layout in arrays if is_on_chip(layout))
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
  if m := _TRIPS.search(op.attrs):
    return int(m.group(1))
  if not (m := re.search(r"\bcondition=%([^\s,}]+)", op.attrs)):
    return None
  cond = computations.get(m.group(1), [])
  local = {o.name: o for o in cond}
  root = _root(cond)
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


# Custom calls that move no data: ConcatBitcast joins adjacent buffers by a bitcast, AllocateBuffer leaves
# its buffer uninitialised.
FREE_CUSTOM_CALLS = frozenset({"ConcatBitcast", "AllocateBuffer"})
PARTIAL_READS = frozenset({"slice", "dynamic-slice", "gather"})   # read what they return, not their operand


def _calls(op: Op, computations: dict[str, list[Op]]) -> list[Op] | None:
  """The ops of the computation a fusion calls, or None for an op that is no fusion."""
  if op.opcode != "fusion" or not (m := re.search(r"\bcalls=%([^\s,}]+)", op.attrs)):
    return None
  return computations.get(m.group(1), [])


def _root(ops: list[Op]) -> Op | None:
  return next((o for o in ops if o.root), None)


def moved(op: Op, computations: dict[str, list[Op]], shapes: dict[str, str]) -> tuple[float, float, float]:
  """(bytes read, bytes written, of those bytes the ones on chip) by one run of an executed op, counted as
  XLA's cost analysis does: operands and result, except that a slice reads what it returns (so does a
  fusion's parameter that only slices use), an update in place (dynamic-update-slice, alone or at a
  fusion's root) reads and writes the update and not the buffer, an asynchronous pair reads at the start
  and writes at the done (an asynchronous slice does both at the done), and a bitcast-like custom call
  moves nothing. On chip: the bytes of operands and results in on-chip memory spaces (`is_on_chip`; an
  operand that is a tuple, in the proportion of its bytes there; a fusion's result, element by element)."""
  operand_shapes = [shapes.get(o, "") for o in op.operands]
  reads = [shape_bytes(s) for s in operand_shapes]
  written = shape_bytes(op.shape)
  write_share = on_chip_share(op.shape)
  # Read when called: the rules below lower `reads` first.
  on_chip_read = lambda: sum(r * on_chip_share(s) for r, s in zip(reads, operand_shapes))   # noqa: E731
  opcode = op.opcode
  if opcode == "slice-start":
    return 0.0, 0.0, 0.0
  if opcode == "slice-done":   # reads the source named first in the start's tuple
    source_share = on_chip_share(operand_shapes[0], first_only=True) if operand_shapes else 0.0
    return written, written, written * (source_share + write_share)
  if opcode.endswith("-start"):   # the done writes the result; the start's tuple repeats its operands
    return sum(reads), 0.0, on_chip_read()
  if opcode.endswith("-done"):    # its operand is the start's handle
    return 0.0, written, written * write_share
  if opcode == "custom-call" and (m := _TARGET.search(op.attrs)) and m.group(1) in FREE_CUSTOM_CALLS:
    return 0.0, 0.0, 0.0
  if opcode in PARTIAL_READS and reads:
    reads[0] = written
  if opcode == "dynamic-update-slice" and len(reads) > 1:
    reads[0], written = 0.0, reads[1]
  written_on_chip = None
  if (fused := _calls(op, computations)) is not None:
    root = _root(fused)
    target = _TARGET.search(root.attrs).group(1) if root is not None and root.opcode == "custom-call" else ""
    if target == "AsyncCollectiveStart":   # a TPU collective: its input is read here...
      return sum(reads), 0.0, on_chip_read()
    if target == "AsyncCollectiveDone":    # ...and its result written here, once
      return 0.0, written, written * write_share
    unwritten = _fused(fused, reads, computations)
    for index, b in _passed_through(op, fused, reads).items():
      unwritten[index] = unwritten.get(index, 0.0) + b
    written -= sum(unwritten.values())
    elements = _ARRAY.findall(op.shape)
    if write_share and len(elements) == (len(root.operands) if root is not None and root.opcode == "tuple" else 1):
      written_on_chip = sum(_array_bytes(dtype, dims, layout) - unwritten.get(i, 0.0)
                            for i, (dtype, dims, layout) in enumerate(elements) if is_on_chip(layout))
  if written_on_chip is None:   # nested tuples: in proportion
    written_on_chip = written * write_share
  return sum(reads), written, on_chip_read() + written_on_chip


def _users(ops: list[Op]) -> dict[str, list[Op]]:
  users = collections.defaultdict(list)
  for o in ops:
    for x in o.operands:
      users[x].append(o)
  return users


def _partial_read(name: str, ops: list[Op], computations: dict[str, list[Op]], depth: int = 0) -> float | None:
  """The bytes of `name` that `ops` (a fused computation) read when only slices use it, directly, as the
  parameter of a nested fusion (a scanned layer's fusion slices its layer out of the stacked array in
  one) or through a relayout in place (`_views_its_operand`); None when some use reads it whole."""
  feeds = _users(ops)[name]
  if not feeds or depth > 8:
    return None
  total = 0.0
  for u in feeds:
    if u.opcode in PARTIAL_READS and u.operands[0] == name and name not in u.operands[1:]:
      total += shape_bytes(u.shape)
      continue
    if _views_its_operand(u):   # a relayout in place: what is read is what its users read
      if (part := _partial_read(u.name, ops, computations, depth + 1)) is None:
        return None
      total += part
      continue
    inner = _calls(u, computations) if u.opcode == "fusion" else None
    if inner is None:
      return None
    params = {int(o.args): o.name for o in inner if o.opcode == "parameter" and o.args.isdigit()}
    for position, operand in enumerate(u.operands):
      if operand != name:
        continue
      if position not in params or (part := _partial_read(params[position], inner, computations, depth + 1)) is None:
        return None
      total += part
  return total


def _fused(fused: list[Op], reads: list[float], computations: dict[str, list[Op]]) -> dict[int, float]:
  """Lowers `reads` (per operand of the fusion) for parameters read in part or updated in place; returns
  the bytes of the result that are not written (a buffer updated in place, less its update), by the
  index of the output (0 for a result that is no tuple)."""
  local = {o.name: o for o in fused}
  users = _users(fused)
  for o in fused:
    if o.opcode == "parameter" and (i := int(o.args)) < len(reads):
      if (part := _partial_read(o.name, fused, computations)) is not None:
        reads[i] = part
  root = _root(fused)
  outputs = [local.get(n) for n in root.operands] if root and root.opcode == "tuple" else [root]
  unwritten = {}
  for index, out in enumerate(outputs):
    while out is not None and out.opcode == "bitcast" and out.operands:
      out = local.get(out.operands[0])
    if out is None or out.opcode != "dynamic-update-slice" or len(out.operands) < 2:
      continue
    buffer, update, chain = local.get(out.operands[0]), local.get(out.operands[1]), {out.name}
    while buffer is not None and _views_its_operand(buffer):   # a relayout in place: the same buffer
      chain.add(buffer.name)
      buffer = local.get(buffer.operands[0])
    if buffer is None or buffer.opcode != "parameter" or update is None:
      continue
    others = [u for u in users[buffer.name] if u.name not in chain]
    if all(u.opcode in PARTIAL_READS and u.operands[0] == buffer.name for u in others):
      reads[int(buffer.args)] = sum(shape_bytes(u.shape) for u in others)   # 0 when the update is its only use
    # An update tiled coarser than its buffer (padded larger than the rows it covers there) writes no
    # more than the buffer.
    unwritten[index] = max(0.0, shape_bytes(out.shape) - shape_bytes(update.shape))
  return unwritten


def _views_its_operand(op: Op) -> bool:
  """A nested fusion of one operand whose result is that operand's buffer (`output_to_operand_aliasing=
  {{}: (0, {})}`): TPU's fusions of a scanned layer pass a stacked buffer through such a relayout (a
  `copy_fusion` between tilings of a pred array) on its way to the in-place update; what is written is
  the update, not the buffer, as without the relayout."""
  return (op.opcode == "fusion" and len(op.operands) == 1
          and "output_to_operand_aliasing={{}: (0, {})}" in op.attrs)


_ALIAS = re.compile(r"\{([\d,\s]*)\}:\s*\((\d+),")


def _passed_through(op: Op, fused: list[Op], reads: list[float]) -> dict[int, float]:
  """A fusion output that is one of its parameters, unchanged, in the buffer of that operand
  (`output_to_operand_aliasing`: TPU's asynchronous collectives carry their buffers through the fusions
  that run beside them) moves nothing: lowers `reads` and returns the bytes not written by output index."""
  if not (m := re.search(r"output_to_operand_aliasing=\{(.*?)\}\}?,\s*\w+=", op.attrs)):
    return {}
  local = {o.name: o for o in fused}
  root = _root(fused)
  if root is None or root.opcode != "tuple":
    return {}
  elements = _ARRAY.findall(op.shape)
  if len(elements) != len(root.operands):   # nested tuples: left as counted
    return {}
  unwritten = {}
  for index, operand in _ALIAS.findall(m.group(1)):
    if not index.strip().isdigit() or int(operand) >= len(reads):
      continue
    out = local.get(root.operands[int(index)])
    while out is not None and out.opcode in ("bitcast", "get-tuple-element") and out.operands:
      out = local.get(out.operands[0])
    if out is not None and out.opcode == "parameter" and int(out.args) == int(operand):
      dtype, dims, layout = elements[int(index)]
      unwritten[int(index)] = unwritten.get(int(index), 0.0) + _array_bytes(dtype, dims, layout)
      reads[int(operand)] = 0.0
  return unwritten


def undeclared_kernel(op: Op) -> bool:
  """A Pallas TPU kernel whose backend config declares no cost estimate: XLA's cost analysis counts it as
  moving nothing and computing nothing."""
  target = _TARGET.search(op.attrs) if op.opcode == "custom-call" else None
  return bool(target) and target.group(1) == "tpu_custom_call" and "cost_estimate" not in op.attrs


def category(op: Op, computations: dict[str, list[Op]] | None = None) -> str:
  base = op.opcode.removesuffix("-start").removesuffix("-done")
  if op.opcode == "fusion":
    if computations and (fused := _calls(op, computations)) is not None:
      root = _root(fused)
      if root is not None and root.opcode == "custom-call" and "AsyncCollective" in root.attrs:
        kind = next((o.opcode for o in fused if o.opcode in COLLECTIVES), "")
        return f"collective {kind}".strip()
    return f"fusion {m.group(1)}" if (m := _KIND.search(op.attrs)) else "fusion"
  if base in COLLECTIVES:
    return f"collective {base}"
  if base == "custom-call":
    return f"custom-call {m.group(1)}" if (m := _TARGET.search(op.attrs)) else "custom-call"
  if base == "async":   # an async wrapper: name it by what it wraps where it says
    return "async"
  return base


def source(op: Op) -> str:
  """The JAX op that made `op` (its `op_name`), with layer indices folded: layer_7 -> layer_*."""
  match = _OP_NAME.search(op.attrs)
  if not match:
    return f"({category(op)}, no op_name)"
  name = match.group(1).replace("\\'", "'")
  return re.sub(r"layer_\d+", "layer_*", name)


def _runs(entry: str, computations: dict[str, list[Op]]) -> tuple[list[str], collections.Counter]:
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


def matmul_flops(text: str) -> float:
  """The FLOPs of a compiled step's matrix products, each loop body counted per trip (XLA's cost analysis
  counts it once): every `dot` and `convolution` (TPU's compiler writes matmuls as convolutions), inside
  fusions too, at 2 x its result's elements x the size it contracts. No elementwise work: for a step with
  loops, a count of the matmuls it runs, recomputed ones (a remat policy's) included."""
  entry, computations = parse_module(text)
  shapes = {op.name: op.shape for ops in computations.values() for op in ops}
  order, runs = _runs(entry, computations)
  return sum(runs[comp] * _flops(op, computations, shapes) for comp in order for op in computations.get(comp, []))


def _dims(shape: str) -> list[int]:
  arrays = _ARRAY.findall(shape)
  return [int(d) for d in arrays[0][1].split(",") if d] if arrays else []


def _flops(op: Op, computations: dict[str, list[Op]], shapes: dict[str, str], depth: int = 0) -> float:
  if op.opcode == "fusion":
    return 0.0 if depth > 8 else sum(_flops(o, computations, shapes, depth + 1)
                                     for o in _calls(op, computations) or [])
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


def traffic(text: str) -> list[dict]:
  """Per executed op: name, category, source, shape, trips (per step), bytes (per step: per run x trips),
  on_chip_bytes (those of them in on-chip memory spaces) and undeclared_kernel (`undeclared_kernel`)."""
  entry, computations = parse_module(text)
  shapes = {op.name: op.shape for ops in computations.values() for op in ops}
  rows = []
  order, runs = _runs(entry, computations)
  for comp in order:
    for op in computations.get(comp, []):
      if op.opcode == "while" and trip_count(op, computations) is None:
        rows.append({"name": op.name, "category": UNKNOWN_LOOP, "source": source(op), "shape": op.shape,
                     "trips": runs[comp], "bytes": 0.0})
  for comp in order:
    trips = runs[comp]
    for op in computations.get(comp, []):
      if op.opcode in FREE_OPS:
        continue
      read, written, on_chip = moved(op, computations, shapes)
      rows.append({"name": op.name, "category": category(op, computations), "source": source(op),
                   "shape": op.shape, "trips": trips, "bytes": (read + written) * trips,
                   "on_chip_bytes": on_chip * trips, "undeclared_kernel": undeclared_kernel(op)})
  return rows


UNKNOWN_LOOP = "loop of unknown trip count (body counted once)"


def summarize(rows: list[dict], top: int = 15) -> dict:
  """Totals by category and by source, and the `top` ops, sources and categories by bytes."""
  categories, sources = collections.Counter(), collections.Counter()
  for r in rows:
    categories[r["category"]] += r["bytes"]
    sources[r["source"]] += r["bytes"]
  total = sum(categories.values())
  kinds = [{"category": k, "bytes": v} for k, v in categories.most_common(top)]
  if rest := total - sum(k["bytes"] for k in kinds):
    kinds.append({"category": f"{len(categories) - len(kinds)} other kinds", "bytes": rest})
  unknown = sum(r["category"] == UNKNOWN_LOOP for r in rows)
  kinds = [k for k in kinds if k["category"] != UNKNOWN_LOOP]
  return {
      "total_bytes": total, "on_chip_bytes": sum(r.get("on_chip_bytes", 0.0) for r in rows),
      "undeclared_kernel_bytes": sum(r["bytes"] for r in rows if r.get("undeclared_kernel")),
      "ops": len(rows) - unknown, "unknown_loops": unknown, "by_category": kinds,
      "top_sources": [{"source": k, "bytes": v} for k, v in sources.most_common(top)],
      "top_ops": sorted(rows, key=lambda r: -r["bytes"])[:top],
  }


def format_summary(s: dict, xla_bytes: float | None = None) -> str:
  """The text `bert-jax aot --report` prints."""
  gb = lambda b: f"{b / 1e9:8.3f} GB"   # noqa: E731
  pct = lambda b: f"{100 * b / s['total_bytes']:5.1f}%" if s["total_bytes"] else "  -  "   # noqa: E731
  head = f"memory traffic by op (per device per step): {gb(s['total_bytes']).strip()} over {s['ops']} ops"
  if xla_bytes:
    head += f"; XLA's cost analysis: {xla_bytes / 1e9:.3f} GB, loop bodies once"
  lines = [head]
  if s.get("on_chip_bytes"):
    lines.append(f"  of which in on-chip memory (layouts S(n), n not 0 or 5): {gb(s['on_chip_bytes']).strip()}; "
                 f"elsewhere (HBM, host): {gb(s['total_bytes'] - s['on_chip_bytes']).strip()}")
  if s.get("undeclared_kernel_bytes"):
    lines.append(f"  of which in Pallas kernels that declare no cost (XLA counts them as moving nothing): "
                 f"{gb(s['undeclared_kernel_bytes']).strip()}")
  if s.get("unknown_loops"):
    lines.append(f"  WARNING: {s['unknown_loops']} loop(s) of unknown trip count: their bodies are counted once")
  lines.append("  by kind:")
  lines += [f"    {gb(c['bytes'])} {pct(c['bytes'])}  {c['category']}" for c in s["by_category"]]
  lines.append("  largest sources (JAX op names, layers folded):")
  lines += [f"    {gb(c['bytes'])} {pct(c['bytes'])}  {c['source']}" for c in s["top_sources"]]
  lines.append("  largest ops:")
  lines += [f"    {gb(r['bytes'])} {pct(r['bytes'])}  {r['category']:<24} x{r['trips']:<4} {r['name']}  "
            f"{re.sub(r'{[^}]*}', '', r['shape'])[:60]}  {r['source'][-90:]}" for r in s["top_ops"]]
  return "\n".join(lines)
