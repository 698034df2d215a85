"""Quantizing a model's linear layers with bitsandbytes: Accelerate's ``accelerate.utils.bnb`` functions.

``load_and_quantize_model`` takes either a model with its weights (its ``torch.nn.Linear`` layers are replaced by
bitsandbytes layers holding the same weights, quantized when they reach their device) or a model built on the
meta device plus ``weights_location`` (the checkpoint is read straight into the bitsandbytes layers, then placed
as a device map says). bitsandbytes quantizes a weight when it moves to a device, which its CPU backend does as
well as CUDA and XPU: without a GPU, the model is quantized and run on the CPU (Accelerate requires a GPU).

bitsandbytes is imported on first use only: its import probes every accelerator runtime.
"""

from __future__ import annotations

import importlib.metadata as importlib_metadata
import logging
import os
from collections.abc import Iterable
from typing import Any, cast

import torch

from drivetrain.plugin_api.big_model import (
    device_for,
    dispatch_model,
    find_tied_parameters,
    init_empty_weights,
    load_checkpoint_in_model,
    normalize_device,
    offload_weight,
    resolve_device_map,
    set_module_tensor_to_device,
)
from drivetrain_bnb.config import BnbQuantizationConfig

logger = logging.getLogger(__name__)

#: Where weights are kept away from the device that computes.
OFFLOAD_DEVICES = ("cpu", "disk")


def _bitsandbytes() -> Any:
    try:
        import bitsandbytes
    except ImportError as error:
        raise ImportError(
            f"bitsandbytes quantization needs the bitsandbytes library, which does not import here ({error}); "
            "install it with: pip install bitsandbytes"
        ) from None
    return bitsandbytes


def _require_bitsandbytes() -> Any:
    """bitsandbytes, once it is known to be recent enough for both 8-bit and 4-bit layers on every device."""
    bnb = _bitsandbytes()
    version = importlib_metadata.version("bitsandbytes")
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) < (0, 45):
        raise ImportError(
            f"bitsandbytes {version} is installed; drivetrain-bnb needs bitsandbytes >= 0.45 (its CPU backend and "
            "current quantized parameter classes): pip install -U bitsandbytes"
        )
    return bnb


def _bnb_layers(bnb: Any) -> tuple[type, ...]:
    return (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)


def names_module(name: str, keys: Iterable[str]) -> bool:
    """Whether one of ``keys`` names the module (or tensor) ``name`` or a module containing it: a key is a
    dotted module name matched on whole components anywhere in ``name`` (``"lm_head"`` matches
    ``"model.lm_head"`` and ``"lm_head.weight"``, ``"h.0"`` matches ``"transformer.h.0.mlp"``)."""
    padded = f".{name}."
    return any(key and f".{key}." in padded for key in keys)


def get_parameter_device(parameter: torch.nn.Module) -> torch.device:
    """The device of the first parameter of ``parameter`` (a module)."""
    return next(parameter.parameters()).device


def has_4bit_bnb_layers(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes 4-bit layers (``bnb.nn.Linear4bit``)."""
    bnb = _bitsandbytes()
    return any(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def get_keys_to_not_convert(model: torch.nn.Module) -> list[str]:
    """The modules to leave unquantized by default: the tied weights and the last child module (the output head of
    a model with one), without their ``.weight``/``.bias`` suffix. Empty for a base model (a transformers model
    that is its own base model, e.g. ``BertModel``) without tied weights."""
    tied = [name for group in find_tied_parameters(model) for name in group]
    prefix = getattr(model, "base_model_prefix", None)
    is_base_model = prefix is not None and not hasattr(model, prefix)
    if not tied and is_base_model:
        return []
    children = [name for name, _ in model.named_children()]
    keys = list(dict.fromkeys(tied))
    if children and children[-1] not in keys:
        keys.append(children[-1])
    return list(dict.fromkeys(_module_of(key) for key in keys))


def _module_of(tensor_name: str) -> str:
    for suffix in (".weight", ".bias"):
        if tensor_name.endswith(suffix):
            return tensor_name[: -len(suffix)]
    return tensor_name


def _new_layer(bnb: Any, linear: torch.nn.Linear, config: BnbQuantizationConfig) -> torch.nn.Module:
    """The bitsandbytes layer taking ``linear``'s place, holding ``linear``'s (still unquantized) tensors."""
    # Built on the meta device: its random initialisation would be thrown away at once.
    with init_empty_weights():
        if config.load_in_8bit:
            layer = bnb.nn.Linear8bitLt(
                linear.in_features,
                linear.out_features,
                linear.bias is not None,
                has_fp16_weights=False,
                threshold=config.llm_int8_threshold,
            )
        else:
            layer = bnb.nn.Linear4bit(
                linear.in_features,
                linear.out_features,
                linear.bias is not None,
                config.bnb_4bit_compute_dtype,
                compress_statistics=config.bnb_4bit_use_double_quant,
                quant_type=config.bnb_4bit_quant_type,
            )
    weight = layer.weight  # a bitsandbytes parameter class, whose attributes say how to quantize it
    layer.weight = type(weight)(linear.weight.data, requires_grad=False, **weight.__dict__)
    if linear.bias is not None:
        layer.bias = torch.nn.Parameter(linear.bias.data, requires_grad=False)
    layer.requires_grad_(False)
    return layer


def replace_with_bnb_layers(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    modules_to_not_convert: list[str] | None = None,
    current_key_name: list[str] | None = None,
) -> torch.nn.Module:
    """Replace every ``torch.nn.Linear`` of ``model`` (in place) by a ``bnb.nn.Linear8bitLt`` or
    ``bnb.nn.Linear4bit`` holding its weights, except the modules ``modules_to_not_convert`` names (see
    :func:`names_module`). ``current_key_name`` is the dotted path of ``model`` inside a larger model, as a list
    of names, when the keys name modules of that larger model. Returns ``model``."""
    bnb = _require_bitsandbytes()
    skip = list(modules_to_not_convert or [])
    prefix = ".".join(current_key_name or [])
    replaced = 0
    for owner_name, owner in list(model.named_modules()):
        if isinstance(owner, _bnb_layers(bnb)):
            continue
        for child_name, child in list(owner.named_children()):
            if not isinstance(child, torch.nn.Linear) or isinstance(child, _bnb_layers(bnb)):
                continue
            full_name = ".".join(part for part in (prefix, owner_name, child_name) if part)
            if names_module(full_name, skip):
                continue
            setattr(owner, child_name, _new_layer(bnb, child, bnb_quantization_config))
            replaced += 1
    if not replaced:
        logger.warning(
            "load_in_8bit/load_in_4bit: %s has no torch.nn.Linear layer to quantize outside the skipped modules "
            "%s (some architectures, e.g. GPT-2, use Conv1D layers instead)",
            type(model).__name__,
            skip,
        )
    return model


def _is_quantized(weight: torch.Tensor) -> bool:
    return weight.dtype == torch.int8 or bool(getattr(weight, "bnb_quantized", False))


def _quantize_layers(model: torch.nn.Module, device_of: Any) -> None:
    """Put the weight of every bitsandbytes layer of ``model`` on the device ``device_of(module name)`` gives,
    quantizing it there when it is still a floating weight (layers whose weight is on the meta device, i.e.
    offloaded to disk, are left as they are)."""
    bnb = _bitsandbytes()
    for name, module in model.named_modules():
        if not isinstance(module, _bnb_layers(bnb)):
            continue
        weight: Any = cast(Any, module).weight
        if weight.device.type == "meta":
            continue
        target = torch.device(device_of(name))
        # bitsandbytes quantizes an 8-bit weight only as it moves from the CPU (4-bit ones from anywhere)
        if (
            not _is_quantized(weight)
            and weight.device.type != "cpu"
            and isinstance(module, bnb.nn.Linear8bitLt)
        ):
            weight.data = weight.data.cpu()
        module.weight = weight.to(target)


#: What bitsandbytes writes next to an 8-bit layer's int8 weight in a quantized model's state dict: the
#: weight's row scales and a layout marker. An 8-bit layer takes them as buffers while a checkpoint loads.
INT8_STATE = ("SCB", "weight_format")


def _accept_int8_state(layers: list[torch.nn.Module]) -> None:
    """Give each 8-bit layer empty non-persistent buffers for ``INT8_STATE``: the kernel's loader fills them from
    a checkpoint saved from a quantized model and, being non-persistent, does not miss them in another one."""
    for layer in layers:
        out_features = cast(int, layer.out_features)
        layer.register_buffer(
            "SCB", torch.empty(out_features, dtype=torch.float32, device="meta"), persistent=False
        )
        layer.register_buffer(
            "weight_format", torch.empty((), dtype=torch.uint8, device="meta"), persistent=False
        )


def _take_int8_state(named_layers: list[tuple[str, torch.nn.Module]], checkpoint: Any) -> None:
    """Hand the scales a checkpoint gave an 8-bit layer to its int8 weight, and drop the buffers."""
    for name, layer in named_layers:
        scales = layer.SCB
        for buffer in INT8_STATE:
            delattr(layer, buffer)
        weight: Any = layer.weight
        if weight.dtype != torch.int8:
            continue  # a full-precision weight, quantized when it is placed
        if scales.device.type == "meta":
            raise ValueError(
                f"checkpoint {os.fspath(checkpoint)} holds an int8 weight for {name} but not its scales "
                f"({name}.SCB); save the quantized model's whole state_dict, or load a full-precision checkpoint"
            )
        weight.CB = weight.data
        weight.SCB = scales


def _accelerator_device() -> torch.device | None:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return torch.device("xpu", xpu.current_device())
    return None


def _as_torch_device(device: Any) -> torch.device:
    device = normalize_device(device)
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


def _offload_devices(device_map: dict[str, Any]) -> set[str]:
    """The devices of ``device_map`` that hold weights away from the computing device: the disk, and the CPU when
    an accelerator computes."""
    devices = {normalize_device(device) for device in device_map.values()}
    computes_on_accelerator = any(device not in ("cpu", "disk", "meta") for device in devices)
    return {"disk", "cpu"} if computes_on_accelerator else {"disk"}


def _cast_unquantized(model: torch.nn.Module, config: BnbQuantizationConfig) -> None:
    """Cast the floating tensors of ``model`` (an already loaded model) to ``torch_dtype``, except those of the
    ``keep_in_fp32_modules``, kept in float32. A tensor tied to one of those stays in float32 under every name."""
    keep = config.keep_in_fp32_modules or []
    in_fp32 = {
        id(param)
        for name, param in model.named_parameters(remove_duplicate=False)
        if names_module(name, keep)
    }
    for param in model.parameters():
        if id(param) in in_fp32:
            param.data = param.data.to(torch.float32)
        elif torch.is_floating_point(param):
            param.data = param.data.to(config.torch_dtype)


def _quantize_loaded_model(
    model: torch.nn.Module, config: BnbQuantizationConfig, modules_to_not_convert: list[str]
) -> torch.nn.Module:
    model = replace_with_bnb_layers(model, config, modules_to_not_convert=modules_to_not_convert)
    _cast_unquantized(model, config)
    current = get_parameter_device(model)
    target = current if current.type not in ("cpu", "meta") else _accelerator_device()
    if target is None:
        target = torch.device("cpu")
        logger.info(
            "no GPU or XPU: quantizing %s on the CPU (bitsandbytes' CPU backend)", type(model).__name__
        )
    _quantize_layers(model, lambda _name: target)
    return model.to(target)


def load_and_quantize_model(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    weights_location: str | os.PathLike | None = None,
    device_map: dict[str, Any] | str | None = None,
    no_split_module_classes: list[str] | None = None,
    max_memory: dict[Any, int | str] | None = None,
    offload_folder: str | os.PathLike | None = None,
    offload_state_dict: bool | None = False,
) -> torch.nn.Module:
    """Quantize ``model``'s linear layers with bitsandbytes as ``bnb_quantization_config`` says; returns the model.

    A model with its weights is quantized in memory and moved to the GPU (or XPU; without either, it stays on
    the CPU, quantized by bitsandbytes' CPU backend); ``weights_location`` and ``device_map`` are not used then.
    A model built on the meta device (``init_empty_weights``) is loaded from ``weights_location`` (a
    ``.safetensors``/``.bin`` file, a sharded checkpoint's index ``.json``, or a folder holding one) and placed as
    ``device_map`` says: a dict, one of ``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``
    (sized with ``max_memory`` and ``no_split_module_classes``), or None for the whole model on the GPU (else the
    CPU). Weights mapped to ``"disk"`` go to ``offload_folder``; ``offload_state_dict`` is
    ``load_checkpoint_in_model``'s. A checkpoint saved from an 8-bit model (int8 weights and their ``SCB``
    scales) loads as saved.

    The modules ``skip_modules`` names stay unquantized in ``torch_dtype`` (default: the output head and tied
    weights, :func:`get_keys_to_not_convert`) and those ``keep_in_fp32_modules`` names in float32; the config's
    ``skip_modules``/``keep_in_fp32_modules`` hold the lists used afterwards. With 4-bit layers, the modules a
    dict ``device_map`` offloads (disk, or CPU while a GPU computes) stay unquantized too.
    """
    config = bnb_quantization_config
    _require_bitsandbytes()
    if config.skip_modules is None:
        config.skip_modules = get_keys_to_not_convert(model)
    if config.keep_in_fp32_modules is None:
        config.keep_in_fp32_modules = []
    if config.load_in_4bit and isinstance(device_map, dict) and len(device_map) > 1:
        offloaded = _offload_devices(device_map)
        config.skip_modules.extend(
            key
            for key, device in device_map.items()
            if normalize_device(device) in offloaded and key not in config.skip_modules
        )
    modules_to_not_convert = [*config.skip_modules, *config.keep_in_fp32_modules]
    # read by PEFT and transformers to tell a quantized model
    setattr(model, "is_loaded_in_4bit", config.load_in_4bit)  # noqa: B010 (attributes torch's type lacks)
    setattr(model, "is_loaded_in_8bit", config.load_in_8bit)  # noqa: B010

    if get_parameter_device(model).type != "meta":
        if weights_location is not None:
            logger.warning(
                "load_and_quantize_model: %s already has its weights, so weights_location=%s is not read "
                "(build the model under init_empty_weights() to load it from there)",
                type(model).__name__,
                os.fspath(weights_location),
            )
        return _quantize_loaded_model(model, config, modules_to_not_convert)
    if weights_location is None:
        raise ValueError(
            "load_and_quantize_model: the model is on the meta device (built under init_empty_weights), so "
            "weights_location must name its checkpoint: a .safetensors/.bin file, a sharded checkpoint's "
            "index .json, or a folder holding one"
        )

    with init_empty_weights():
        model = replace_with_bnb_layers(model, config, modules_to_not_convert=modules_to_not_convert)
    device_map = get_quantized_model_device_map(
        model,
        config,
        device_map,
        max_memory=max_memory,
        no_split_module_classes=no_split_module_classes,
    )
    bnb = _bitsandbytes()
    layers = [name for name, module in model.named_modules() if isinstance(module, _bnb_layers(bnb))]
    on_disk = [name for name in layers if normalize_device(device_for(name, device_map)) == "disk"]
    if on_disk:
        raise NotImplementedError(
            f"load_and_quantize_model: the device_map puts the quantized layers {on_disk} on 'disk'; offloading "
            "bitsandbytes weights to disk is not supported: map them to a device, or list them in skip_modules "
            "to offload them unquantized"
        )
    if offload_state_dict is None:
        offload_state_dict = "disk" in {normalize_device(device) for device in device_map.values()}
    # The layers computing on an accelerator are read to the CPU first: bitsandbytes quantizes a weight as it
    # moves from the CPU to its device.
    load_map = dict(device_map)
    for name in layers:
        if normalize_device(device_for(name, device_map)) not in OFFLOAD_DEVICES:
            load_map[name] = "cpu"
    int8_layers = [
        (name, module) for name, module in model.named_modules() if isinstance(module, bnb.nn.Linear8bitLt)
    ]
    _accept_int8_state([module for _, module in int8_layers])
    load_checkpoint_in_model(
        model,
        weights_location,
        load_map,
        dtype=config.torch_dtype,
        offload_folder=offload_folder,
        offload_state_dict=bool(offload_state_dict),
        # the loader keeps tensors named by a module component in float32: the scales are float32
        keep_in_fp32_modules=[*config.keep_in_fp32_modules, "SCB"],
    )
    _take_int8_state(int8_layers, weights_location)
    _quantize_layers(model, lambda name: _as_torch_device(device_for(name, device_map)))
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder)


def get_quantized_model_device_map(
    model: torch.nn.Module,
    bnb_quantization_config: BnbQuantizationConfig,
    device_map: dict[str, Any] | str | None = None,
    max_memory: dict[Any, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
) -> dict[str, Any]:
    """The device map of a model whose linear layers are bitsandbytes layers: ``device_map`` itself when it is a
    dict, the whole model on the GPU (else the CPU) when it is None, or the map a strategy (``"auto"``,
    ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``) gives with quantized weights counted at their
    quantized size. Raises ValueError when 4-bit layers would be offloaded (to disk, or to the CPU while a GPU
    computes); 8-bit layers offloaded to the CPU are allowed."""
    config = bnb_quantization_config
    skip = config.skip_modules or []
    keep_fp32 = config.keep_in_fp32_modules or []
    if device_map is None:
        accelerator = _accelerator_device()
        device_map = {"": normalize_device(accelerator) if accelerator is not None else "cpu"}
        logger.info("load_and_quantize_model: no device_map given, using %s", device_map)
    if isinstance(device_map, str):
        special_dtypes: dict[str, Any] = {
            name: config.torch_dtype for name, _ in model.named_parameters() if names_module(name, skip)
        }
        special_dtypes.update(
            {name: torch.float32 for name, _ in model.named_parameters() if names_module(name, keep_fp32)}
        )
        resolved = resolve_device_map(
            model,
            device_map,
            max_memory=max_memory,
            no_split_module_classes=no_split_module_classes,
            dtype=config.target_dtype,
            special_dtypes=special_dtypes,
        )
        assert resolved is not None  # a strategy name always resolves to a map
        device_map = resolved
    offloaded = _offload_devices(device_map)
    quantized_offloaded = [
        key
        for key, device in device_map.items()
        if normalize_device(device) in offloaded and key not in skip and key not in keep_fp32
    ]
    if quantized_offloaded and config.load_in_4bit:
        raise ValueError(
            f"the device map offloads the modules {quantized_offloaded}, which would hold 4-bit bitsandbytes "
            "layers; give the model more GPU memory (max_memory), or pass a dict device_map: the modules it "
            "offloads are then kept unquantized in torch_dtype"
        )
    if quantized_offloaded:
        logger.info(
            "the modules %s are offloaded; their 8-bit layers are quantized there", quantized_offloaded
        )
    return device_map


def quantize_and_offload_8bit(
    model: torch.nn.Module,
    param: torch.Tensor,
    param_name: str,
    new_dtype: torch.dtype,
    offload_folder: str | os.PathLike,
    offload_index: dict[str, Any],
    fp16_statistics: torch.Tensor | None,
) -> None:
    """Write the 8-bit weight ``param_name`` of ``model`` (a ``Linear8bitLt`` weight) to ``offload_folder`` as
    int8 values and their scale statistics (``<name with weight -> SCB>``), recording both in
    ``offload_index``, and leave the model's tensor on the meta device. ``param`` is the unquantized weight
    (quantized here, on the CPU) or, with ``fp16_statistics``, an already quantized one and its statistics."""
    if fp16_statistics is None:
        set_module_tensor_to_device(model, param_name, "cpu", dtype=new_dtype, value=param)
        owner = model.get_submodule(param_name.rpartition(".")[0])
        quantized = owner._parameters[param_name.rpartition(".")[2]]
        assert quantized is not None  # set_module_tensor_to_device just put it there
        quantized.requires_grad = False
        offload_weight(quantized, param_name, offload_folder, index=offload_index)
        statistics = getattr(quantized, "SCB", None)
        if statistics is not None:
            offload_weight(
                statistics, param_name.replace("weight", "SCB"), offload_folder, index=offload_index
            )
    else:
        offload_weight(param, param_name, offload_folder, index=offload_index)
        offload_weight(
            fp16_statistics, param_name.replace("weight", "SCB"), offload_folder, index=offload_index
        )
    set_module_tensor_to_device(model, param_name, "meta", dtype=new_dtype, value=torch.empty(*param.size()))
