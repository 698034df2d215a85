"""Big-model loading: for offloading plugins (safetensors records mapped from disk, offload folders, device
maps) and for quantization plugins (build on the meta device, size, map, load, place)."""

from __future__ import annotations

from drivetrain.big_modeling import (
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_in_model,
)
from drivetrain.big_modeling.device_map import (
    device_for,
    find_tied_parameters,
    normalize_device,
    resolve_device_map,
)
from drivetrain.big_modeling.memmap_offload import offload_weight
from drivetrain.big_modeling.offload_index import (
    INDEX_FILE,
    load_offload_index,
    save_offload_index,
    write_offloaded_weights,
)
from drivetrain.big_modeling.tensors import set_module_tensor_to_device
from drivetrain.config.enums import CustomDtype
from drivetrain.safetensors_reader import TensorRecord, can_map, map_tensor, populate, read_header

__all__ = [
    # for offloading plugins
    "TensorRecord",
    "read_header",
    "can_map",
    "map_tensor",
    "populate",
    "INDEX_FILE",
    "load_offload_index",
    "save_offload_index",
    "write_offloaded_weights",
    "device_for",
    "find_tied_parameters",
    "normalize_device",
    # for quantization plugins: build on meta, size, map, load, place
    "CustomDtype",
    "init_empty_weights",
    "infer_auto_device_map",
    "resolve_device_map",
    "load_checkpoint_in_model",
    "dispatch_model",
    "set_module_tensor_to_device",
    "offload_weight",
]
