"""What the plugin remembers about the models it prepared."""

from __future__ import annotations

from torch.utils.weak import WeakIdKeyDictionary

#: The configuration a model was sharded with (checkpoints follow it, not a later Accelerator's).
CONFIG_ATTRIBUTE = "_drivetrain_fsdp_config"

#: Parameter the user's optimizer may still hold -> the sharded parameter that replaced it.
replaced_parameters: WeakIdKeyDictionary = WeakIdKeyDictionary()

#: What an original parameter maps to when FSDP1 flattened it (use_orig_params=False): the optimizer must be
#: built after prepare.
FLATTENED = object()
