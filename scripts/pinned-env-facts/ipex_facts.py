"""Facts about intel-extension-for-pytorch 2.8 (torch 2.8) on this CPU, for the authors of the ipex plugin.

Run inside the pinned env:

    PY=$(scripts/pinned-env --print-python ipex)
    $PY scripts/pinned-env-facts/ipex_facts.py                  # ISA detection, xpu, fp32 and bf16 training
    timeout 300 $PY -m torch.distributed.run --nproc-per-node 2 scripts/pinned-env-facts/ipex_facts.py ddp
    FACTS_DTYPE=bf16 timeout 300 $PY -m torch.distributed.run --nproc-per-node 2 ...ipex_facts.py ddp

Each result is printed as a `FACT name: value` line; trained weights are compared with the same training on
plain torch, so a line says whether ipex trained the same model, not merely that it ran.
"""

import importlib.util
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

STEPS = 6
BATCH = 8


def fact(name, value):
    print(f"FACT {name}: {value}", flush=True)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def make_batches():
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 4, generator=generator), torch.randn(BATCH, 2, generator=generator))
        for _ in range(STEPS)
    ]


def reference_weights():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in make_batches():
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def max_diff(state, reference):
    return max((state[k].detach().float() - reference[k].float()).abs().max().item() for k in reference)


def cpu_flags():
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def isa_facts():
    import intel_extension_for_pytorch as ipex
    from intel_extension_for_pytorch import _C as core

    flags = cpu_flags()
    wanted = [
        "avx2",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512_bf16",
        "amx_tile",
        "amx_bf16",
        "avx_ne_convert",
        "avx512_fp16",
    ]
    fact("/proc/cpuinfo flags present", {flag: flag in flags for flag in wanted})
    fact("torch.backends.cpu.get_cpu_capability()", torch.backends.cpu.get_cpu_capability())
    fact("ipex.__version__", ipex.__version__)
    for name in [
        "isa_has_avx2_support",
        "isa_has_avx512_support",
        "isa_has_avx512_bf16_support",
        "isa_has_amx_support",
        "onednn_has_bf16_support",
        "onednn_has_fp16_support",
        "_get_current_isa_level",
        "_get_highest_cpu_support_isa_level",
        "_has_xpu",
    ]:
        fact(f"intel_extension_for_pytorch._C.{name}()", getattr(core, name)())
    fact("hasattr(torch, 'xpu'), torch.xpu.is_available()", (hasattr(torch, "xpu"), torch.xpu.is_available()))
    fact(
        "torch.distributed.is_xccl_available()",
        getattr(torch.distributed, "is_xccl_available", lambda: "absent")(),
    )
    fact("torch.distributed.is_backend_available('ccl')", torch.distributed.is_backend_available("ccl"))
    fact(
        "oneccl_bindings_for_pytorch importable",
        importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None,
    )


def train(model, optimizer, autocast_dtype=None):
    for x, y in make_batches():
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            out = model(x)
        F.mse_loss(out.float(), y).backward()
        optimizer.step()
    return out


def optimize_facts():
    import intel_extension_for_pytorch as ipex

    reference = reference_weights()

    # fp32: prepacked Linear weights; the returned model and optimizer are copies unless inplace=True.
    model = make_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimized, optimized_optimizer = ipex.optimize(model, optimizer=optimizer, dtype=torch.float32)
    fact(
        "fp32 ipex.optimize returns the same objects (model, optimizer)",
        (optimized is model, optimized_optimizer is optimizer),
    )
    fact("fp32 optimized layer types", [type(m).__name__ for m in optimized.children()])
    fact("fp32 state_dict keys unchanged", list(optimized.state_dict()) == list(model.state_dict()))
    fact(
        "fp32 state_dict weight shape (prepacked weights are unpacked in state_dict)",
        tuple(optimized.state_dict()["0.weight"].shape),
    )
    train(optimized, optimized_optimizer)
    fact("fp32 trained: max |w - plain torch|", f"{max_diff(optimized.state_dict(), reference):.2e}")

    # save/load: the optimized state_dict loads into a plain model, and back into an optimized one.
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.pt")
        torch.save({"model": optimized.state_dict(), "optimizer": optimized_optimizer.state_dict()}, path)
        saved = torch.load(path)
        plain = make_model()
        plain.load_state_dict(saved["model"])
        fact(
            "optimized state_dict -> plain model: max |w - plain torch|",
            f"{max_diff(plain.state_dict(), reference):.2e}",
        )
        again = make_model().train()
        again_optimizer = torch.optim.SGD(again.parameters(), lr=0.1)
        again, again_optimizer = ipex.optimize(again, optimizer=again_optimizer, dtype=torch.float32)
        again.load_state_dict(saved["model"])
        again_optimizer.load_state_dict(saved["optimizer"])
        fact(
            "saved state_dict -> fresh optimized model: max |w - plain torch|",
            f"{max_diff(again.state_dict(), reference):.2e}",
        )

    # model in eval mode with an optimizer.
    try:
        eval_model = make_model().eval()
        ipex.optimize(eval_model, optimizer=torch.optim.SGD(eval_model.parameters(), lr=0.1))
        fact("ipex.optimize(eval-mode model, optimizer=...)", "accepted")
    except Exception as error:  # the exception itself is the fact
        fact("ipex.optimize(eval-mode model, optimizer=...)", f"raises {type(error).__name__}: {error}")

    # bf16 with the default weights_prepack on this CPU.
    model = make_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        ipex.optimize(model, optimizer=optimizer, dtype=torch.bfloat16)
        fact("bf16 ipex.optimize with default weights_prepack", "accepted")
    except Exception as error:  # the exception itself is the fact
        fact(
            "bf16 ipex.optimize with default weights_prepack",
            f"raises {type(error).__module__}.{type(error).__name__}: {error}",
        )

    # bf16 with weights_prepack=False, run under cpu autocast as IPEX documents for bf16 training.
    model = make_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimized, optimized_optimizer = ipex.optimize(
        model, optimizer=optimizer, dtype=torch.bfloat16, weights_prepack=False
    )
    fact(
        "bf16 (prepack off) parameter dtypes after optimize",
        sorted({str(p.dtype) for p in optimized.parameters()}),
    )
    out = train(optimized, optimized_optimizer, autocast_dtype=torch.bfloat16)
    fact("bf16 (prepack off) output dtype under autocast", out.dtype)
    fact(
        "bf16 (prepack off) state_dict dtypes",
        sorted({str(v.dtype) for v in optimized.state_dict().values()}),
    )
    fact(
        "bf16 (prepack off) trained: max |w - plain fp32 torch|",
        f"{max_diff(optimized.state_dict(), reference):.2e}",
    )
    master = getattr(optimized_optimizer, "params_attr", None)
    fact(
        "bf16 optimizer keeps fp32 master weights (split_master_weight_for_bf16)",
        "params_attr present" if master else "no params_attr",
    )

    # bf16 without autocast: weights are bf16, so fp32 inputs fail unless cast.
    model = make_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimized, optimized_optimizer = ipex.optimize(
        model, optimizer=optimizer, dtype=torch.bfloat16, weights_prepack=False
    )
    try:
        train(optimized, optimized_optimizer)
        fact("bf16 (prepack off) without autocast, fp32 inputs", "runs")
    except Exception as error:  # the exception itself is the fact
        fact(
            "bf16 (prepack off) without autocast, fp32 inputs",
            f"raises {type(error).__name__}: {str(error).splitlines()[0][:200]}",
        )


def ddp():
    """2 processes, each half of every batch, ipex.optimize then DDP (gloo): must equal 1 process, full batch."""
    import intel_extension_for_pytorch as ipex
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # FACTS_DTYPE=bf16: ipex bf16 with prepack off under cpu autocast, against the same on 1 process.
    bf16 = os.environ.get("FACTS_DTYPE") == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32

    def optimized():
        model = make_model().train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return ipex.optimize(model, optimizer=optimizer, dtype=dtype, weights_prepack=not bf16)

    model, optimizer = optimized()
    train(model, optimizer, autocast_dtype=dtype if bf16 else None)
    reference = model.state_dict()
    model, optimizer = optimized()
    model = torch.nn.parallel.DistributedDataParallel(model)
    for x, y in make_batches():
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=dtype, enabled=bf16):
            out = model(x)
        F.mse_loss(out.float(), y).backward()
        optimizer.step()
    diff = max_diff(model.module.state_dict(), reference)
    fact(
        f"ddp {dtype} rank {rank}/{world} (gloo, ipex.optimize before DDP): max |w - 1 process|",
        f"{diff:.2e}",
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "ddp":
        ddp()
    else:
        isa_facts()
        optimize_facts()
