"""GPU check of drivetrain-bnb's CUDA paths (issue 17). Run alone on a machine with one CUDA GPU and bitsandbytes:

    python3 plugins/bnb/tests/gpu/check_bnb_cuda.py

Uses the network of plugins/bnb/tests/test_bnb.py (embedding, two blocks of two linear layers, norm, head). Cases:
``loaded_8bit`` / ``loaded_4bit``: a model with its weights is quantized and moved to the GPU (the quantized
layers' weights are int8 / packed uint8 on cuda:0, the logits within the CPU tests' tolerances of the float32
model); ``checkpoint_8bit`` / ``checkpoint_4bit``: a model on the meta device loaded from a safetensors file with
``device_map="auto"`` is placed on GPU 0 with the same quantized weights as quantizing in memory, and the same
logits; ``cpu_equals_cuda_8bit``: the int8 weights and scales quantized on the GPU equal those of the CPU backend.

Prints one line ``RESULT bnb_<case> PASS|FAIL|SKIP <number> <details>`` per case (scripts/gpu-checks' format) and
exits 1 on a failure; without CUDA or bitsandbytes every case is a SKIP naming why, exit 0.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
import tempfile
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _tests_module():
    spec = importlib.util.spec_from_file_location("bnb_cpu_tests", os.path.join(HERE, "..", "test_bnb.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    cases = ["loaded_8bit", "loaded_4bit", "checkpoint_8bit", "checkpoint_4bit", "cpu_equals_cuda_8bit"]
    if not torch.cuda.is_available():
        for case in cases:
            print(f"RESULT bnb_{case} SKIP 0 no CUDA device")
        return 0
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as error:
        for case in cases:
            print(f"RESULT bnb_{case} SKIP 0 bitsandbytes does not import: {error}")
        return 0
    t = _tests_module()
    from drivetrain import init_empty_weights
    from drivetrain_bnb.quantize import load_and_quantize_model

    torch.manual_seed(0)
    model = t.TinyLM().eval()
    ids = torch.randint(0, 96, (4, 16))
    with torch.no_grad():
        expected = model(ids)
    failed = False
    in_memory = {}

    def report(case: str, ok: bool, number: float, details: str) -> None:
        nonlocal failed
        failed |= not ok
        print(f"RESULT bnb_{case} {'PASS' if ok else 'FAIL'} {number:.4g} {details}", flush=True)

    for bits in (8, 4):
        case = f"loaded_{bits}bit"
        try:
            quantized = load_and_quantize_model(copy.deepcopy(model), t._config(bits))
            in_memory[bits] = quantized
            weight = quantized.blocks[0].fc1.weight
            dtype = torch.int8 if bits == 8 else torch.uint8
            with torch.no_grad():
                error = t._relative_error(quantized(ids.cuda()).cpu(), expected)
            bound = t.INT8_TOLERANCE if bits == 8 else t.INT4_TOLERANCE
            ok = weight.device.type == "cuda" and weight.dtype == dtype and 0 < error < bound
            report(
                case,
                ok,
                error,
                f"relative logits error {error:.4f} (bound {bound}); weight {weight.dtype} on {weight.device}",
            )
        except Exception:
            report(case, False, 0, traceback.format_exc().strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as folder:
        path = t._save(model, folder)
        for bits in (8, 4):
            case = f"checkpoint_{bits}bit"
            try:
                with init_empty_weights():
                    empty = t.TinyLM()
                loaded = load_and_quantize_model(
                    empty, t._config(bits), weights_location=path, device_map="auto"
                )
                reference_state, loaded_state = (
                    t._quantized_state(in_memory[bits]),
                    t._quantized_state(loaded),
                )
                different = [
                    name
                    for name, tensor in reference_state.items()
                    if not torch.equal(loaded_state[name], tensor)
                ]
                with torch.no_grad():
                    same_logits = torch.equal(loaded(ids.cuda()), in_memory[bits](ids.cuda()))
                ok = loaded.hf_device_map == {"": 0} and not different and same_logits
                report(
                    case,
                    ok,
                    len(different),
                    f"device map {loaded.hf_device_map}; tensors differing from in-memory quantization: {different}; "
                    f"same logits: {same_logits}",
                )
            except Exception:
                report(case, False, 0, traceback.format_exc().strip().splitlines()[-1])
    try:
        import bitsandbytes as bnb

        weight = model.blocks[0].fc1.weight.detach().half()
        on_cpu = bnb.functional.int8_vectorwise_quant(weight)
        on_cuda = bnb.functional.int8_vectorwise_quant(weight.cuda())
        same = torch.equal(on_cpu[0], on_cuda[0].cpu()) and torch.equal(on_cpu[1], on_cuda[1].cpu())
        differing = int((on_cpu[0] != on_cuda[0].cpu()).sum())
        report(
            "cpu_equals_cuda_8bit", same, differing, f"int8 values differing between backends: {differing}"
        )
    except Exception:
        report("cpu_equals_cuda_8bit", False, 0, traceback.format_exc().strip().splitlines()[-1])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
