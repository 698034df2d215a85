"""Accelerate's tensor-level model helpers (``accelerate.utils.modeling``) with Accelerate's signatures:
moving one parameter or buffer of a module to a device, sizes and file-size strings, tied parameters, the
reference's device-map clean-up, reading a checkpoint file into a state dict and reading the state dict of a
model with offloaded weights.

drivetrain's own planning (``device_map.py``, ``sizes.py``) keeps its interfaces; these are what scripts written
for Accelerate call.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from drivetrain.logging import get_logger

logger = get_logger(__name__)

#: 8-bit float dtypes torch may define (one byte per element).
_ONE_BYTE_FLOATS = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
#: Tensor subclasses of quantization libraries that carry their own state and are rebuilt as they are.
_QUANTIZED_PARAMETERS = ("Int8Params", "FP4Params", "Params4bit")
_INTEGER_PREFIXES = ("torch.uint", "torch.int", "torch.bool")


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """Whether two devices are the same, ``cuda`` and ``cuda:0`` counting as one (torch says they differ)."""
    if first_device.type != second_device.type:
        return False
    if first_device.type == "cpu":
        return True
    return (first_device.index or 0) == (second_device.index or 0)


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in ``size``: an int as it is, or a string with a unit: ``"5GiB"`` (binary), ``"5GB"`` (decimal),
    ``"5Gb"`` (decimal bits, an eighth of the bytes); raises ValueError otherwise."""
    message = f"size {size!r} is not in a valid format: use an integer for bytes, or a string with a unit (like '5.0GB')"
    if isinstance(size, int):
        if size < 0:
            raise ValueError(message)
        return size
    binary = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10}
    decimal = {"GB": 10**9, "MB": 10**6, "KB": 10**3}
    size_in_bytes = -1
    try:
        upper = size.upper()
        for unit, factor in binary.items():
            if upper.endswith(unit):
                size_in_bytes = int(float(size[:-3]) * factor)
                break
        else:
            for unit, factor in decimal.items():
                if upper.endswith(unit):
                    value = int(float(size[:-2]) * factor)
                    size_in_bytes = value // 8 if size.endswith("b") else value
                    break
    except ValueError:
        raise ValueError(message) from None
    if size_in_bytes < 0:
        raise ValueError(message)
    return size_in_bytes


def dtype_byte_size(dtype: Any) -> float:
    """Bytes one element of ``dtype`` takes: 1/8 for bool, 1 for the 8-bit floats, else the bit width over 8
    (Accelerate's ``CustomDtype`` values count as their widths)."""
    if dtype == torch.bool:
        return 1 / 8
    from drivetrain.config.enums import CustomDtype

    if isinstance(dtype, CustomDtype):  # members in order: the 8-bit float, int4, int2
        return dict(zip(CustomDtype, (1, 1 / 2, 1 / 4), strict=True))[dtype]
    if any(dtype == getattr(torch, name, None) for name in _ONE_BYTE_FLOATS):
        return 1
    bits = re.search(r"[^\d](\d+)$", str(dtype))
    if bits is None:
        raise ValueError(f"dtype is not a valid dtype: {dtype}")
    return int(bits.group(1)) // 8


def id_tensor_storage(tensor: torch.Tensor) -> tuple[torch.device, int, int]:
    """``(device, storage address, storage bytes)``: equal for tensors sharing storage (all meta tensors are
    equal)."""
    try:
        storage = tensor.untyped_storage()
        return tensor.device, storage.data_ptr(), storage.nbytes()
    except (NotImplementedError, RuntimeError):  # tensor subclasses without a storage
        return tensor.device, 0, tensor.nelement() * tensor.element_size()


def _device_from_index(device: Any) -> Any:
    """An integer device means the machine's accelerator of that index (``cuda:0``...)."""
    if isinstance(device, int):
        accelerator = getattr(torch, "accelerator", None)
        current = (
            accelerator.current_accelerator()
            if accelerator is not None and accelerator.is_available()
            else None
        )
        if current is not None and current.type != "cuda":
            return f"{current.type}:{device}"
    return device


def _clear_cache() -> None:
    from drivetrain.operations.memory import empty_device_cache

    empty_device_cache()


def set_module_tensor_to_device(
    module: nn.Module,
    tensor_name: str,
    device: int | str | torch.device,
    value: torch.Tensor | None = None,
    dtype: str | torch.dtype | None = None,
    fp16_statistics: torch.Tensor | None = None,
    tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
    non_blocking: bool = False,
    clear_cache: bool = True,
) -> None:
    """Put the parameter or buffer ``tensor_name`` (dotted) of ``module`` on ``device``, in place of the old one
    (``param.to(device)`` alone would make a tensor the module does not hold).

    ``value`` replaces the data (needed to leave the meta device; same shape, cast to the old dtype unless
    ``dtype`` is given, which integer values ignore). ``tied_params_map`` (data address -> device -> tensor)
    lets tied weights share one copy per device: a tensor already dispatched there is reused, a new one is
    recorded. A parameter keeps its class and ``requires_grad``.
    """
    owner = module
    *path, name = tensor_name.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            raise ValueError(f"{module.__class__.__name__} has no submodule {part!r} (in {tensor_name!r})")
    if name not in owner._parameters and name not in owner._buffers:
        raise ValueError(f"{owner} does not have a parameter or a buffer named {name}.")
    is_buffer = name in owner._buffers
    old_value = getattr(owner, name)
    for source in (value, old_value):
        if source is not None and tied_params_map is not None:
            shared = tied_params_map.get(source.data_ptr(), {})
            if device in shared:
                owner._parameters[name] = shared[device]
                return
    if old_value.device.type == "meta" and str(device) != "meta" and value is None:
        raise ValueError(f"{tensor_name} is on the meta device, we need a `value` to put in on {device}.")
    parameter = owner._parameters.get(name)
    parameter_class = type(parameter)
    if value is not None:
        if old_value.shape != value.shape and parameter_class.__name__ != "Params4bit":
            raise ValueError(
                f'Trying to set a tensor of shape {value.shape} in "{name}" (which has shape '
                f"{old_value.shape}), this looks incorrect."
            )
        if dtype is None:
            value = value.to(old_value.dtype, non_blocking=non_blocking)
        elif not str(value.dtype).startswith(_INTEGER_PREFIXES):
            value = value.to(dtype, non_blocking=non_blocking)
    device = _device_from_index(device)
    with torch.no_grad():
        if value is None:
            new_value = old_value.to(device, non_blocking=non_blocking)
            if (
                dtype is not None
                and str(device) == "meta"
                and not str(old_value.dtype).startswith(_INTEGER_PREFIXES)
            ):
                new_value = new_value.to(dtype, non_blocking=non_blocking)
                if not is_buffer:
                    owner._parameters[name] = parameter_class(
                        new_value, requires_grad=old_value.requires_grad
                    )
        elif isinstance(value, torch.Tensor):
            new_value = value.to(device, non_blocking=non_blocking)
        else:
            new_value = torch.tensor(value, device=device)
        if is_buffer:
            owner._buffers[name] = new_value
        elif value is not None or not check_device_same(torch.device(device), owner._parameters[name].device):
            current = owner._parameters[name]
            current_class = type(current)
            extra = {key: item for key, item in current.__dict__.items() if key != "_is_hf_initialized"}
            if current_class.__name__ in _QUANTIZED_PARAMETERS:
                new_value = current_class(new_value, requires_grad=old_value.requires_grad, **extra).to(
                    device
                )
            elif current_class is nn.Parameter or issubclass(current_class, nn.Parameter):
                new_value = current_class(new_value, requires_grad=old_value.requires_grad).to(
                    device, non_blocking=non_blocking
                )
            else:  # tensor subclasses of quantization libraries move as they are
                new_value = new_value.to(device, non_blocking=non_blocking)
            if "_is_hf_initialized" in current.__dict__:
                new_value._is_hf_initialized = current.__dict__["_is_hf_initialized"]
            owner._parameters[name] = new_value
            if fp16_statistics is not None:
                owner._parameters[name].SCB = fp16_statistics.to(device, non_blocking=non_blocking)
    if clear_cache and str(device) not in ("cpu", "meta"):
        _clear_cache()
    if tied_params_map is not None:
        for source in (old_value, value):
            if source is not None and source.data_ptr() in tied_params_map:
                tied_params_map[source.data_ptr()].setdefault(device, new_value)
                break


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers of ``module`` registered with ``persistent=False`` (left out of its state dict);
    with ``recurse``, those of its submodules too (qualified names with ``fqns``)."""
    found = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, submodule in module.named_modules():
            if fqns:
                found |= {
                    f"{prefix}.{buffer}" if prefix else buffer
                    for buffer in submodule._non_persistent_buffers_set
                }
            else:
                found |= submodule._non_persistent_buffers_set
    return found


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters then (with ``include_buffers``) buffers of ``module``, non-persistent buffers left out with
    ``remove_non_persistent``."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skipped = get_non_persistent_buffers(module, recurse=recurse) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skipped:
                yield name, buffer


def check_tied_parameters_in_config(model: nn.Module) -> bool:
    """Whether a transformers model's configuration ties weights (word embeddings, encoder and decoder, or a
    module with its own ``_tie_weights``); False for other models."""
    if "PreTrainedModel" not in [cls.__name__ for cls in inspect.getmro(type(model))]:
        return False
    config = getattr(model, "config", None)
    decoder = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    word_embeddings = bool(
        decoder is not None
        and getattr(decoder, "tie_word_embeddings", False)
        and model.get_output_embeddings()
    )
    encoder_decoder = bool(
        getattr(config, "is_encoder_decoder", False) and getattr(config, "tie_encoder_decoder", False)
    )
    return word_embeddings or encoder_decoder or any(hasattr(sub, "_tie_weights") for sub in model.modules())


def _device_in_map(name: str, device_map: dict[str, Any]) -> Any:
    while name not in device_map:
        if "." not in name:
            raise ValueError(f"The `device_map` does not contain the module {name}.")
        name = name.rpartition(".")[0]
    return device_map[name]


def check_tied_parameters_on_same_device(tied_params: list[list[str]], device_map: dict[str, Any]) -> None:
    """Warns for each group of tied parameters the map puts on more than one device."""
    for group in tied_params:
        devices = {name: _device_in_map(name, device_map) for name in group}
        if len(set(devices.values())) > 1:
            logger.warning(
                f"Tied parameters are on different devices: {devices}. "
                "Please modify your custom device map or set `device_map='auto'`. "
            )


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every name of each group point at the same parameter again (the first of the group, when it is
    not on the meta device), after loading broke the ties."""
    for group in tied_params:
        owners = []
        for name in group:
            owner = model
            *path, attribute = name.split(".")
            for part in path:
                owner = getattr(owner, part)
            owners.append((owner, attribute))
        first_owner, first_attribute = owners[0]
        shared = getattr(first_owner, first_attribute)
        if shared.device.type == "meta":
            continue
        for owner, attribute in owners:
            setattr(owner, attribute, shared)


def _as_dtype(dtype: Any) -> Any:
    return getattr(torch, dtype.replace("torch.", "")) if isinstance(dtype, str) else dtype


def compute_module_sizes(
    model: nn.Module,
    dtype: str | torch.dtype | None = None,
    special_dtypes: dict[str, str | torch.dtype] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every module and tensor of ``model`` by dotted name, ``""`` being the whole model. Floating
    tensors count at ``dtype`` when that is smaller (integers never change); ``special_dtypes`` sets the dtype of
    some tensors by name."""
    dtype = _as_dtype(dtype)
    special = {key: _as_dtype(value) for key, value in (special_dtypes or {}).items()}
    sizes: dict[str, int] = defaultdict(int)
    tensors = model.named_buffers(recurse=True) if buffers_only else named_module_tensors(model, recurse=True)
    for name, tensor in tensors:
        if name in special:
            per_element = dtype_byte_size(special[name])
        elif dtype is None or str(tensor.dtype).startswith(_INTEGER_PREFIXES):
            per_element = dtype_byte_size(tensor.dtype)
        else:
            per_element = min(dtype_byte_size(dtype), dtype_byte_size(tensor.dtype))
        size = tensor.numel() * per_element
        parts = name.split(".")
        for index in range(len(parts) + 1):
            sizes[".".join(parts[:index])] += size
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module, dtype: str | torch.dtype | None = None, special_dtypes: dict[str, Any] | None = None
) -> int:
    """Bytes of all the buffers of ``model``."""
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get(
        "", 0
    )


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]], module_sizes: dict[str, int], no_split_module_classes: list[str]
) -> tuple[int, list[str]]:
    """``(size, names)`` of the largest layers among ``modules``: a layer is a module without children, a
    module of a class in ``no_split_module_classes``, or a bare tensor."""
    largest, names = 0, []
    pending = list(modules)
    while pending:
        name, item = pending.pop(0)
        children = list(item.named_children()) if isinstance(item, nn.Module) else []
        if not children or type(item).__name__ in no_split_module_classes:
            size = module_sizes[name]
            if size > largest:
                largest, names = size, [name]
            elif size == largest:
                names.append(name)
        else:
            pending = [(f"{name}.{child}", module) for child, module in children] + pending
    return largest, names


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """``(total bytes, (largest layer bytes, its names))`` of ``model``."""
    sizes = compute_module_sizes(model)
    no_split = getattr(model, "_no_split_modules", None) or []
    top_level = [
        *model.named_parameters(recurse=False),
        *model.named_children(),
        *model.named_buffers(recurse=False),
    ]
    return sizes[""], get_max_layer_size(top_level, sizes, no_split)


def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """Accelerate's clean-up, in place: where every entry under ``module_name`` has one device, they become one
    entry for ``module_name``; then the same for each child, recursively."""
    prefix = f"{module_name}." if module_name else ""
    values = [value for key, value in device_map.items() if key.startswith(prefix)]
    if len(values) > 1 and len(set(values)) == 1:
        for key in [key for key in device_map if key.startswith(prefix)]:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {
        ".".join(key.split(".")[:depth])
        for key in device_map
        if key.startswith(prefix) and len(key) > len(module_name)
    }
    for child in children:
        clean_device_map(device_map, module_name=child)
    return device_map


def get_module_leaves(module_sizes: dict[str, int]) -> list[str]:
    """Names in ``module_sizes`` with no child in it (the whole model, ``""``, excluded)."""
    parents = {name.rsplit(".", 1)[0] for name in module_sizes if name and "." in name}
    return [name for name in module_sizes if name and name not in parents]


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: dict[str, int],
    modules_to_treat: list[tuple[str, Any]],
) -> tuple[int, list[str], list[Any]]:
    """The size of a module placed together with the modules its tied parameters live in (a tied parameter
    counted once), and those modules' names and objects."""
    if not tied_params:
        return module_size, [], []
    names, modules = [], []
    for parameter in tied_params:
        name, module = next((n, m) for n, m in modules_to_treat if parameter.startswith(n + "."))
        names.append(name)
        modules.append(module)
    total = module_size + sum(
        module_sizes[name] - module_sizes[parameter] for parameter, name in zip(tied_params, names)
    )
    return total, names, modules


def load_state_dict(
    checkpoint_file: str, device_map: dict[str, Any] | None = None
) -> dict[str, torch.Tensor]:
    """The tensors of one checkpoint file. A safetensors file must have been saved from torch (``format: pt``
    in its metadata; missing metadata is taken as torch's, with a warning); with ``device_map`` each tensor is
    read straight onto the device its module is mapped to (``"disk"`` and unmapped ones onto the CPU). Other
    files load with ``torch.load(weights_only=True)`` onto the CPU."""
    if not str(checkpoint_file).endswith(".safetensors"):
        return torch.load(checkpoint_file, map_location=torch.device("cpu"), weights_only=True)
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(checkpoint_file, framework="pt") as handle:
        metadata = handle.metadata()
        keys = list(handle.keys())
    if metadata is None:
        logger.warning(
            f"The safetensors archive passed at {checkpoint_file} does not contain metadata. "
            "Make sure to save your model with the `save_pretrained` method. Defaulting to 'pt' metadata."
        )
        metadata = {"format": "pt"}
    file_format = metadata.get("format")
    if file_format not in ("pt", "tf", "flax"):
        raise OSError(
            f"The safetensors archive passed at {checkpoint_file} does not contain the valid metadata. Make sure "
            "you save your model with the `save_pretrained` method."
        )
    if file_format != "pt":
        raise ValueError(f"The checkpoint passed was saved with {file_format}, we need a the pt format.")
    if device_map is None:
        return load_file(checkpoint_file)
    if len(set(device_map.values())) == 1:
        return load_file(checkpoint_file, device=_device_from_index(next(iter(device_map.values()))))
    devices = [device for device in dict.fromkeys(device_map.values()) if device != "disk"]
    if "cpu" not in devices:
        devices.append("cpu")
    placed: dict[Any, list[str]] = {device: [] for device in devices}
    for module_name, device in device_map.items():
        if device in placed:
            placed[device] += [key for key in keys if key == module_name or key.startswith(module_name + ".")]
    assigned = {key for group in placed.values() for key in group}
    placed["cpu"] += [key for key in keys if key not in assigned]
    tensors = {}
    for device, names in placed.items():
        with safe_open(checkpoint_file, framework="pt", device=_device_from_index(device)) as handle:
            for key in names:
                tensors[key] = handle.get_tensor(key)
    return tensors


def _aligned(module: nn.Module, device: Any) -> Any:
    """The offload plugin's ``align_module_device`` (weights of an offloaded module brought in for the block),
    or nothing to do when no weight of ``module`` is offloaded."""
    if not any(hasattr(sub, "_hf_hook") for sub in module.modules()):
        return contextlib.nullcontext()
    from drivetrain.contract.reexport import plugin_name

    return plugin_name("align_module_device", None, __name__)(module, device)


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of a model whose weights are partly offloaded (to the CPU or disk), every tensor on the
    CPU; raises MemoryError when a module does not fit there. Tensors still on the meta device are left out, with
    a warning naming them."""
    state_dict: dict[str, torch.Tensor] = {}
    on_meta = set()
    for name, module in model.named_modules():
        if not name:
            continue
        try:
            with _aligned(module, "cpu"):
                module_state = module.state_dict()
        except MemoryError:
            raise MemoryError("Offloaded module must fit in CPU memory to call save_model!") from None
        for key, tensor in module_state.items():
            if tensor.device.type == "meta":
                on_meta.add(f"{name}.{key}")
            else:
                state_dict[f"{name}.{key}"] = tensor.to("cpu")
    missing = on_meta - set(state_dict)
    if missing:
        logger.warning(
            f"The following tensors were not saved because they were still on meta device: {missing}"
        )
    return state_dict


def get_state_dict_from_offload(
    module: nn.Module,
    module_name: str,
    state_dict: dict[str, Any],
    device_to_put_offload: int | str | torch.device = "cpu",
) -> dict[str, Any]:
    """Fill ``state_dict``'s entries for ``module`` (``module_name`` names one of its tensors) with its weights,
    brought onto ``device_to_put_offload`` when they are offloaded."""
    root = module_name[: module_name.rfind(".")]
    with _aligned(module, device_to_put_offload):
        for key, tensor in module.state_dict().items():
            if f"{root}.{key}" in state_dict:
                state_dict[f"{root}.{key}"] = tensor
    return state_dict


def load_offloaded_weights(
    model: nn.Module, index: dict[str, dict[str, Any]] | None, offload_folder: str
) -> None:
    """Load the weights offloaded to ``offload_folder`` (``.dat`` files, see ``offload_weight``) into ``model``
    on the CPU; 8-bit statistics (``SCB`` entries) go with their weight."""
    import os

    from drivetrain.big_modeling.memmap_offload import load_offloaded_weight

    for name, info in (index or {}).items():
        if "SCB" in name:
            continue
        statistics_name = name.replace("weight", "SCB")
        statistics = None
        if "weight" in name and statistics_name in index:
            statistics = load_offloaded_weight(
                os.path.join(offload_folder, f"{statistics_name}.dat"), index[statistics_name]
            )
        weight = load_offloaded_weight(os.path.join(offload_folder, f"{name}.dat"), info)
        set_module_tensor_to_device(model, name, "cpu", value=weight, fp16_statistics=statistics)


def get_mixed_precision_context_manager(native_amp: bool = False, autocast_kwargs: Any = None) -> Any:
    """The autocast context of the current state's mixed precision (fp16 -> float16, bf16 -> bfloat16, a
    plugin's precision -> the ``autocast_dtype`` its precision plugin declares: bfloat16 for fp8), or a context
    that does nothing without ``native_amp``."""
    if not native_amp:
        return contextlib.nullcontext()
    from drivetrain.state import AcceleratorState

    state = AcceleratorState()
    kwargs = autocast_kwargs.to_kwargs() if autocast_kwargs is not None else {}
    precision = str(state.mixed_precision)
    device_type = state.device.type
    if precision == "fp16":
        return torch.autocast(device_type=device_type, dtype=torch.float16, **kwargs)
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16, **kwargs)
    dtype = _declared_autocast_dtype(precision)
    if dtype is not None:
        return torch.autocast(device_type=device_type, dtype=dtype, **kwargs)
    return torch.autocast(device_type=device_type, **kwargs)


def _declared_autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype the precision plugin providing ``precision`` declares for autocast (``PluginInfo.autocast_dtype``),
    None for the built-in precisions and a plugin that declares none. Raises a PluginError naming what to install
    when no installed plugin provides ``precision``."""
    from drivetrain.contract.registry import get_plugin_registry
    from drivetrain.contract.selection import precision_plugin

    registry = get_plugin_registry()
    plugin = precision_plugin(registry, precision)
    name = registry.info(plugin).autocast_dtype if plugin is not None else None
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        from drivetrain.errors import PluginError

        raise PluginError(
            f"plugin {plugin!r}: PluginInfo.autocast_dtype={name!r} is not a floating torch dtype (e.g. 'bfloat16')"
        )
    return dtype


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> Any:
    """The gradient scaler for fp16 on the machine's accelerator (``cuda`` when there is none); for a
    distributed type answered by a backend that declares its own (``PluginInfo.grad_scaler``: torch's sharded
    scaler for FSDP), that one. A distributed type of a backend that is not installed raises a PluginError
    naming the distribution to install."""
    if distributed_type is not None:
        scaler = _declared_grad_scaler(str(getattr(distributed_type, "value", distributed_type)))
        if scaler is not None:
            import importlib

            module, _, attribute = scaler.partition(":")
            return getattr(importlib.import_module(module), attribute)(**kwargs)
    accelerator = getattr(torch, "accelerator", None)
    current = (
        accelerator.current_accelerator() if accelerator is not None and accelerator.is_available() else None
    )
    return torch.amp.GradScaler(current.type if current is not None else "cuda", **kwargs)


def _declared_grad_scaler(distributed_type: str) -> str | None:
    """The ``module:attribute`` of the gradient scaler the backend answering ``distributed_type`` declares, or
    None (no declaration, or a type that names no backend)."""
    from drivetrain.compat.install_hints import ACCELERATE_DISTRIBUTED_TYPES
    from drivetrain.contract.registry import get_plugin_registry
    from drivetrain.errors import PluginError

    registry = get_plugin_registry()
    backend = registry.find_plugin(kind="backend", distributed_type=distributed_type)
    if backend is not None:
        return registry.info(backend).grad_scaler
    distribution = ACCELERATE_DISTRIBUTED_TYPES.get(distributed_type)
    installed = {record.distribution for record in registry.discovered().values()}
    if distribution is not None and distribution not in installed:
        # Which scaler it takes is the backend's declaration; without the plugin there is no answer to give.
        raise PluginError(
            f"get_grad_scaler(distributed_type={distributed_type}): no installed backend plugin answers "
            f"DistributedType.{distributed_type}; install it with: pip install {distribution}"
        )
    return None
