"""The ``bnb`` plugin: bitsandbytes quantization of a model's linear layers.

It implements no hook: what it provides are the public names of its ``drivetrain.exports`` entry points
(``BnbQuantizationConfig``, ``load_and_quantize_model``, ...), used by a script before or without an
``Accelerator``. This module only describes the plugin, so listing plugins never imports bitsandbytes.
"""

from __future__ import annotations

from drivetrain.plugin_api import PluginInfo

PLUGIN_INFO = PluginInfo(
    kind="extension",
    requires=("bitsandbytes",),
    description="bitsandbytes 8-bit and 4-bit quantization: BnbQuantizationConfig, load_and_quantize_model "
    "(on CUDA, XPU, or the CPU)",
)
