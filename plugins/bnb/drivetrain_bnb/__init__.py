"""drivetrain-bnb: Accelerate's bitsandbytes quantization (``BnbQuantizationConfig``,
``load_and_quantize_model``) for drivetrain. The names resolve from ``drivetrain.utils`` and
``drivetrain.utils.bnb`` as they do from ``accelerate.utils`` and ``accelerate.utils.bnb``."""
