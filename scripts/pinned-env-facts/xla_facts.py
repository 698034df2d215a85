"""Facts about torch_xla 2.9 on a CPU-only machine, for the authors of the xla plugin.

Run inside the pinned env, one scenario per process (the XLA runtime reads its environment once):

    PY=$(scripts/pinned-env --print-python xla)
    $PY scripts/pinned-env-facts/xla_facts.py single     # one XLA CPU device
    $PY scripts/pinned-env-facts/xla_facts.py spmd       # SPMD data parallel over 2 virtual CPU devices
    $PY scripts/pinned-env-facts/xla_facts.py fsdpv2     # FSDP via SPMD over 2 virtual CPU devices
    $PY scripts/pinned-env-facts/xla_facts.py replicas   # xmp.spawn with 2 CPU replicas (threads)
    $PY scripts/pinned-env-facts/xla_facts.py bf16       # bf16 on the XLA CPU device
    timeout 120 $PY -m torch.distributed.run --nproc-per-node 2 scripts/pinned-env-facts/xla_facts.py torchrun

Each scenario prints `FACT name: value` lines; numbers are compared against the same training run on plain
torch CPU, so a line says whether XLA trained the same model, not merely that it ran.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
SCENARIO = sys.argv[1] if len(sys.argv) > 1 else "single"
if SCENARIO in ("spmd", "fsdpv2", "replicas"):
    # The CPU PJRT client makes this many devices in one process (read when the runtime starts).
    os.environ.setdefault("CPU_NUM_DEVICES", "2")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

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


def reference_weights(dtype=torch.float32):
    """The same training on plain torch CPU: what every XLA run below must reproduce."""
    model = make_model().to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in make_batches():
        optimizer.zero_grad()
        F.mse_loss(model(x.to(dtype)), y.to(dtype)).backward()
        optimizer.step()
    return {k: v.detach().float() for k, v in model.state_dict().items()}


def max_diff(state, reference):
    return max((state[k].detach().cpu().float() - reference[k]).abs().max().item() for k in reference)


def compiles():
    data = met.metric_data("CompileTime")
    return data[0] if data else 0


def runtime_facts():
    fact("torch_xla.device()", torch_xla.device())
    fact("torch_xla.devices()", torch_xla.devices())
    fact("torch_xla.real_devices()", torch_xla.real_devices())
    fact("xr.device_type()", xr.device_type())
    fact("xr.world_size()", xr.world_size())
    fact("xr.global_ordinal()", xr.global_ordinal())
    fact("xr.local_ordinal()", xr.local_ordinal())
    fact("xr.global_runtime_device_count()", xr.global_runtime_device_count())
    fact("xr.addressable_runtime_device_count()", xr.addressable_runtime_device_count())
    fact("xr.is_spmd()", xr.is_spmd())
    fact("xr.is_bf16_supported()", xr.is_bf16_supported())
    fact("xm.is_master_ordinal()", xm.is_master_ordinal())


def collectives_facts(device):
    ordinal = float(xr.global_ordinal())
    value = torch.tensor([1.0 + ordinal, 2.0], device=device)
    for label, call in [
        ("xm.all_reduce(SUM)", lambda: xm.all_reduce(xm.REDUCE_SUM, value.clone())),
        ("xm.all_gather", lambda: xm.all_gather(value.clone(), dim=0)),
        ("xm.mesh_reduce", lambda: xm.mesh_reduce("facts", ordinal, sum)),
        ("xm.collective_broadcast", lambda: _broadcast(value.clone())),
        ("xm.reduce_scatter(SUM)", lambda: xm.reduce_scatter(xm.REDUCE_SUM, value.clone(), 1.0, 0, 1)),
        ("xm.rendezvous", lambda: xm.rendezvous("facts", b"x")),
    ]:
        try:
            result = call()
            torch_xla.sync()
            fact(label, result.cpu().tolist() if isinstance(result, torch.Tensor) else result)
        except Exception as error:  # the exception itself is the fact
            fact(label, f"raises {type(error).__name__}: {str(error).splitlines()[0][:200]}")


def _broadcast(tensor):
    xm.collective_broadcast([tensor], root_ordinal=0)
    return tensor


def single():
    runtime_facts()
    device = torch_xla.device()
    reference = reference_weights()

    # 1. Hand-written loop: forward, backward, xm.optimizer_step, torch_xla.sync() per step.
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    per_step = []
    for x, y in make_batches():
        optimizer.zero_grad()
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        xm.optimizer_step(optimizer)
        torch_xla.sync()
        per_step.append(compiles())
    fact("loop with xm.optimizer_step + torch_xla.sync: compile count after each step", per_step)
    fact("loop: max |w - cpu reference|", f"{max_diff(model.state_dict(), reference):.2e}")
    metrics = {name: met.counter_value(name) for name in ("CachedCompile", "UncachedCompile")}
    fact("counters after the loop", metrics)
    before = compiles()
    fact("loss.item() after sync", f"{loss.item():.4f}; new compiles: {compiles() - before}")

    # 2. Without any sync the graph grows step after step until something reads a value.
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = compiles()
    for x, y in make_batches():
        optimizer.zero_grad()
        F.mse_loss(model(x.to(device)), y.to(device)).backward()
        optimizer.step()
    fact("loop with no sync at all: compiles during the loop", compiles() - before)
    torch_xla.sync()
    fact("  ... then one torch_xla.sync(): compiles", compiles() - before)
    fact("  ... weights still right: max |w - ref|", f"{max_diff(model.state_dict(), reference):.2e}")

    # 3. MpDeviceLoader: batches arrive on the device and the loader calls torch_xla.sync() before each.
    import torch_xla.distributed.parallel_loader as pl

    batches = make_batches()
    dataset = torch.utils.data.TensorDataset(
        torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False)
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    device_loader = pl.MpDeviceLoader(loader, device)
    fact("len(MpDeviceLoader)", len(device_loader))
    before = compiles()
    seen = 0
    for x, y in device_loader:
        seen += 1
        if seen == 1:
            fact("MpDeviceLoader batch device", x.device)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()  # no explicit sync: the loader's next() syncs, and so does its end
    fact("MpDeviceLoader loop without explicit sync: batches, new compiles", (seen, compiles() - before))
    fact("MpDeviceLoader: max |w - ref|", f"{max_diff(model.state_dict(), reference):.2e}")
    fact(
        "pl.ParallelLoader(loader, [device]).per_device_loader(device) type",
        type(pl.ParallelLoader(loader, [device]).per_device_loader(device)).__name__,
    )

    # 4. Saving: xm.save moves to CPU and writes from the master ordinal only.
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.pt")
        xm.save(model.state_dict(), path)
        loaded = torch.load(path)
        fact("xm.save -> torch.load devices", sorted({str(t.device) for t in loaded.values()}))
        fact("xm.save round trip: max |loaded - ref|", f"{max_diff(loaded, reference):.2e}")
        cpu_state = {k: v.cpu() for k, v in model.state_dict().items()}
        fact("state_dict().cpu() works too (device)", next(iter(cpu_state.values())).device)

    # 5. Weight tying: does .to(xla) keep two modules sharing one Parameter?
    tied = torch.nn.ModuleDict({"embed": torch.nn.Embedding(5, 3), "head": torch.nn.Linear(3, 5, bias=False)})
    tied["head"].weight = tied["embed"].weight
    tied = tied.to(device)
    fact("weight tying survives module.to(xla)", tied["head"].weight is tied["embed"].weight)

    collectives_facts(device)

    # 6. Steady-state step time (a rough figure; the machine is shared).
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches[0][0].to(device), batches[0][1].to(device)
    for _ in range(3):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        torch_xla.sync()
    xm.wait_device_ops()
    before = compiles()
    start = time.perf_counter()
    for _ in range(50):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        torch_xla.sync()
    xm.wait_device_ops()
    fact(
        "steady step (tiny MLP), ms; new compiles in 50 steps",
        (round((time.perf_counter() - start) * 1000 / 50, 2), compiles() - before),
    )


def spmd(fsdp=False):
    import numpy as np
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.spmd as xs

    xr.use_spmd()
    runtime_facts()
    device = torch_xla.device()
    count = xr.global_runtime_device_count()
    axis = "fsdp" if fsdp else "data"
    mesh = xs.Mesh(np.arange(count), (count, 1), (axis, "model"))
    fact("xs.Mesh", f"shape {mesh.shape()}, ids {mesh.device_ids.tolist()}, axes {mesh.axis_names}")
    reference = reference_weights()
    model = make_model().to(device)
    if fsdp:
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        model = SpmdFullyShardedDataParallel(model, mesh=mesh)
        first = next(model.parameters())
        fact("FSDPv2 parameter sharding spec", torch_xla._XLAC._get_xla_sharding_spec(first))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    per_step = []
    for x, y in make_batches():
        x, y = x.to(device), y.to(device)
        xs.mark_sharding(x, mesh, (axis, None))  # batch dimension split over the devices
        xs.mark_sharding(y, mesh, (axis, None))
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()  # no gradient all-reduce by hand: the SPMD partitioner inserts it
        torch_xla.sync()
        per_step.append(compiles())
    fact("input sharding spec", torch_xla._XLAC._get_xla_sharding_spec(x))
    fact(f"{'fsdpv2' if fsdp else 'spmd dp'}: compile count after each step", per_step)
    state = model.module.state_dict() if fsdp else model.state_dict()
    fact(f"{'fsdpv2' if fsdp else 'spmd dp'}: max |w - cpu reference|", f"{max_diff(state, reference):.2e}")

    if not fsdp:
        batches = make_batches()
        dataset = torch.utils.data.TensorDataset(
            torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=False)
        device_loader = pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, (axis, None)))
        model = make_model().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in device_loader:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
        fact(
            "spmd MpDeviceLoader(input_sharding=ShardingSpec) spec", torch_xla._XLAC._get_xla_sharding_spec(x)
        )
        fact("spmd MpDeviceLoader: max |w - ref|", f"{max_diff(model.state_dict(), reference):.2e}")
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.pt")
            xm.save(model.state_dict(), path)
            fact(
                "spmd xm.save round trip: max |loaded - ref|", f"{max_diff(torch.load(path), reference):.2e}"
            )
        collectives_facts(device)


def _replica(index, results):
    device = torch_xla.device()
    # FACTS_SAME_VALUE=1 gives every replica the same input, so that their graphs cannot differ.
    same = os.environ.get("FACTS_SAME_VALUE") == "1"
    value = torch.ones(1, device=device) * (1.0 if same else 1.0 + xr.global_ordinal())
    summed = xm.all_reduce(xm.REDUCE_SUM, value, pin_layout=os.environ.get("FACTS_PIN_LAYOUT", "1") == "1")
    torch_xla.sync()
    print(
        f"replica {index}: ordinal {xr.global_ordinal()} of {xr.world_size()}, all_reduce -> {summed.cpu()}",
        flush=True,
    )


def replicas():
    """xmp.spawn on CPU: one process, one thread per CPU device; the all-reduce is expected to hang."""
    import threading

    import torch_xla.distributed.xla_multiprocessing as xmp

    limit = float(os.environ.get("FACTS_TIMEOUT", "60"))
    done = threading.Event()

    def run():
        xmp.spawn(_replica, args=(None,))
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    fact(
        f"xmp.spawn with CPU_NUM_DEVICES={os.environ['CPU_NUM_DEVICES']} finished within {limit:.0f}s",
        done.is_set(),
    )
    if not done.is_set():
        import multiprocessing

        # The replicas live in a process of xmp.spawn's pool: end it, or it would hang on after we exit.
        for child in multiprocessing.active_children():
            child.kill()
    sys.stdout.flush()
    os._exit(0 if done.is_set() else 1)


def torchrun():
    """One XLA CPU device per torchrun process: what the runtime reports and what an all-reduce gives."""
    rank = int(os.environ["RANK"])
    device = torch_xla.device()
    label = f"torchrun rank {rank}"
    fact(
        f"{label}: xr.world_size(), xr.global_ordinal(), real devices",
        (xr.world_size(), xr.global_ordinal(), torch_xla.real_devices()),
    )
    value = torch.ones(1, device=device) * (1.0 + rank)
    summed = xm.all_reduce(xm.REDUCE_SUM, value)
    torch_xla.sync()
    fact(f"{label}: xm.all_reduce(SUM) of 1+rank (right answer 3.0)", summed.cpu().item())
    import torch.distributed as dist
    from torch_xla.distributed import xla_backend  # noqa: F401 - registers the "xla" process group backend

    try:
        dist.init_process_group("xla", init_method="xla://")
        tensor = torch.ones(1, device=device) * (1.0 + rank)
        dist.all_reduce(tensor)
        torch_xla.sync()
        fact(f"{label}: dist 'xla' backend (xla://) all_reduce (right answer 3.0)", tensor.cpu().item())
    except Exception as error:  # the exception itself is the fact
        fact(
            f"{label}: dist 'xla' backend",
            f"raises {type(error).__name__}: {str(error).splitlines()[0][:200]}",
        )


def bf16():
    from torch_xla import amp as xla_amp

    device = torch_xla.device()
    fact("xr.is_bf16_supported()", xr.is_bf16_supported())
    reference = reference_weights()
    # (a) autocast on the xla device: weights stay fp32, matmuls run in bf16.
    for label, context in [
        ("torch.autocast('xla', bfloat16)", lambda: torch.autocast("xla", dtype=torch.bfloat16)),
        ("torch_xla.amp.autocast(device, bfloat16)", lambda: xla_amp.autocast(device, dtype=torch.bfloat16)),
    ]:
        try:
            model = make_model().to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in make_batches():
                optimizer.zero_grad()
                with context():
                    out = model(x.to(device))
                F.mse_loss(out.float(), y.to(device)).backward()
                optimizer.step()
                torch_xla.sync()
            fact(
                label,
                f"output dtype {out.dtype}, param dtype {next(model.parameters()).dtype}, "
                f"max |w - fp32 ref| {max_diff(model.state_dict(), reference):.2e}",
            )
        except Exception as error:  # the exception itself is the fact
            fact(label, f"raises {type(error).__name__}: {str(error).splitlines()[0][:200]}")
    # (b) the model converted to bf16 (what XLA_USE_BF16 used to do implicitly).
    model = make_model().to(torch.bfloat16).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in make_batches():
        optimizer.zero_grad()
        F.mse_loss(model(x.to(torch.bfloat16).to(device)), y.to(torch.bfloat16).to(device)).backward()
        optimizer.step()
        torch_xla.sync()
    bf16_reference = reference_weights(torch.bfloat16)
    fact(
        "model.to(bfloat16) on xla: max |w - cpu bf16 ref|, |w - fp32 ref|",
        (
            f"{max_diff(model.state_dict(), bf16_reference):.2e}",
            f"{max_diff(model.state_dict(), reference):.2e}",
        ),
    )
    fact(
        "XLA_USE_BF16 in torch_xla 2.9", "still read by the C++ runtime, warns 'will be deprecated after 2.6'"
    )


if __name__ == "__main__":
    {
        "single": single,
        "spmd": spmd,
        "fsdpv2": lambda: spmd(fsdp=True),
        "replicas": replicas,
        "bf16": bf16,
        "torchrun": torchrun,
    }[SCENARIO]()
