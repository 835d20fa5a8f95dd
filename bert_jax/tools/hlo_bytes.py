"""Where a compiled step's memory traffic goes: the bytes each executed HLO op reads and writes.

`bert-jax aot --report` prints this for the step it compiled. It reads the optimized HLO text
(`compiled.as_text()`, through `hlo_module`): every op that runs (`hlo_module.run_counts`: a loop body once
per trip, a loop of unknown trip count once and the summary says so; both branches of a conditional, as if
each were taken; not the ops inside fusions, which run as one op) moves the bytes of its operands and of its
result, each array as the device stores it (`hlo_module.shape_bytes`, with the tile padding). An
asynchronous pair (`copy-start` / `copy-done`) reads at the start and writes at the done; a TPU collective
(a fusion chain from AsyncCollectiveStart to AsyncCollectiveDone) reads its input at the start and writes
its result at the done, and the fusions between carry its buffers through without moving them (an output
that is an unchanged parameter aliased to that operand moves nothing). As in XLA's cost analysis, a slice
reads what it returns, not its operand (so does a fusion's parameter that only slices use, directly or in a
nested fusion), and an update in place (a dynamic-update-slice, alone or at the root of a fusion, also when
its buffer passes through a nested fusion that aliases it, a relayout in place; a slice through such a
relayout reads the slice) reads and writes the update, not the buffer around it; ConcatBitcast and
AllocateBuffer move nothing. A Pallas kernel (a `tpu_custom_call`) moves its operands and result, as any op;
one that declares no cost (`pl.CostEstimate`) is one XLA's cost analysis counts as moving nothing, and its
bytes are also summed apart (`undeclared_kernel_bytes`), which `aot` adds to XLA's count. All memory spaces
are counted.

Each op's bytes are also split by where its arrays live (`on_chip_bytes`; `hlo_module.is_on_chip`: the
layout's `S(n)` is neither HBM nor the host's). An asynchronous copy or slice into `S(1)` reads HBM and
writes on chip; a fusion whose operands and result the compiler placed there moves no HBM bytes. XLA's
cost analysis counts every space alike.

The sum is close to XLA's "bytes accessed" on BERT-large's shapes and not equal to it (v3:8x8 phase 1,
unrolled: 5.227 against 5.296 GB, -1.3%; with 4 layers -5%; on a one-layer tiny model on v4, 28% lower;
XLA counts loop bodies once, this count per trip). Without the tile padding, the same HLO counts 4.556
GB (-14%). The point is the ranking: which fusions, copies and collectives move the bytes, under the JAX
op names (`op_name` metadata) that made them, so that a regression or a waste (an f32 weight read where
bf16 would do, a materialised mask, a layout copy) shows by name.
"""

import collections
import re

from bert_jax.tools import hlo_module
from bert_jax.tools.hlo_module import Op

_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_KIND = re.compile(r"\bkind=(\w+)")

# Ops that move no data of their own (bookkeeping, or control whose bodies are counted instead).
FREE_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional",
                      "call", "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency",
                      "domain", "iota"})
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")


# Custom calls that move no data: ConcatBitcast joins adjacent buffers by a bitcast, AllocateBuffer leaves
# its buffer uninitialised.
FREE_CUSTOM_CALLS = frozenset({"ConcatBitcast", "AllocateBuffer"})
PARTIAL_READS = frozenset({"slice", "dynamic-slice", "gather"})   # read what they return, not their operand


def moved(op: Op, computations: dict[str, list[Op]], shapes: dict[str, str]) -> tuple[float, float, float]:
  """(bytes read, bytes written, of those bytes the ones on chip) by one run of an executed op, counted as
  XLA's cost analysis does: operands and result, except that a slice reads what it returns (so does a
  fusion's parameter that only slices use), an update in place (dynamic-update-slice, alone or at a
  fusion's root) reads and writes the update and not the buffer, an asynchronous pair reads at the start
  and writes at the done (an asynchronous slice does both at the done), and a bitcast-like custom call
  moves nothing. On chip: the bytes of operands and results in on-chip memory spaces (`is_on_chip`; an
  operand that is a tuple, in the proportion of its bytes there; a fusion's result, element by element)."""
  operand_shapes = [shapes.get(o, "") for o in op.operands]
  reads = [hlo_module.shape_bytes(s) for s in operand_shapes]
  written = hlo_module.shape_bytes(op.shape)
  write_share = hlo_module.on_chip_share(op.shape)
  # Read when called: the rules below lower `reads` first.
  on_chip_read = lambda: sum(r * hlo_module.on_chip_share(s) for r, s in zip(reads, operand_shapes))   # noqa: E731
  opcode = op.opcode
  if opcode == "slice-start":
    return 0.0, 0.0, 0.0
  if opcode == "slice-done":   # reads the source named first in the start's tuple
    source_share = hlo_module.on_chip_share(operand_shapes[0], first_only=True) if operand_shapes else 0.0
    return written, written, written * (source_share + write_share)
  if opcode.endswith("-start"):   # the done writes the result; the start's tuple repeats its operands
    return sum(reads), 0.0, on_chip_read()
  if opcode.endswith("-done"):    # its operand is the start's handle
    return 0.0, written, written * write_share
  if opcode == "custom-call" and (m := hlo_module.TARGET.search(op.attrs)) and m.group(1) in FREE_CUSTOM_CALLS:
    return 0.0, 0.0, 0.0
  if opcode in PARTIAL_READS and reads:
    reads[0] = written
  if opcode == "dynamic-update-slice" and len(reads) > 1:
    reads[0], written = 0.0, reads[1]
  written_on_chip = None
  if (fused := hlo_module.fused_ops(op, computations)) is not None:
    root = hlo_module.root_op(fused)
    target = hlo_module.TARGET.search(root.attrs).group(1) if root is not None and root.opcode == "custom-call" else ""
    if target == "AsyncCollectiveStart":   # a TPU collective: its input is read here...
      return sum(reads), 0.0, on_chip_read()
    if target == "AsyncCollectiveDone":    # ...and its result written here, once
      return 0.0, written, written * write_share
    unwritten = _fused(fused, reads, computations)
    for index, b in _passed_through(op, fused, reads).items():
      unwritten[index] = unwritten.get(index, 0.0) + b
    written -= sum(unwritten.values())
    elements = hlo_module.ARRAY.findall(op.shape)
    if write_share and len(elements) == (len(root.operands) if root is not None and root.opcode == "tuple" else 1):
      written_on_chip = sum(hlo_module.array_bytes(dtype, dims, layout) - unwritten.get(i, 0.0)
                            for i, (dtype, dims, layout) in enumerate(elements) if hlo_module.is_on_chip(layout))
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
      total += hlo_module.shape_bytes(u.shape)
      continue
    if _views_its_operand(u):   # a relayout in place: what is read is what its users read
      if (part := _partial_read(u.name, ops, computations, depth + 1)) is None:
        return None
      total += part
      continue
    inner = hlo_module.fused_ops(u, computations) if u.opcode == "fusion" else None
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
  root = hlo_module.root_op(fused)
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
      reads[int(buffer.args)] = sum(hlo_module.shape_bytes(u.shape) for u in others)   # 0 when the update is its only use
    # An update tiled coarser than its buffer (padded larger than the rows it covers there) writes no
    # more than the buffer.
    unwritten[index] = max(0.0, hlo_module.shape_bytes(out.shape) - hlo_module.shape_bytes(update.shape))
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
  root = hlo_module.root_op(fused)
  if root is None or root.opcode != "tuple":
    return {}
  elements = hlo_module.ARRAY.findall(op.shape)
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
      unwritten[int(index)] = unwritten.get(int(index), 0.0) + hlo_module.array_bytes(dtype, dims, layout)
      reads[int(operand)] = 0.0
  return unwritten


def undeclared_kernel(op: Op) -> bool:
  """A Pallas TPU kernel whose backend config declares no cost estimate: XLA's cost analysis counts it as
  moving nothing and computing nothing."""
  target = hlo_module.TARGET.search(op.attrs) if op.opcode == "custom-call" else None
  return bool(target) and target.group(1) == "tpu_custom_call" and "cost_estimate" not in op.attrs


def category(op: Op, computations: dict[str, list[Op]] | None = None) -> str:
  base = op.opcode.removesuffix("-start").removesuffix("-done")
  if op.opcode == "fusion":
    if computations and (fused := hlo_module.fused_ops(op, computations)) is not None:
      root = hlo_module.root_op(fused)
      if root is not None and root.opcode == "custom-call" and "AsyncCollective" in root.attrs:
        kind = next((o.opcode for o in fused if o.opcode in COLLECTIVES), "")
        return f"collective {kind}".strip()
    return f"fusion {m.group(1)}" if (m := _KIND.search(op.attrs)) else "fusion"
  if base in COLLECTIVES:
    return f"collective {base}"
  if base == "custom-call":
    return f"custom-call {m.group(1)}" if (m := hlo_module.TARGET.search(op.attrs)) else "custom-call"
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


def traffic(text: str) -> list[dict]:
  """Per executed op: name, category, source, shape, trips (per step), bytes (per step: per run x trips),
  on_chip_bytes (those of them in on-chip memory spaces) and undeclared_kernel (`undeclared_kernel`)."""
  entry, computations = hlo_module.parse_module(text)
  shapes = hlo_module.shapes_by_name(computations)
  rows = []
  order, runs = hlo_module.run_counts(entry, computations)
  for comp in order:
    for op in computations.get(comp, []):
      if op.opcode == "while" and hlo_module.trip_count(op, computations) is None:
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
