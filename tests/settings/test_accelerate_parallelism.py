"""What scripts written for Accelerate observe of ParallelismConfig: the mesh's names and sizes, and its
errors (issue 17's findings of the peer suite; each test asserts what such a script observes)."""

from __future__ import annotations

import pytest


def test_parallelism_config_get_mesh_gives_names_and_sizes_in_mesh_order():
    from drivetrain import ParallelismConfig

    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2, cp_size=2)
    assert config._get_mesh() == (("dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 2))
    assert ParallelismConfig(dp_shard_size=4, cp_size=2)._get_mesh() == (("dp_shard", "cp"), (4, 2))


def test_build_device_mesh_flattens_the_configs_own_dimension_lists(monkeypatch):
    # Code that wraps torch's init_device_mesh (Accelerate's tests do) sees the config's lists as the slices.
    import torch.distributed.device_mesh as device_mesh

    from drivetrain import ParallelismConfig

    sliced: list = []

    class RecordingMesh:
        def __init__(self, shape, names):
            self.shape, self.mesh_dim_names = shape, names

        def __getitem__(self, key):
            mesh = self

            class Submesh:
                def _flatten(self, name):
                    sliced.append((key, name))
                    return mesh

            return Submesh()

    monkeypatch.setattr(
        device_mesh,
        "init_device_mesh",
        lambda device, shape, mesh_dim_names: RecordingMesh(shape, mesh_dim_names),
    )
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    mesh = config.build_device_mesh("cpu")
    assert (mesh.shape, mesh.mesh_dim_names) == ((2, 2, 2), ("dp_replicate", "dp_shard", "cp"))
    assert sliced == [
        (config.dp_dim_names, "dp"),
        (config.dp_shard_cp_dim_names, "dp_shard_cp"),
        (config.dp_cp_dim_names, "dp_cp"),
    ]
    assert sliced[0][0] == ["dp_replicate", "dp_shard"]


def test_an_invalid_cp_comm_strategy_is_named_in_accelerates_wording(monkeypatch):
    from drivetrain.utils import ParallelismConfig, TorchContextParallelConfig

    with pytest.raises(
        ValueError, match="Invalid cp_comm_strategy: ring.*choose one of: allgather, alltoall"
    ):
        TorchContextParallelConfig(cp_comm_strategy="ring")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "ring")
    with pytest.raises(ValueError, match="Invalid cp_comm_strategy: ring"):
        ParallelismConfig(cp_size=2)
