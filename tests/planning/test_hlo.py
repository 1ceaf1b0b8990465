"""Finding collectives in compiled HLO text (`planning/hlo.py`), on the printed forms XLA uses, and telling
in-slice (ICI) from cross-slice (DCN) ones for multislice meshes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from resnet_scaling.job import mesh as mesh_lib
from resnet_scaling.planning import hlo

HLO = """
HloModule jit_step, entry_computation_layout={(f32[64,10]{1,0})->f32[64,10]{1,0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

ENTRY %main (p0: f32[64,10], p1: bf16[8,16]) -> f32[64,10] {
  %p0 = f32[64,10]{1,0} parameter(0), sharding={replicated}
  %p1 = bf16[8,16]{1,0} parameter(1)
  %g = f32[10]{0} constant({...})
  %all-reduce.1 = (f32[64,10]{1,0}, f32[10]{0}) all-reduce(%p0, %g), replica_groups=[1,8]<=[8], to_apply=%add
  %all-reduce-start.2 = f32[10]{0:T(256)} all-reduce-start(%g), replica_groups={{0,1},{2,3},{4,5},{6,7}}
  %all-reduce-done.2 = f32[10]{0:T(256)} all-reduce-done(%all-reduce-start.2)
  %ar.3 = f32[10]{0} all-reduce(%g), replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, to_apply=%add
  %all-gather.4 = bf16[64,16]{1,0} all-gather(%p1), dimensions={0}, replica_groups={}
  %collective-permute.5 = bf16[8,16]{1,0} collective-permute(%p1), source_target_pairs={{0,1},{1,0}}
  ROOT %out = f32[64,10]{1,0} get-tuple-element(%all-reduce.1), index=0
}
"""


def test_finds_every_collective_with_operand_sizes_and_groups():
    found = hlo.find_collectives(HLO, num_devices=8)
    assert [(c.kind, c.name, c.num_elements, c.group_size) for c in found] == [
        ("all-reduce", "all-reduce.1", 650, 8),  # iota groups [1,8]: one group of 8
        ("all-reduce", "all-reduce-start.2", 10, 2),  # async: the -start counts, the -done does not
        ("all-reduce", "ar.3", 10, 2),  # named mesh axes: axis_1 has 2 devices
        ("all-gather", "all-gather.4", 128, 8),  # operand (8x16), not the gathered result; {} = all
        ("collective-permute", "collective-permute.5", 128, 2),
    ]
    assert found[0].operand_shapes == (("f32", (64, 10)), ("f32", (10,)))
    assert found[0].num_bytes == 650 * 4
    assert found[3].num_bytes == 128 * 2  # bfloat16


def test_summarize_totals_per_kind():
    summary = hlo.summarize(hlo.find_collectives(HLO, num_devices=8))
    assert summary["all-reduce"] == {"count": 3, "num_elements": 670, "num_bytes": 2680}
    assert summary["all-gather"]["count"] == 1 and "all-to-all" not in summary


@pytest.mark.parametrize("spec, expected_kinds", [("replicated", set()), ("sharded", {"all-reduce"})])
def test_finds_the_reduction_of_a_sharded_sum_in_a_real_program(spec, expected_kinds):
    mesh = mesh_lib.create_mesh(8)
    sharding = mesh_lib.batch_sharding(mesh) if spec == "sharded" else mesh_lib.replicated_sharding(mesh)
    fn = jax.jit(lambda x: jnp.sum(x, axis=0), in_shardings=sharding,
                 out_shardings=mesh_lib.replicated_sharding(mesh))
    found = hlo.find_collectives(fn.lower(jnp.ones((16, 5))).compile().as_text(), num_devices=8)
    assert {c.kind for c in found} == expected_kinds
    if found:
        assert found[0].num_elements == 5 and found[0].group_size == 8


def test_summarize_by_group_separates_device_groups_and_element_types():
    rows = hlo.summarize_by_group(hlo.find_collectives(HLO, num_devices=8))
    assert rows[0] == {"kind": "all-reduce", "group_size": 8, "dtype": "f32", "count": 1,
                       "num_elements": 650, "num_bytes": 2600}
    pairs = [r for r in rows if r["kind"] == "all-reduce" and r["group_size"] == 2]
    assert pairs == [{"kind": "all-reduce", "group_size": 2, "dtype": "f32", "count": 2, "num_elements": 20,
                      "num_bytes": 80}]
    assert {(r["kind"], r["dtype"]) for r in rows} >= {("all-gather", "bf16"), ("collective-permute", "bf16")}


# One slice's program of a 2-slice job as libtpu compiles it (num_partitions = the slice's 4 devices): the
# gradient is reduce-scattered in the slice, each shard all-reduced between slices by a megascale `send`
# (its `recv` and `-done`s are the same transfer), and gathered back in the slice.
_MEGASCALE = ('is_host_transfer=true, frontend_attributes={'
              '_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.1_0",_xla_megascale_reduce_operation="SUM",'
              '_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}')
_SHARD = "f32[128,8,128]{2,1,0:T(8,128)}"
MULTISLICE_HLO = "\n".join([
    "HloModule jit_train_step, is_scheduled=true, num_partitions=4, frontend_attributes={x=\"y\"}",
    "",
    "ENTRY %main (p0: f32[512,1024]) -> f32[512,1024] {",
    "  %p0 = f32[512,1024]{1,0} parameter(0)",
    "  %reduce-scatter.1 = f32[128,1024]{1,0:T(8,128)} reduce-scatter(%p0), channel_id=1, "
    "replica_groups={{0,1,2,3}}, use_global_device_ids=true, dimensions={0}, to_apply=%add",
    f"  %bitcast = {_SHARD} bitcast(%reduce-scatter.1)",
    "  %after-all = token[] after-all()",
    f"  %send = ({_SHARD}, u32[], token[]) send(%bitcast, %after-all), channel_id=2, {_MEGASCALE}",
    f"  %recv = ({_SHARD}, u32[], token[]) recv(%after-all), channel_id=1, {_MEGASCALE}",
    "  %send-done = token[] send-done(%send), channel_id=2, is_host_transfer=true",
    f"  %recv-done = ({_SHARD}, token[]) recv-done(%recv), channel_id=1, is_host_transfer=true",
    "  %host-send = (f32[2]{0}, u32[], token[]) send(%p0, %after-all), channel_id=3, is_host_transfer=true",
    "  %bitcast.1 = f32[128,1024]{1,0} bitcast(%recv-done)",
    "  ROOT %all-gather.6 = f32[512,1024]{1,0} all-gather(%bitcast.1), channel_id=1, "
    "replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true",
    "}",
])

def test_a_multislice_program_reports_its_dcn_transfers_as_cross_slice_collectives():
    assert hlo.program_num_devices(MULTISLICE_HLO) == 4 and hlo.program_num_devices(HLO) is None
    found = hlo.find_collectives(MULTISLICE_HLO, num_devices=4)
    assert [(c.kind, c.name, c.num_elements, c.group_size, c.over_dcn) for c in found] == [
        ("reduce-scatter", "reduce-scatter.1", 512 * 1024, 4, False),
        ("all-reduce", "send", 128 * 1024, 2, True),  # the DCN transfer: 1/4 of the gradient, 2 slices
        ("all-gather", "all-gather.6", 128 * 1024, 4, False),  # a plain host `send` is not a collective
    ]
    one_slice = [0, 0, 0, 0]  # The program numbers only its own slice's devices.
    assert [c.crosses_slices(one_slice) for c in found] == [False, True, False]
    assert hlo.summarize_by_slice(found, one_slice) == {
        "in-slice": {"count": 2, "num_elements": 5 * 128 * 1024, "num_bytes": 4 * 5 * 128 * 1024},
        "cross-slice": {"count": 1, "num_elements": 128 * 1024, "num_bytes": 4 * 128 * 1024}}
    rows = hlo.summarize_by_group(found, one_slice)
    assert [(r["kind"], r["slices"], r["group_size"], r["num_elements"]) for r in rows] == [
        ("reduce-scatter", "in-slice", 4, 512 * 1024), ("all-reduce", "cross-slice", 2, 128 * 1024),
        ("all-gather", "in-slice", 4, 128 * 1024)]


@pytest.mark.parametrize("groups, expected", [
    ("replica_groups={{0,1,2,3},{4,5,6,7}}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("replica_groups=[2,4]<=[8]", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("replica_groups=[2,4]<=[4,2]T(1,0)", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", ((0, 2, 4, 6), (1, 3, 5, 7))),
    ("replica_groups={}", ()),
])
def test_replica_groups_of_every_printed_form_say_whether_they_cross_slices(groups, expected):
    text = f"  %ar = f32[10]{{0}} all-reduce(%g), {groups}, to_apply=%add\n"
    (found,) = hlo.find_collectives(text, num_devices=8)
    assert found.replica_groups == expected
    two_slices = [0, 0, 0, 0, 1, 1, 1, 1]
    # Consecutive devices 0-3 and 4-7 are the two slices; {} is one group of every device.
    assert found.crosses_slices(two_slices) == (expected != ((0, 1, 2, 3), (4, 5, 6, 7)))
    assert not found.crosses_slices([0] * 8)


def test_two_pretend_slices_on_cpu_separate_in_slice_from_cross_slice_reductions():
    """On the ("dcn", "data") mesh of 8 CPU devices, a sum over the whole batch all-reduces across both
    slices, and a sum per slice (what a batch-norm group inside a slice does) stays in each slice."""
    mesh = mesh_lib.create_mesh(num_slices=2)
    batch, replicated = mesh_lib.batch_sharding(mesh), mesh_lib.replicated_sharding(mesh)
    per_slice = NamedSharding(mesh, PartitionSpec("dcn"))
    whole = jax.jit(lambda x: jnp.sum(x, axis=0), in_shardings=batch, out_shardings=replicated)
    by_slice = jax.jit(lambda x: jnp.sum(x.reshape(2, 8, 5), axis=1), in_shardings=batch,
                       out_shardings=per_slice)
    slices = mesh_lib.device_slices(mesh)
    for fn, where in ((whole, "cross-slice"), (by_slice, "in-slice")):
        found = hlo.find_collectives(fn.lower(jnp.ones((16, 5))).compile().as_text(), num_devices=8)
        summary = hlo.summarize_by_slice(found, slices)
        assert summary[where] == {"count": 1, "num_elements": 5, "num_bytes": 20}, summary


def test_matmul_flops_counts_convolutions_and_dots_by_their_shapes():
    """By hand: a 3x3 convolution of 4 into 8 channels onto 2 x 5 x 5 outputs is 2 * 400 * 36 FLOPs; its
    input's gradient through stride 2 (`lhs_dilate=2x2`) sums over a quarter of the window's taps; a dot
    of [6, 10] by [10, 3] is 2 * 18 * 10. Elementwise operations do not count; operands are found by name
    however the printer writes them."""
    text = """
HloModule m
ENTRY main {
  x = f32[2,7,7,4]{3,2,1,0} parameter(0)
  %w = f32[3,3,4,8]{3,2,1,0} parameter(1)
  y = f32[2,5,5,8]{3,2,1,0} convolution(x, %w), window={size=3x3}, dim_labels=b01f_01io->b01f
  g = f32[2,9,9,4]{3,2,1,0} convolution(f32[2,5,5,8]{3,2,1,0} y, f32[3,3,4,8]{3,2,1,0} %w), GRADIENT_WINDOW
  a = f32[6,10]{1,0} parameter(2)
  b = f32[10,3]{1,0} parameter(3)
  d = f32[6,3]{1,0} dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT s = f32[6,3]{1,0} add(d, d)
}
""".replace("GRADIENT_WINDOW", "window={size=3x3 pad=2_2x2_2 lhs_dilate=2x2}, dim_labels=b01f_01oi->b01f")
    forward = 2 * (2 * 5 * 5 * 8) * (3 * 3 * 4)
    input_gradient = 2 * (2 * 9 * 9 * 4) * (3 * 3 * 8) / 4
    assert hlo.matmul_flops(text) == forward + input_gradient + 2 * (6 * 3) * 10


def test_matmul_flops_of_a_lowered_convolution_equal_numpys_multiply_adds():
    """A real lowered module (JAX's printer): a convolution and a dense layer, counted by hand."""
    x = jax.ShapeDtypeStruct((4, 8, 8, 3), jnp.float32)
    w = jax.ShapeDtypeStruct((3, 3, 3, 16), jnp.float32)
    d = jax.ShapeDtypeStruct((16, 10), jnp.float32)

    def f(x, w, d):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y.mean(axis=(1, 2)) @ d

    text = jax.jit(f).lower(x, w, d).as_text(dialect="hlo")
    # Each of 4 x 6 x 6 x 16 outputs sums 3 x 3 x 3 products; each of 4 x 10 logits, 16.
    assert hlo.matmul_flops(text) == 2 * (4 * 6 * 6 * 16 * 27 + 4 * 10 * 16)
