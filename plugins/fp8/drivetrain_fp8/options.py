"""Accelerate's ``--fp8_*`` launch flags and the config file's ``fp8_config`` section.

Both end up as one dict of recipe field -> value (``{"backend": "te", "margin": 0}``) that the recipe
handlers read for the fields a script did not set, as Accelerate's handlers read ``ACCELERATE_FP8_*``. Every
value passes through the same normaliser whichever way it came (a flag's string, a YAML value, JSON from
the launcher), so ``"E4M3"``, ``"e4m3"`` and a config file's ``fp8_format: E4M3`` all mean the same.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from drivetrain.plugin_api.settings import plugin_options, to_bool
from drivetrain_fp8.backends import BY_NAME

PLUGIN_NAME = "fp8"
CONFIG_KEY = "fp8_config"
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
OPT_LEVELS = ("O1", "O2")
_BACKEND_ALIASES = {
    "ao": "ao",
    "torchao": "ao",
    "te": "te",
    "transformer_engine": "te",
    "transformer-engine": "te",
    "msamp": "msamp",
    "ms-amp": "msamp",
    "ms_amp": "msamp",
}


def _int_at_least(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not an integer")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise ValueError(f"{number} is below the minimum {minimum}")
        return number

    return convert


def _choice(choices: tuple[str, ...], *, upper: bool) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        text = str(getattr(value, "value", value)).strip()
        text = text.upper() if upper else text.lower()
        if text not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return text

    return convert


def to_backend(value: Any) -> str:
    text = str(getattr(value, "value", value)).strip().lower()
    if text not in _BACKEND_ALIASES:
        raise ValueError(f"{value!r} is not an fp8 backend; choose one of {', '.join(BY_NAME)}")
    return _BACKEND_ALIASES[text]


def to_override_linear_precision(value: Any) -> tuple[bool, bool, bool]:
    """Three booleans (fprop, dgrad, wgrad): ``"false,true,false"``, a list, or one boolean for all three
    (Accelerate's config file writes ``override_linear_precision: false``)."""
    if isinstance(value, str) and "," in value:
        value = value.split(",")
    if isinstance(value, (list, tuple)):
        if len(value) != 3:
            raise ValueError(f"{value!r} must hold three booleans (fprop, dgrad, wgrad)")
        first, second, third = (to_bool(item) for item in value)
        return (first, second, third)
    flag = to_bool(value)
    return (flag, flag, flag)


#: recipe field -> normaliser (raises ValueError saying what is valid)
NORMALISERS: dict[str, Callable[[Any], Any]] = {
    "backend": to_backend,
    "use_autocast_during_eval": to_bool,
    "margin": _int_at_least(0),
    "interval": _int_at_least(1),
    "fp8_format": _choice(FP8_FORMATS, upper=True),
    "amax_history_len": _int_at_least(1),
    "amax_compute_algo": _choice(AMAX_COMPUTE_ALGOS, upper=False),
    "override_linear_precision": to_override_linear_precision,
    "use_mxfp8_block_scaling": to_bool,
    "opt_level": _choice(OPT_LEVELS, upper=True),
    "enable_fsdp_float8_all_gather": to_bool,
    "pad_inner_dim": to_bool,
}
#: other spellings of the fields in Accelerate's config files (``accelerate config`` writes the long ones)
CONFIG_ALIASES = {
    "amax_history_length": "amax_history_len",
    "amax_compute_algorithm": "amax_compute_algo",
    "optimization_level": "opt_level",
    "format": "fp8_format",
}

#: flag (without ``--fp8_``) -> help
FLAG_HELP = {
    "backend": "the fp8 library: ao (torchao), te (TransformerEngine) or msamp (MS-AMP); "
    "default: the first of them that is installed",
    "use_autocast_during_eval": "te: keep fp8 autocast in eval mode too",
    "margin": "te: margin for the scaling factor (default 0)",
    "interval": "te: recompute the scaling factor every N steps (default 1)",
    "fp8_format": "te: HYBRID, E4M3 or E5M2 (default HYBRID)",
    "amax_history_len": "te: length of the amax history (default 1024)",
    "amax_compute_algo": "te: max or most_recent (default most_recent)",
    "override_linear_precision": "te: fprop,dgrad,wgrad GEMMs in higher precision, e.g. false,false,true",
    "opt_level": "msamp: O1 or O2 (default O2)",
    "enable_fsdp_float8_all_gather": "ao: all-gather FSDP2 weights in float8 (default true under fsdp)",
    "pad_inner_dim": "ao: pad matmul inner dimensions to multiples of 16 (default true)",
}


#: flag -> what its value looks like in --help
FLAG_METAVAR = {
    "backend": "{ao,te,msamp}",
    "margin": "N",
    "interval": "N",
    "fp8_format": "{HYBRID,E4M3,E5M2}",
    "amax_history_len": "N",
    "amax_compute_algo": "{max,most_recent}",
    "override_linear_precision": "FPROP,DGRAD,WGRAD",
    "opt_level": "{O1,O2}",
    "enable_fsdp_float8_all_gather": "{true,false}",
    "pad_inner_dim": "{true,false}",
}


def _flag_name(field: str) -> str:
    # --fp8_format, not --fp8_fp8_format (Accelerate's spelling)
    return field if field.startswith("fp8_") else f"fp8_{field}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``drivetrain launch`` flags, Accelerate's names; unset flags stay None and are not passed on."""
    for field, help_text in FLAG_HELP.items():
        normalise = NORMALISERS[field]
        if field == "use_autocast_during_eval":
            parser.add_argument(f"--{_flag_name(field)}", action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(
                f"--{_flag_name(field)}",
                type=_argparse_type(normalise),
                default=None,
                metavar=FLAG_METAVAR[field],
                help=help_text,
            )


def _argparse_type(normalise: Callable[[Any], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return normalise(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


def check_fp8_config(section: Any) -> dict[str, Any]:
    """The config file's ``fp8_config`` section, normalised to recipe field names; raises ValueError naming
    the key and what is valid."""
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ValueError(f"fp8_config must be a mapping of fp8 settings, got {type(section).__name__}")
    normalised: dict[str, Any] = {}
    for key, value in section.items():
        field = CONFIG_ALIASES.get(key) or key
        field = field[4:] if field.startswith("fp8_") and field[4:] in NORMALISERS else field
        if field not in NORMALISERS:
            raise ValueError(
                f"fp8_config.{key} is not an fp8 setting; valid keys: {', '.join(sorted(NORMALISERS))}"
            )
        if value is None:
            continue
        try:
            normalised[field] = NORMALISERS[field](value)
        except ValueError as error:
            raise ValueError(f"fp8_config.{key}: {error}") from None
    return normalised


def launched_settings() -> dict[str, Any]:
    """The fp8 settings the launcher handed to this process: the config file's ``fp8_config`` with the
    ``--fp8_*`` flags on top (a flag given on the command line wins, as in Accelerate)."""
    options = plugin_options(PLUGIN_NAME)
    settings = check_fp8_config(options.get(CONFIG_KEY))
    for dest, value in options.items():
        if dest == CONFIG_KEY or value is None:
            continue
        field = dest[4:] if dest.startswith("fp8_") and dest[4:] in NORMALISERS else dest
        if field in NORMALISERS:
            settings[field] = NORMALISERS[field](value)
    return settings
