"""Operations on nested data and across processes (Accelerate's ``utils.operations``), RNG and memory helpers.

nested.py            send_to_device, recursively_apply, concatenate, find_batch_size ... on nested structures
collective.py        gather, broadcast, reduce, pad_across_processes, gather_for_metrics
torch_collectives.py the torch.distributed implementation of the contract's Collectives
random.py            seeds and RNG state
memory.py            freeing memory, find_executable_batch_size
"""

from drivetrain.operations.collective import (
    REDUCE_CHOICES,
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    copy_tensor_to_devices,
    gather,
    gather_for_metrics,
    gather_object,
    pad_across_processes,
    reduce,
    verify_across_processes,
)
from drivetrain.operations.nested import (
    ConvertOutputsToFp32,
    TensorInformation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    find_batch_size,
    find_device,
    get_data_structure,
    get_shape,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_namedtuple,
    is_tensor_information,
    is_torch_tensor,
    iter_leaves,
    listify,
    recursively_apply,
    send_to_device,
    slice_tensors,
)

__all__ = [
    "REDUCE_CHOICES",
    "ConvertOutputsToFp32",
    "DistributedOperationException",
    "TensorInformation",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_batch_size",
    "find_device",
    "gather",
    "gather_for_metrics",
    "gather_object",
    "get_data_structure",
    "get_shape",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_namedtuple",
    "is_tensor_information",
    "is_torch_tensor",
    "iter_leaves",
    "listify",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "slice_tensors",
    "verify_across_processes",
]
