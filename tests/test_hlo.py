"""Finding collectives in compiled HLO text (`resnet_scaling.hlo`), on the printed forms XLA uses."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from resnet_scaling import hlo
from resnet_scaling import mesh as mesh_lib

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
