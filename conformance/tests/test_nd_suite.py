"""The N-D part of the conformance suite (nd_suite.py): the fsdp backend keeps every property on each layout
of 2 processes (dp_shard, dp_replicate, tp, cp), and ddp, which declares only dp_replicate, keeps them there
and refuses a dimension it does not declare."""

from __future__ import annotations

import pytest

from drivetrain.contract.registry import get_plugin_registry
from drivetrain_conformance.nd_suite import ND_PROPERTIES, layouts, run_nd_suite
from drivetrain_conformance.runner import NOT_APPLICABLE, PASS


def test_layouts_follow_the_declared_dimensions():
    manager = get_plugin_registry()
    fsdp, ddp, local = manager.info("fsdp"), manager.info("ddp"), manager.info("local")
    assert layouts(fsdp, 2) == [
        {"dp_replicate_size": 2},
        {"dp_shard_size": 2},
        {"cp_size": 2},
        {"tp_size": 2},
    ]
    assert {"dp_shard_size": 2, "tp_size": 2} in layouts(fsdp, 4) and len(layouts(fsdp, 4)) == 10
    assert layouts(ddp, 2) == [{"dp_replicate_size": 2}]
    report = run_nd_suite("local", local, processes=2)
    assert {verdict.status for verdict in report.verdicts} == {NOT_APPLICABLE}
    assert len(report.verdicts) == len(ND_PROPERTIES)


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["fsdp", "ddp"])
def test_backends_keep_the_nd_properties(backend):
    report = run_nd_suite(backend, get_plugin_registry().info(backend), processes=2)
    print(report.format())
    assert report.ok, report.format()
    statuses = {verdict.property: verdict.status for verdict in report.verdicts}
    if backend == "ddp":
        assert statuses["nd_undeclared_dimension_refused"] == PASS
        assert statuses["nd_training_matches_local[dp_replicate=2]"] == PASS
    else:
        assert all(
            statuses[f"nd_training_matches_local[{name}=2]"] == PASS for name in ("dp_shard", "tp", "cp")
        )
