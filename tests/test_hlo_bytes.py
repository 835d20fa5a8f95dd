"""`hlo_bytes`: the memory traffic of each executed op of a compiled step, from its HLO text."""

import re

import pytest

from bert_jax.tools import hlo_bytes
from bert_jax.tools import hlo_flops
from bert_jax.tools import hlo_module

# A module in the printed form of an optimized TPU step: a while loop of 3 trips around a fusion, an
# asynchronous all-gather, and a fusion that updates a buffer in place.
HLO = """HloModule jit_step, is_scheduled=true, entry_computation_layout={(f32[4,8]{1,0})->f32[16,8]{1,0}}

%fused_add (param_0: f32[4,8], param_1: f32[4,8]) -> f32[4,8] {
  %param_0 = f32[4,8]{1,0:T(4,8)} parameter(0)
  %param_1 = f32[4,8]{1,0:T(4,8)} parameter(1)
  ROOT %add.1 = f32[4,8]{1,0:T(4,8)} add(%param_0, %param_1), metadata={op_name="jit(step)/inner/add"}
}

%fused_update (param_0.1: f32[16,8], param_1.1: bf16[1,8], param_2: s32[]) -> f32[16,8] {
  %param_0.1 = f32[16,8]{1,0} parameter(0)
  %param_1.1 = bf16[1,8]{1,0} parameter(1)
  %convert.1 = f32[1,8]{1,0} convert(%param_1.1)
  %param_2 = s32[] parameter(2)
  %constant.1 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[16,8]{1,0} dynamic-update-slice(%param_0.1, %convert.1, %param_2, %constant.1)
}

%body (state: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %state = (s32[], f32[4,8]{1,0}) parameter(0)
  %gte.0 = s32[] get-tuple-element(%state), index=0
  %gte.1 = f32[4,8]{1,0} get-tuple-element(%state), index=1
  %fusion.1 = f32[4,8]{1,0:T(4,8)S(1)} fusion(%gte.1, %gte.1), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/encoder/layer_3/add" stack_frame_id=7}
  %one = s32[] constant(1)
  %next = s32[] add(%gte.0, %one)
  ROOT %tuple.1 = (s32[], f32[4,8]{1,0}) tuple(%next, %fusion.1)
}

%cond (state.1: (s32[], f32[4,8])) -> pred[] {
  %state.1 = (s32[], f32[4,8]{1,0}) parameter(0)
  %gte.2 = s32[] get-tuple-element(%state.1), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%gte.2, %three), direction=LT
}

ENTRY %main (a: f32[4,8], buf: f32[16,8], u: bf16[1,8], k: s32[]) -> f32[16,8] {
  %a = f32[4,8]{1,0} parameter(0), metadata={op_name="x"}
  %buf = f32[16,8]{1,0} parameter(1)
  %u = bf16[1,8]{1,0} parameter(2)
  %k = s32[] parameter(3)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4,8]{1,0}) tuple(%zero, %a)
  %while.1 = (s32[], f32[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %all-gather-start.1 = (f32[4,8]{1,0}, f32[16,8]{1,0}) all-gather-start(%a), replica_groups={{0,1,2,3}}, dimensions={0}, metadata={op_name="jit(step)/gather"}
  %all-gather-done.1 = f32[16,8]{1,0} all-gather-done(%all-gather-start.1), metadata={op_name="jit(step)/gather"}
  ROOT %fusion.2 = f32[16,8]{1,0} fusion(%buf, %u, %k), kind=kLoop, calls=%fused_update, metadata={op_name="jit(step)/update"}
}
"""


def _rows():
  return {r["name"]: r for r in hlo_bytes.traffic(HLO)}


def test_shape_bytes():
  assert hlo_module.shape_bytes("f32[4,8]{1,0:T(4,8)S(1)}") == 128
  assert hlo_module.shape_bytes("(s32[], bf16[2,3]{1,0}, pred[5])") == 4 + 12 + 5
  assert hlo_module.shape_bytes("f8e4m3fn[16]") == 16 and hlo_module.shape_bytes("s4[16]") == 8
  assert hlo_module.shape_bytes("token[]") == 0
  with pytest.raises(ValueError, match="unknown HLO element type"):
    hlo_module.shape_bytes("q7[3]")


# A fusion updating one row of a [2, 1024] buffer in place (tiles substituted by the test).
UPDATE = """HloModule m

%fused (param_0: f32[2,1024], param_1: f32[1,1024], param_2: s32[]) -> f32[2,1024] {
  %param_0 = f32[2,1024]BUFFER_LAYOUT parameter(0)
  %param_1 = f32[1,1024]UPDATE_LAYOUT parameter(1)
  %param_2 = s32[] parameter(2)
  %zero = s32[] constant(0)
  ROOT %dus = f32[2,1024]BUFFER_LAYOUT dynamic-update-slice(%param_0, %param_1, %param_2, %zero)
}

ENTRY %main (b: f32[2,1024], u: f32[1,1024], i: s32[]) -> f32[2,1024] {
  %b = f32[2,1024]BUFFER_LAYOUT parameter(0)
  %u = f32[1,1024]UPDATE_LAYOUT parameter(1)
  %i = s32[] parameter(2)
  ROOT %fusion.1 = f32[2,1024]BUFFER_LAYOUT fusion(%b, %u, %i), kind=kLoop, calls=%fused
}
"""


def test_a_tiled_layout_counts_its_padding():
  # The first tile rounds up the most minor dims in the layout's order, as a TPU stores them.
  assert hlo_module.shape_bytes("f32[4,8]{1,0:T(8,128)}") == 8 * 128 * 4
  assert hlo_module.shape_bytes("f32[4,8]{1,0}") == hlo_module.shape_bytes("f32[4,8]") == 4 * 8 * 4
  # A transposed layout: [4, 16, 8, 64] stored as [4, 16, 64, 8] (dim 2 minor): 8 -> 128, 64 stays.
  assert hlo_module.padded_dims([4, 16, 8, 64], "{2,3,1,0:T(8,128)}") == [4, 16, 64, 128]
  assert hlo_module.shape_bytes("bf16[4,16,8,64]{2,3,1,0:T(8,128)(2,1)}") == 4 * 16 * 64 * 128 * 2
  # Sizes that fill their tiles move no more than their elements; sub-tiles do not pad again.
  assert hlo_module.shape_bytes("bf16[4,128,8,64]{1,3,2,0:T(8,128)(2,1)}") == 4 * 128 * 8 * 64 * 2
  # One-dimensional tiles, a tile of more dims than the array, and a tuple's elements each padded.
  assert hlo_module.shape_bytes("f32[16]{0:T(256)}") == 256 * 4
  assert hlo_module.padded_dims([16], "{0:T(2,128)}") == [2, 128]
  assert hlo_module.shape_bytes("(f32[1,16]{1,0:T(2,128)}, s32[])") == 2 * 128 * 4 + 4
  # An in-place update at a fusion's root writes its update as stored, and never more than the buffer.
  def updated(buffer_layout, update_layout):
    text = UPDATE.replace("BUFFER_LAYOUT", buffer_layout).replace("UPDATE_LAYOUT", update_layout)
    return {r["name"]: r for r in hlo_bytes.traffic(text)}["fusion.1"]["bytes"]
  # Its row padded to 8 rows of 1024: read (the update) and written, and the index read.
  assert updated("{1,0:T(8,128)}", "{1,0:T(8,128)}") == 8 * 1024 * 4 + 8 * 1024 * 4 + 4
  # Read as stored (8 rows), written into a buffer of 2 rows: the buffer's bytes at most.
  assert updated("{1,0:T(2,128)}", "{1,0:T(8,128)}") == 8 * 1024 * 4 + 2 * 1024 * 4 + 4
  # What a copy between tilings moves: each side as stored.
  rows = {r["name"]: r for r in hlo_bytes.traffic(
      "HloModule m\n\nENTRY %main (p: f32[4,16]) -> f32[4,16] {\n"
      "  %p = f32[4,16]{1,0:T(4,128)} parameter(0)\n"
      "  ROOT %copy.1 = f32[4,16]{0,1:T(8,128)} copy(%p)\n}\n")}
  assert rows["copy.1"]["bytes"] == 4 * 128 * 4 + 16 * 128 * 4


def test_each_executed_op_moves_its_operands_and_result_once_per_trip():
  rows = _rows()
  # The loop body runs 3 times, its condition 4; a fusion counts as one op (its inner add is not counted).
  assert rows["fusion.1"]["trips"] == 3 and rows["fusion.1"]["bytes"] == 3 * (128 + 128 + 128)
  assert rows["next"]["bytes"] == 3 * 12 and rows["lt"]["trips"] == 4 and rows["lt"]["bytes"] == 4 * 9
  assert "add.1" not in rows and "convert.1" not in rows
  # Bookkeeping moves nothing: parameters, constants, tuples, the while op itself.
  assert not {"a", "zero", "init", "while.1", "gte.1", "tuple.1"} & rows.keys()
  # The asynchronous gather reads its operand at the start and writes its result at the done.
  assert rows["all-gather-start.1"]["bytes"] == 128 and rows["all-gather-done.1"]["bytes"] == 512
  assert rows["all-gather-start.1"]["category"] == rows["all-gather-done.1"]["category"] == "collective all-gather"
  # The in-place update reads the update (bf16) and the index and writes the updated row, not the buffer.
  assert rows["fusion.2"]["bytes"] == (16 + 4) + 32
  assert rows["fusion.1"]["category"] == "fusion kLoop" and rows["next"]["category"] == "add"
  assert rows["fusion.1"]["source"] == "jit(step)/encoder/layer_*/add"
  assert rows["next"]["source"] == "(add, no op_name)"


def test_summary_ranks_ops_sources_and_kinds():
  rows = hlo_bytes.traffic(HLO)
  s = hlo_bytes.summarize(rows, top=2)
  total = 3 * 384 + 36 + 36 + 128 + 512 + 52
  assert s["total_bytes"] == total and s["ops"] == len(rows) == 6
  assert [r["name"] for r in s["top_ops"]] == ["fusion.1", "all-gather-done.1"]
  assert s["top_sources"][0] == {"source": "jit(step)/encoder/layer_*/add", "bytes": 1152}
  assert s["top_sources"][1] == {"source": "jit(step)/gather", "bytes": 640}
  # Two kinds by name, the rest summed so that the kinds add up to the total.
  assert [k["category"] for k in s["by_category"]] == ["fusion kLoop", "collective all-gather", "2 other kinds"]
  assert sum(k["bytes"] for k in s["by_category"]) == total
  text = hlo_bytes.format_summary(s, xla_bytes=2e3)
  assert "over 6 ops" in text and "XLA's cost analysis: 0.000 GB" in text and "layer_*/add" in text


def test_an_attribute_over_several_lines_keeps_the_ops_after_it():
  # A Pallas kernel's `kernel_metadata` is printed over lines, some of which begin with "}" or are "}"
  # alone: the instruction goes on to where its brackets close, and the computation ends after it.
  text = ("HloModule m\n\nENTRY %main (p: f32[8,128]) -> f32[8,128] {\n"
          "  %p = f32[8,128]{1,0} parameter(0)\n"
          "  %k = f32[8,128]{1,0} custom-call(%p), custom_call_target=\"tpu_custom_call\", "
          "frontend_attributes={kernel_metadata={\n"
          "\"name\": \"kernel\",\n"
          "\"inner\": {\n"
          "\"a\": \"}\"\n"
          "}\n"
          "}}, metadata={op_name=\"pallas_call\"}\n"
          "  ROOT %negate.1 = f32[8,128]{1,0} negate(%k)\n}\n")
  entry, computations = hlo_module.parse_module(text)
  assert [op.name for op in computations[entry]] == ["p", "k", "negate.1"]
  assert 'op_name="pallas_call"' in computations[entry][1].attrs
  rows = {r["name"]: r["bytes"] for r in hlo_bytes.traffic(text)}
  assert rows == {"k": 2 * 8 * 128 * 4, "negate.1": 2 * 8 * 128 * 4}
  # A kernel that declares no cost (XLA counts it as moving nothing) is summed apart; one that does is not.
  assert hlo_bytes.summarize(hlo_bytes.traffic(text))["undeclared_kernel_bytes"] == 2 * 8 * 128 * 4
  declared = text.replace("custom_call_target=", 'backend_config="{\\"cost_estimate\\":{}}", custom_call_target=')
  assert hlo_bytes.summarize(hlo_bytes.traffic(declared))["undeclared_kernel_bytes"] == 0
  with pytest.raises(ValueError, match="does not end"):
    hlo_module.parse_module(text.rstrip().rstrip("}"))


def test_a_module_without_entry_is_refused():
  with pytest.raises(ValueError, match="no ENTRY"):
    hlo_bytes.traffic("HloModule m\n")


# Reads of part of a buffer: a slice, an asynchronous slice (a DMA), a fusion whose parameter only a
# slice uses; and a custom call that joins buffers by a bitcast.
PARTIAL = """HloModule jit_step

%fused_row (param_0.2: f32[16,8]) -> f32[1,8] {
  %param_0.2 = f32[16,8]{1,0} parameter(0)
  %slice.3 = f32[1,8]{1,0} slice(%param_0.2), slice={[3:4], [0:8]}
  ROOT %negate.1 = f32[1,8]{1,0} negate(%slice.3)
}

%fused_sum (param_0.3: f32[16,8]) -> f32[8] {
  %param_0.3 = f32[16,8]{1,0} parameter(0)
  %slice.4 = f32[1,8]{1,0} slice(%param_0.3), slice={[0:1], [0:8]}
  %bitcast.4 = f32[8]{0} bitcast(%slice.4)
  %negate.2 = f32[16,8]{1,0} negate(%param_0.3)
  ROOT %slice.5 = f32[8]{0} slice(%bitcast.4), slice={[0:8]}
}

%inner_layer (param_0.5: f32[16,8], param_1.5: s32[]) -> f32[1,8] {
  %param_0.5 = f32[16,8]{1,0} parameter(0)
  %param_1.5 = s32[] parameter(1)
  %zero.5 = s32[] constant(0)
  ROOT %dynamic-slice.5 = f32[1,8]{1,0} dynamic-slice(%param_0.5, %param_1.5, %zero.5), dynamic_slice_sizes={1,8}
}

%inner_whole (param_0.7: f32[16,8]) -> f32[16,8] {
  %param_0.7 = f32[16,8]{1,0} parameter(0)
  ROOT %negate.7 = f32[16,8]{1,0} negate(%param_0.7)
}

%fused_layer (param_0.6: s32[], param_1.6: f32[16,8]) -> f32[1,8] {
  %param_1.6 = f32[16,8]{1,0} parameter(1)
  %param_0.6 = s32[] parameter(0)
  %fusion.6 = f32[1,8]{1,0} fusion(%param_1.6, %param_0.6), kind=kLoop, calls=%inner_layer
  ROOT %negate.6 = f32[1,8]{1,0} negate(%fusion.6)
}

%fused_whole (param_0.8: f32[16,8]) -> f32[16,8] {
  %param_0.8 = f32[16,8]{1,0} parameter(0)
  ROOT %fusion.8 = f32[16,8]{1,0} fusion(%param_0.8), kind=kLoop, calls=%inner_whole
}

ENTRY %main (buf: f32[16,8], i: s32[]) -> f32[4,8] {
  %buf = f32[16,8]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %fusion.9 = f32[1,8]{1,0} fusion(%i, %buf), kind=kOutput, calls=%fused_layer
  %fusion.10 = f32[16,8]{1,0} fusion(%buf), kind=kLoop, calls=%fused_whole
  %slice-start.1 = ((f32[16,8]{1,0}), f32[4,8]{1,0:S(1)}, s32[]{:S(2)}) slice-start(%buf), slice={[0:4], [0:8]}
  %slice-done.1 = f32[4,8]{1,0:S(1)} slice-done(%slice-start.1)
  %custom-call.1 = f32[4,8]{1,0} custom-call(%slice-done.1), custom_call_target="ConcatBitcast"
  %slice.2 = f32[2,8]{1,0} slice(%buf), slice={[0:2], [0:8]}
  %fusion.3 = f32[1,8]{1,0} fusion(%buf), kind=kLoop, calls=%fused_row
  %fusion.4 = f32[8]{0} fusion(%buf), kind=kLoop, calls=%fused_sum
  ROOT %copy.1 = f32[4,8]{1,0} copy(%custom-call.1)
}
"""


def test_partial_reads_are_what_is_read():
  rows = {r["name"]: r["bytes"] for r in hlo_bytes.traffic(PARTIAL)}
  assert rows["slice-start.1"] == 0 and rows["slice-done.1"] == 128 + 128   # read and written at the done
  assert rows["custom-call.1"] == 0 and rows["copy.1"] == 128 + 128
  assert rows["slice.2"] == 64 + 64 and rows["fusion.3"] == 32 + 32
  assert rows["fusion.4"] == 512 + 32   # the parameter also feeds a negate: read whole
  # A scanned layer's fusion: a nested fusion slices this trip's row out of the stacked buffer.
  assert rows["fusion.9"] == 4 + 32 + 32
  assert rows["fusion.10"] == 512 + 512   # a nested fusion that reads it whole


# A scanned layer's saved dropout mask: the stacked pred buffer passes through a nested relayout that
# aliases it (TPU's `copy_fusion` between tilings) before the in-place update of this layer's row.
RELAYOUT = """HloModule jit_step

%copy_fusion (param_0.1: pred[24,4,128]) -> pred[24,4,128] {
  %param_0.1 = pred[24,4,128]{2,1,0:T(4,128)(4,1)} parameter(0)
  ROOT %copy.1 = pred[24,4,128]{2,1,0:T(4,128)} copy(%param_0.1)
}

%fused_mask (param_0: pred[24,4,128], param_1: s32[], param_2: f32[1,4,128]) -> pred[24,4,128] {
  %param_0 = pred[24,4,128]{2,1,0:T(4,128)(4,1)} parameter(0)
  %fusion.7 = pred[24,4,128]{2,1,0:T(4,128)} fusion(%param_0), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=%copy_fusion
  %param_2 = f32[1,4,128]{2,1,0} parameter(2)
  %half = f32[1,4,128]{2,1,0} constant({...})
  %lt = pred[1,4,128]{2,1,0} compare(%param_2, %half), direction=LT
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %dus = pred[24,4,128]{2,1,0:T(4,128)(4,1)} dynamic-update-slice(%fusion.7, %lt, %param_1, %zero, %zero)
}

%fused_copy (param_0.2: pred[24,4,128]) -> pred[24,4,128] {
  %param_0.2 = pred[24,4,128]{2,1,0} parameter(0)
  %fusion.8 = pred[24,4,128]{2,1,0} fusion(%param_0.2), kind=kLoop, calls=%copy_fusion
  %zero.2 = s32[] constant(0)
  ROOT %dus.2 = pred[24,4,128]{2,1,0} dynamic-update-slice(%fusion.8, %fusion.8, %zero.2, %zero.2, %zero.2)
}

%fused_read (param_0.3: pred[24,4,128], param_1.3: s32[]) -> pred[1,4,128] {
  %param_0.3 = pred[24,4,128]{2,1,0:T(4,128)(4,1)} parameter(0)
  %fusion.9 = pred[24,4,128]{2,1,0:T(4,128)} fusion(%param_0.3), kind=kLoop, output_to_operand_aliasing={{}: (0, {})}, calls=%copy_fusion
  %param_1.3 = s32[] parameter(1)
  %zero.3 = s32[] constant(0)
  ROOT %ds = pred[1,4,128]{2,1,0} dynamic-slice(%fusion.9, %param_1.3, %zero.3, %zero.3), dynamic_slice_sizes={1,4,128}
}

ENTRY %main (masks: pred[24,4,128], i: s32[], u: f32[1,4,128]) -> pred[24,4,128] {
  %masks = pred[24,4,128]{2,1,0:T(4,128)(4,1)} parameter(0)
  %i = s32[] parameter(1)
  %u = f32[1,4,128]{2,1,0} parameter(2)
  %fusion.2 = pred[24,4,128]{2,1,0} fusion(%masks), kind=kLoop, calls=%fused_copy
  %fusion.3 = pred[1,4,128]{2,1,0} fusion(%masks, %i), kind=kLoop, calls=%fused_read
  ROOT %fusion.1 = pred[24,4,128]{2,1,0:T(4,128)(4,1)} fusion(%masks, %i, %u), kind=kLoop, calls=%fused_mask
}
"""


def test_an_update_in_place_or_a_slice_through_an_aliasing_relayout_moves_the_slice():
  rows = {r["name"]: r["bytes"] for r in hlo_bytes.traffic(RELAYOUT)}
  # Reads the index and the uniform bits (4 + 2048), writes this layer's 512 mask bytes, not the 12,288.
  assert rows["fusion.1"] == 4 + 2048 + 512
  # A nested copy that does not alias its operand is a copy: the whole buffer is read and written.
  assert rows["fusion.2"] == 12288 + 12288
  # The backward pass reads this layer's mask back through the same relayout: the slice, not the buffer.
  assert rows["fusion.3"] == 512 + 4 + 512


def test_trip_count_from_the_loop_condition_where_xla_gives_none():
  # TPU's backend config carries no known_trip_count: the condition's `i < 3` gives it.
  without = HLO.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")
  rows = {r["name"]: r for r in hlo_bytes.traffic(without)}
  assert rows["fusion.1"]["trips"] == 3 and rows["lt"]["trips"] == 4
  assert hlo_bytes.summarize(list(rows.values()))["unknown_loops"] == 0
  # A condition that is no `i < constant`: the body once, and the summary says so.
  unknown = without.replace("compare(%gte.2, %three), direction=LT", "compare(%gte.2, %gte.2), direction=LT")
  rows = hlo_bytes.traffic(unknown)
  assert {r["name"]: r["trips"] for r in rows}["fusion.1"] == 1
  s = hlo_bytes.summarize(rows)
  assert s["unknown_loops"] == 1 and s["ops"] == 6 and "1 loop(s) of unknown trip count" in hlo_bytes.format_summary(s)


# A TPU all-gather as the compiler emits it: a start fusion, a fusion beside it that carries the
# collective's buffers through (aliased to its operands), and a done fusion.
ASYNC = """HloModule jit_step

%fused_start (p0: bf16[4,8]) -> (bf16[4,8], bf16[16,8], u32[]) {
  %p0 = bf16[4,8]{1,0} parameter(0)
  %all-gather.1 = bf16[16,8]{1,0} all-gather(%p0), channel_id=1, dimensions={0}
  ROOT %custom-call.1 = (bf16[4,8]{1,0}, bf16[16,8]{1,0}, u32[]) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%fused_beside (q0: bf16[4,8], q1: bf16[16,8], q2: u32[], q3: f32[2,8]) -> (f32[2,8], bf16[4,8], bf16[16,8], u32[]) {
  %q0 = bf16[4,8]{1,0} parameter(0)
  %q1 = bf16[16,8]{1,0} parameter(1)
  %q2 = u32[] parameter(2)
  %q3 = f32[2,8]{1,0} parameter(3)
  %neg = f32[2,8]{1,0} negate(%q3)
  ROOT %tuple.9 = (f32[2,8]{1,0}, bf16[4,8]{1,0}, bf16[16,8]{1,0}, u32[]) tuple(%neg, %q0, %q1, %q2)
}

%fused_done (r0: bf16[4,8], r1: bf16[16,8], r2: u32[]) -> bf16[16,8] {
  %r0 = bf16[4,8]{1,0} parameter(0)
  %r1 = bf16[16,8]{1,0} parameter(1)
  %r2 = u32[] parameter(2)
  %all-gather.2 = bf16[16,8]{1,0} all-gather(%r0), channel_id=1, dimensions={0}
  ROOT %custom-call.2 = bf16[16,8]{1,0} custom-call(%r0, %r1, %all-gather.2, %r2), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (w: bf16[4,8], x: f32[2,8]) -> bf16[16,8] {
  %w = bf16[4,8]{1,0} parameter(0)
  %x = f32[2,8]{1,0} parameter(1)
  %start = (bf16[4,8]{1,0}, bf16[16,8]{1,0}, u32[]) fusion(%w), kind=kCustom, output_to_operand_aliasing={{0}: (0, {})}, calls=%fused_start
  %g0 = bf16[4,8]{1,0} get-tuple-element(%start), index=0
  %g1 = bf16[16,8]{1,0} get-tuple-element(%start), index=1
  %g2 = u32[] get-tuple-element(%start), index=2
  %beside = (f32[2,8]{1,0}, bf16[4,8]{1,0}, bf16[16,8]{1,0}, u32[]) fusion(%g0, %g1, %g2, %x), kind=kOutput, output_to_operand_aliasing={{1}: (0, {}), {2}: (1, {}), {3}: (2, {})}, calls=%fused_beside
  %h0 = bf16[4,8]{1,0} get-tuple-element(%beside), index=1
  %h1 = bf16[16,8]{1,0} get-tuple-element(%beside), index=2
  %h2 = u32[] get-tuple-element(%beside), index=3
  ROOT %done = bf16[16,8]{1,0} fusion(%h0, %h1, %h2), kind=kCustom, output_to_operand_aliasing={{}: (1, {})}, calls=%fused_done
}
"""


def test_a_tpu_collective_moves_its_input_and_result_once():
  rows = {r["name"]: r for r in hlo_bytes.traffic(ASYNC)}
  assert rows["start"]["bytes"] == 64 and rows["done"]["bytes"] == 256   # read bf16[4,8], write bf16[16,8]
  assert rows["start"]["category"] == rows["done"]["category"] == "collective all-gather"
  assert rows["beside"]["bytes"] == 64 + 64 and rows["beside"]["category"] == "fusion kOutput"   # its negate only


# The TPU compiler's alternate memory (S(1)): a copy and a slice from HBM into it, a fusion there, a copy
# back out to HBM. Scalars in S(2) are its bookkeeping.
ON_CHIP = """HloModule jit_step, is_scheduled=true

%fused_add (param_0: f32[4,8], param_1: f32[4,8]) -> f32[4,8] {
  %param_0 = f32[4,8]{1,0:S(1)} parameter(0)
  %param_1 = f32[4,8]{1,0:S(1)} parameter(1)
  ROOT %add.1 = f32[4,8]{1,0:S(1)} add(%param_0, %param_1)
}

ENTRY %main (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %copy-start.1 = (f32[4,8]{1,0:T(4,8)S(1)}, f32[4,8]{1,0:T(4,8)}, u32[]{:S(2)}) copy-start(%a)
  %copy-done.1 = f32[4,8]{1,0:T(4,8)S(1)} copy-done(%copy-start.1)
  %fusion.1 = f32[4,8]{1,0:T(4,8)S(1)} fusion(%copy-done.1, %copy-done.1), kind=kLoop, calls=%fused_add
  %slice-start.1 = ((f32[4,8]{1,0}), f32[2,8]{1,0:S(1)}, s32[]{:S(2)}) slice-start(%a), slice={[0:2], [0:8]}
  %slice-done.1 = f32[2,8]{1,0:S(1)} slice-done(%slice-start.1)
  %copy.3 = f32[4,8]{1,0:S(5)} copy(%a)
  %slice.4 = f32[2,8]{1,0:S(1)} slice(%a), slice={[0:2], [0:8]}
  ROOT %copy.2 = f32[4,8]{1,0} copy(%fusion.1)
}
"""


def test_memory_spaces_from_layouts():
  assert hlo_module.memory_space("{1,0:T(8,128)(2,1)S(1)}") == 1
  assert hlo_module.memory_space("{1,0:T(8,128)}") == hlo_module.memory_space("") == 0
  assert hlo_module.on_chip_share("f32[4,8]{1,0:S(1)}") == 1.0 and hlo_module.on_chip_share("f32[4,8]{1,0}") == 0.0
  assert hlo_module.on_chip_share("f32[4,8]{1,0:S(5)}") == 0.0   # the host's memory is not on chip
  assert hlo_module.on_chip_share("(f32[4]{0:S(1)}, f32[12]{0})") == 0.25
  assert hlo_module.on_chip_share("((f32[4]{0}), f32[4]{0:S(1)})", first_only=True) == 0.0


def test_bytes_in_on_chip_memory_are_told_apart_from_those_in_hbm():
  rows = {r["name"]: r for r in hlo_bytes.traffic(ON_CHIP)}
  on_chip = {name: r["on_chip_bytes"] for name, r in rows.items()}
  # The copy in reads HBM at its start and writes on chip at its done; the fusion there moves no HBM byte.
  assert rows["copy-start.1"]["bytes"] == 128 and on_chip["copy-start.1"] == 0
  assert rows["copy-done.1"]["bytes"] == 128 and on_chip["copy-done.1"] == 128
  assert rows["fusion.1"]["bytes"] == on_chip["fusion.1"] == 3 * 128
  # The asynchronous slice reads its source in HBM and writes the slice on chip; the copy out, the reverse.
  assert rows["slice-done.1"]["bytes"] == 2 * 64 and on_chip["slice-done.1"] == 64
  assert rows["copy.2"]["bytes"] == 256 and on_chip["copy.2"] == 128
  assert rows["copy.3"]["bytes"] == 256 and on_chip["copy.3"] == 0   # HBM to the host: none on chip
  assert rows["slice.4"]["bytes"] == 2 * 64 and on_chip["slice.4"] == 64   # reads its slice of HBM
  s = hlo_bytes.summarize(list(rows.values()))
  assert s["on_chip_bytes"] == 128 + 384 + 64 + 128 + 64
  assert "in on-chip memory" in hlo_bytes.format_summary(s)
  # Without any memory space in the text, nothing is on chip; HLO's loop body has one S(1) result.
  assert hlo_bytes.summarize(hlo_bytes.traffic(HLO))["on_chip_bytes"] == 3 * 128
  assert hlo_bytes.summarize(hlo_bytes.traffic(HLO.replace("S(1)", "")))["on_chip_bytes"] == 0


_ARRAY_AND_LAYOUT = re.compile(r"(\b(?:pred|[a-z]+\d+)\[[\d,]*\])(\{[^{}]*\})?")


def _all_in(text: str, space: str) -> str:
  """`text` with every array's layout put in memory space `space` ("" for none: HBM)."""
  def put(m):
    dims, _, tiles = (m.group(2) or "{}")[1:-1].partition(":")
    tiles = re.sub(r"S\(\d+\)", "", tiles) + space
    return m.group(1) + "{" + dims + (":" + tiles if tiles else "") + "}"
  return _ARRAY_AND_LAYOUT.sub(put, text)


@pytest.mark.parametrize("module", ["HLO", "PARTIAL", "RELAYOUT", "ASYNC", "ON_CHIP"])
def test_every_op_is_all_on_chip_or_all_in_hbm_when_its_arrays_are(module):
  text = globals()[module]
  for row in hlo_bytes.traffic(_all_in(text, "S(1)")):
    assert row["on_chip_bytes"] == pytest.approx(row["bytes"]), row
  for row in hlo_bytes.traffic(_all_in(text, "")):
    assert row["on_chip_bytes"] == 0, row
  for space in ("S(5)", "S(0)"):   # the host's memory and HBM by number
    assert all(r["on_chip_bytes"] == 0 for r in hlo_bytes.traffic(_all_in(text, space)))


def test_a_fusion_beside_a_collective_and_an_update_in_place_count_each_output_where_it_is():
  # The collective's buffers on chip, the fusion's own output (the negate) in HBM: no byte on chip.
  carried = ASYNC.replace("%beside = (f32[2,8]{1,0}, bf16[4,8]{1,0}, bf16[16,8]{1,0}, u32[])",
                          "%beside = (f32[2,8]{1,0}, bf16[4,8]{1,0:S(1)}, bf16[16,8]{1,0:S(1)}, u32[]{:S(2)})")
  rows = {r["name"]: r for r in hlo_bytes.traffic(carried)}
  assert rows["beside"]["bytes"] == 128 and rows["beside"]["on_chip_bytes"] == 0
  # The reverse: the negate's output on chip, its input and the carried buffers in HBM.
  own = ASYNC.replace("%beside = (f32[2,8]{1,0},", "%beside = (f32[2,8]{1,0:S(1)},")
  rows = {r["name"]: r for r in hlo_bytes.traffic(own)}
  assert rows["beside"]["bytes"] == 128 and rows["beside"]["on_chip_bytes"] == 64
  # An update in place of a buffer on chip writes its row there (32 bytes), reading update and index in HBM.
  update = HLO.replace("ROOT %fusion.2 = f32[16,8]{1,0} fusion", "ROOT %fusion.2 = f32[16,8]{1,0:S(1)} fusion")
  rows = {r["name"]: r for r in hlo_bytes.traffic(update)}
  assert rows["fusion.2"]["bytes"] == 52 and rows["fusion.2"]["on_chip_bytes"] == 32


# Matmuls as a TPU step prints them: a dot and a convolution over a padded window (a gradient's product) in
# a loop body of 3 trips, and in the entry a batched matmul as a convolution over a dilated input.
MATMULS = """HloModule jit_step, is_scheduled=true

%fused_products (p0: f32[4,8], p1: f32[8,16], p2: f32[2,3,16,1], p3: f32[8,4,16,1]) -> (f32[4,16], f32[2,3,8,4]) {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,16]{1,0} parameter(1)
  %p2 = f32[2,3,16,1]{3,2,1,0} parameter(2)
  %p3 = f32[8,4,16,1]{3,2,1,0} parameter(3)
  %dot.1 = f32[4,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %convolution.1 = f32[2,3,8,4]{3,2,1,0} convolution(%p2, %p3), window={size=1x8 pad=0_0x7_7 rhs_reversal=0x1}, dim_labels=0bf1_1oi0->0b1f
  ROOT %t = (f32[4,16]{1,0}, f32[2,3,8,4]{3,2,1,0}) tuple(%dot.1, %convolution.1)
}

%fused_batched (q0: f32[3,2,6], q1: f32[3,6,5]) -> f32[3,2,5] {
  %q0 = f32[3,2,6]{2,1,0} parameter(0)
  %q1 = f32[3,6,5]{2,1,0} parameter(1)
  ROOT %convolution-base-dilated.1 = f32[3,2,5]{2,1,0} convolution(%q0, %q1), window={size=3 stride=2 lhs_dilate=3}, dim_labels=0bf_0io->0bf
}

%body (state: (s32[], f32[4,8], f32[8,16], f32[2,3,16,1], f32[8,4,16,1])) -> (s32[], f32[4,8], f32[8,16], f32[2,3,16,1], f32[8,4,16,1]) {
  %state = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}, f32[2,3,16,1]{3,2,1,0}, f32[8,4,16,1]{3,2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = f32[4,8]{1,0} get-tuple-element(%state), index=1
  %w = f32[8,16]{1,0} get-tuple-element(%state), index=2
  %dy = f32[2,3,16,1]{3,2,1,0} get-tuple-element(%state), index=3
  %k = f32[8,4,16,1]{3,2,1,0} get-tuple-element(%state), index=4
  %fusion.1 = (f32[4,16]{1,0}, f32[2,3,8,4]{3,2,1,0}) fusion(%x, %w, %dy, %k), kind=kOutput, calls=%fused_products
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %tuple.1 = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}, f32[2,3,16,1]{3,2,1,0}, f32[8,4,16,1]{3,2,1,0}) tuple(%next, %x, %w, %dy, %k)
}

%cond (state.1: (s32[], f32[4,8], f32[8,16], f32[2,3,16,1], f32[8,4,16,1])) -> pred[] {
  %state.1 = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}, f32[2,3,16,1]{3,2,1,0}, f32[8,4,16,1]{3,2,1,0}) parameter(0)
  %gte.2 = s32[] get-tuple-element(%state.1), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%gte.2, %three), direction=LT
}

ENTRY %main (init: (s32[], f32[4,8], f32[8,16], f32[2,3,16,1], f32[8,4,16,1]), a: f32[3,2,6], b: f32[3,6,5]) -> f32[3,2,5] {
  %init = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}, f32[2,3,16,1]{3,2,1,0}, f32[8,4,16,1]{3,2,1,0}) parameter(0)
  %a = f32[3,2,6]{2,1,0} parameter(1)
  %b = f32[3,6,5]{2,1,0} parameter(2)
  %while.1 = (s32[], f32[4,8]{1,0}, f32[8,16]{1,0}, f32[2,3,16,1]{3,2,1,0}, f32[8,4,16,1]{3,2,1,0}) while(%init), condition=%cond, body=%body
  ROOT %fusion.2 = f32[3,2,5]{2,1,0} fusion(%a, %b), kind=kOutput, calls=%fused_batched
}
"""


def test_matmul_flops_count_each_product_per_trip_and_only_the_taps_that_meet_the_input():
  # The dot: 2 x 4 x 16 outputs x 8 contracted. The padded convolution: each of its 2 x 3 x 8 x 4 outputs
  # meets one of the 8 taps (the other 7 fall on padding) and contracts 16 features. Both 3 times.
  # The batched one: 3 batches of [2, 6] x [6, 5], each output one tap of its window over the dilated input.
  loop = 2 * 4 * 16 * 8 + 2 * (2 * 3 * 8 * 4) * 16
  assert hlo_flops.matmul_flops(MATMULS) == 3 * loop + 2 * 3 * 2 * 5 * 6
