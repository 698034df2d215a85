"""Accelerator.profile() on CPU: options reach torch.profiler, schedules fire, Chrome traces per rank."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from drivetrain import Accelerator, ProfileKwargs
from drivetrain.errors import ConfigurationError


def test_options_are_validated():
    with pytest.raises(ConfigurationError, match="unknown activity 'gpu'; this torch knows cpu"):
        ProfileKwargs(activities=["gpu"])
    with pytest.raises(ConfigurationError, match="must be a list"):
        ProfileKwargs(activities="cpu")
    with pytest.raises(ConfigurationError, match="unknown key.*waits.*valid keys: active"):
        ProfileKwargs(schedule_option={"waits": 1, "warmup": 1, "active": 1})
    with pytest.raises(ConfigurationError, match="needs active"):
        ProfileKwargs(schedule_option={"wait": 1, "warmup": 1})
    with pytest.raises(ConfigurationError, match=r"schedule_option\['wait'\] must be an int >= 0"):
        ProfileKwargs(schedule_option={"wait": -1, "warmup": 1, "active": 1})
    with pytest.raises(ConfigurationError, match="on_trace_ready must be callable"):
        ProfileKwargs(on_trace_ready="print")
    assert ProfileKwargs(record_shapes=True, activities=["cpu"]).to_kwargs() == {
        "activities": ["cpu"],
        "record_shapes": True,
    }


def test_profile_records_shapes_flops_and_writes_trace(tmp_path):
    handler = ProfileKwargs(
        activities=["cpu"], record_shapes=True, with_flops=True, output_trace_dir=tmp_path / "t"
    )
    accelerator = Accelerator(cpu=True, kwargs_handlers=[handler])
    model = accelerator.prepare(torch.nn.Linear(16, 8))
    with accelerator.profile() as prof:
        model(torch.randn(4, 16))
    events = prof.key_averages(group_by_input_shape=True)
    addmm = [event for event in events if event.key == "aten::addmm"]
    assert addmm and addmm[0].flops == 2 * 4 * 16 * 8
    assert [4, 16] in addmm[0].input_shapes
    trace = json.loads((tmp_path / "t" / "profile_0.json").read_text())
    assert any(event.get("name") == "aten::addmm" for event in trace["traceEvents"])


def test_explicit_handler_and_schedule():
    ready = []
    handler = ProfileKwargs(
        activities=["cpu"],
        schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1},
        on_trace_ready=lambda profiler: ready.append(profiler.step_num),
    )
    accelerator = Accelerator(cpu=True)
    with accelerator.profile(handler) as prof:
        for _ in range(6):
            torch.ones(8) @ torch.ones(8)
            prof.step()
    assert ready == [4]  # one cycle: wait 1 + warmup 1 + active 2 steps, then nothing more
    with pytest.raises(TypeError, match="expects a ProfileKwargs"):
        with accelerator.profile({"record_shapes": True}):
            pass


SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from drivetrain import Accelerator, ProfileKwargs

    accelerator = Accelerator(cpu=True, kwargs_handlers=[ProfileKwargs(activities=["cpu"], output_trace_dir=sys.argv[1])])
    with accelerator.profile():
        torch.randn(8, 8) @ torch.randn(8, 8)
    accelerator.end_training()
    """
)


@pytest.mark.multiprocess
def test_chrome_trace_per_rank(tmp_path):
    from drivetrain.testing import launch_script

    script = tmp_path / "profiled_script.py"  # not profile.py: that would shadow the stdlib module
    script.write_text(SCRIPT)
    launch_script(
        str(script), num_processes=2, args=[str(tmp_path / "traces")], env={"TMPDIR": str(tmp_path)}
    )
    assert sorted(path.name for path in (tmp_path / "traces").iterdir()) == [
        "profile_0.json",
        "profile_1.json",
    ]
    for rank in (0, 1):
        trace = json.loads((tmp_path / "traces" / f"profile_{rank}.json").read_text())
        assert any(event.get("name") == "aten::mm" for event in trace["traceEvents"])
