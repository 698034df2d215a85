"""One launch, many DeepSpeed configurations (each launch plus the deepspeed import costs many seconds).

Usage: ds_matrix.py CASE [CASE ...] where CASE is ``z<stage>-<fp32|bf16>[-offload|-offload_all]``,
``multi_models`` or ``disjoint_models``. Every check prints ``CHECK <name> ok`` (the test asserts the list);
a failed check raises, which fails the launch with the traceback.

Training cases compare with DDP's result, computed here as DDP defines it: one process stepping on the full
global batch (the mean over both processes' samples), with the same accumulation, clipping and schedule.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile

import torch
from drivetrain_deepspeed import select_deepspeed_plugin
from drivetrain_deepspeed.engine import gathered_state_dict

from drivetrain import Accelerator
from drivetrain.state import reset_state
from drivetrain.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler

GAS = 2
PER_PROCESS_BATCH = 4
SAMPLES = 48
CLIP = 0.5
LR = 0.05


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        raise AssertionError(f"check {name} failed {detail}")
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"CHECK {name} ok", flush=True)


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def dataset(seed: int = 1) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, 6, generator=generator)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def schedule(step: int) -> float:
    return 0.9**step


def make_optimizer(parameters, bf16: bool = False) -> torch.optim.Optimizer:
    # Adam turns tiny bf16 rounding differences of small gradients into whole lr-sized steps; SGD keeps a
    # bf16 run comparable with the fp32 reference.
    if bf16:
        return torch.optim.SGD(parameters, lr=LR, momentum=0.9)
    return torch.optim.AdamW(parameters, lr=LR)


def reference(
    model: torch.nn.Module, epochs: int, num_processes: int, bf16: bool = False
) -> tuple[dict, float]:
    """DDP's result: full global batches, loss averaged over processes, the scheduler stepped once per process
    per optimizer step (as the kernel's AcceleratedScheduler does without split_batches)."""
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model.parameters(), bf16)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    x, y = dataset().tensors
    global_batch = PER_PROCESS_BATCH * num_processes
    norm = torch.tensor(0.0)
    for _ in range(epochs):
        for index, start in enumerate(range(0, SAMPLES, global_batch)):
            loss = torch.nn.functional.mse_loss(
                model(x[start : start + global_batch]), y[start : start + global_batch]
            )
            (loss / GAS).backward()
            if (index + 1) % GAS == 0:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                optimizer.step()
                for _ in range(num_processes):
                    scheduler.step()
                optimizer.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, float(norm)


def plugin_for(case: str) -> tuple[DeepSpeedPlugin, str]:
    parts = case.split("-")
    stage, precision = int(parts[0][1:]), parts[1]
    offload = parts[2] if len(parts) > 2 else ""
    plugin = DeepSpeedPlugin(
        zero_stage=stage,
        gradient_accumulation_steps=GAS,
        gradient_clipping=CLIP,
        offload_optimizer_device="cpu" if offload else None,
        offload_param_device="cpu" if offload == "offload_all" else None,
    )
    return plugin, "bf16" if precision == "bf16" else "no"


def build(case: str) -> tuple[Accelerator, torch.nn.Module, object, object, object]:
    reset_state()
    plugin, precision = plugin_for(case)
    accelerator = Accelerator(deepspeed_plugin=plugin, mixed_precision=precision)
    model = make_model()
    optimizer = make_optimizer(model.parameters(), precision == "bf16")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=PER_PROCESS_BATCH)
    loader = accelerator.prepare(loader)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return accelerator, model, optimizer, scheduler, loader


def train_epoch(accelerator, model, optimizer, scheduler, loader) -> float:
    norm = torch.tensor(0.0)
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norm = accelerator.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return float(norm)


def close(a: dict, b: dict, tolerance: float) -> tuple[bool, float]:
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in b)
    return worst <= tolerance, worst


def run_training_case(case: str, checkpoint_root: str) -> None:
    bf16 = "bf16" in case
    accelerator, model, optimizer, scheduler, loader = build(case)
    check(
        f"{case}_is_engine",
        type(model).__name__ == "DeepSpeedEngine" and accelerator.distributed_type == "DEEPSPEED",
    )
    norm = train_epoch(accelerator, model, optimizer, scheduler, loader)
    expected, expected_norm = reference(make_model(), 1, accelerator.num_processes, bf16)
    ok, worst = close(gathered_state_dict(model), expected, 2e-2 if bf16 else 2e-5)
    check(f"{case}_matches_ddp", ok, f"(max difference {worst})")
    tolerance = 5e-2 if bf16 else 1e-4
    check(
        f"{case}_grad_norm",
        abs(norm - expected_norm) <= tolerance * max(1.0, expected_norm),
        f"({norm} vs {expected_norm})",
    )

    # save -> continue, versus load into a fresh engine -> continue: equal weights, bit for bit.
    folder = os.path.join(checkpoint_root, case)
    accelerator.save_state(folder)
    train_epoch(accelerator, model, optimizer, scheduler, loader)
    uninterrupted = gathered_state_dict(model)
    lr_uninterrupted = scheduler.get_last_lr()
    accelerator.wait_for_everyone()

    accelerator, model, optimizer, scheduler, loader = build(case)
    accelerator.load_state(folder)
    train_epoch(accelerator, model, optimizer, scheduler, loader)
    resumed = gathered_state_dict(model)
    check(
        f"{case}_resume_exact",
        all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted),
        f"(max difference {close(resumed, uninterrupted, 0)[1]})",
    )
    check(f"{case}_resume_lr", scheduler.get_last_lr() == lr_uninterrupted)
    if not bf16 and "offload" not in case:
        expected, _ = reference(make_model(), 2, accelerator.num_processes)
        ok, worst = close(resumed, expected, 2e-5)
        check(f"{case}_resumed_matches_ddp", ok, f"(max difference {worst})")


STUDENT_CONFIG = {
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {"stage": 2},
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
}
TEACHER_CONFIG = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1}


def run_multi_models(checkpoint_root: str) -> None:
    """A frozen ZeRO-3 teacher and a ZeRO-2 student with the config's optimizer and scheduler."""
    reset_state()
    plugins = {
        "student": DeepSpeedPlugin(hf_ds_config=STUDENT_CONFIG),
        "teacher": DeepSpeedPlugin(hf_ds_config=TEACHER_CONFIG),
    }
    accelerator = Accelerator(deepspeed_plugins=plugins)
    from drivetrain_deepspeed import get_active_deepspeed_plugin

    check("first_plugin_active", get_active_deepspeed_plugin(accelerator.state) is plugins["student"])
    student = make_model(0)
    optimizer = DummyOptim(student.parameters(), lr=LR, weight_decay=0.0)
    scheduler = DummyScheduler(optimizer, warmup_num_steps=4)
    loader = accelerator.prepare(torch.utils.data.DataLoader(dataset(), batch_size=PER_PROCESS_BATCH))
    student, optimizer, scheduler = accelerator.prepare(student, optimizer, scheduler)
    check("student_config_optimizer", type(optimizer.optimizer).__name__ == "DeepSpeedZeroOptimizer")

    select_deepspeed_plugin(accelerator.state, "teacher")
    check("teacher_selected", get_active_deepspeed_plugin(accelerator) is plugins["teacher"])
    teacher_module = make_model(7)
    original_teacher = copy.deepcopy(teacher_module)
    teacher = accelerator.prepare_model(teacher_module, evaluation_mode=True)
    check("teacher_is_zero3", teacher.zero_optimization_stage() == 3)

    before = gathered_state_dict(student)
    lrs = []
    for x, _ in loader:
        with torch.no_grad():
            target = teacher(x)
            expected_target = original_teacher(x)
        if not torch.allclose(target, expected_target, atol=1e-6):
            raise AssertionError("teacher output differs from the unsharded teacher")
        loss = torch.nn.functional.mse_loss(student(x), target)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    check("teacher_outputs_match_unsharded", True)
    after = gathered_state_dict(student)
    check("student_trained", any(not torch.equal(before[k], after[k]) for k in before))
    teacher_weights = gathered_state_dict(teacher)
    check(
        "teacher_frozen",
        all(torch.equal(teacher_weights[k], v) for k, v in original_teacher.state_dict().items()),
    )
    check("config_scheduler_warms_up", lrs[0] < lrs[3] and abs(lrs[-1] - LR) < 1e-9, str(lrs))

    folder = os.path.join(checkpoint_root, "two_engines")
    accelerator.save_state(folder)
    accelerator.wait_for_everyone()  # the folder appears once the save finished in the background
    # The student's engine folder; the frozen teacher (an inference engine) is not checkpointed.
    check(
        "engine_folder_per_trained_model",
        os.path.isdir(os.path.join(folder, "pytorch_model"))
        and not os.path.exists(os.path.join(folder, "pytorch_model_1")),
    )
    with torch.no_grad():
        for parameter in student.module.parameters():
            if parameter.numel():
                parameter.add_(1.0)
    accelerator.load_state(folder)
    restored = gathered_state_dict(student)
    check("multi_model_load_restores", all(torch.equal(restored[k], after[k]) for k in after))

    # The same student trained alone (one plugin, one Accelerator) on the unsharded teacher's targets ends with
    # the same weights: the second plugin and the ZeRO-3 teacher engine change nothing about the student.
    reset_state()
    alone = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=STUDENT_CONFIG))
    student = make_model(0)
    optimizer = DummyOptim(student.parameters(), lr=LR, weight_decay=0.0)
    scheduler = DummyScheduler(optimizer, warmup_num_steps=4)
    loader = alone.prepare(torch.utils.data.DataLoader(dataset(), batch_size=PER_PROCESS_BATCH))
    student, optimizer, scheduler = alone.prepare(student, optimizer, scheduler)
    for x, _ in loader:
        with torch.no_grad():
            target = original_teacher(x)
        alone.backward(torch.nn.functional.mse_loss(student(x), target))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    ok, worst = close(gathered_state_dict(student), after, 1e-6)
    check("student_matches_trained_alone", ok, f"(max difference {worst})")


def run_disjoint_models() -> None:
    """Two models trained separately, one Accelerator each, each equal to its own DDP result."""
    reset_state()
    plugins = {
        "first": DeepSpeedPlugin(zero_stage=1, gradient_accumulation_steps=GAS, gradient_clipping=CLIP),
        "second": DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=GAS, gradient_clipping=CLIP),
    }
    first_accelerator = Accelerator(deepspeed_plugins=plugins)
    second_accelerator = Accelerator()
    prepared = []
    for accelerator, name, seed in ((first_accelerator, "first", 0), (second_accelerator, "second", 3)):
        select_deepspeed_plugin(accelerator.state, name)
        model = make_model(seed)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        loader = accelerator.prepare(torch.utils.data.DataLoader(dataset(), batch_size=PER_PROCESS_BATCH))
        prepared.append((accelerator, *accelerator.prepare(model, optimizer, scheduler), loader, seed))
    check(
        "disjoint_stages",
        prepared[0][1].zero_optimization_stage() == 1 and prepared[1][1].zero_optimization_stage() == 2,
    )
    for batches in zip(prepared[0][4], prepared[1][4]):
        for (accelerator, model, optimizer, scheduler, _, _), (x, y) in zip(prepared, batches):
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    for accelerator, model, *_, seed in prepared:
        expected, _ = reference(make_model(seed), 1, accelerator.num_processes)
        ok, worst = close(gathered_state_dict(model), expected, 2e-5)
        check(f"disjoint_seed{seed}_matches_ddp", ok, f"(max difference {worst})")


def main(cases: list[str]) -> None:
    root = os.environ.get("DS_TEST_CHECKPOINTS") or tempfile.mkdtemp()
    for case in cases:
        if case == "multi_models":
            run_multi_models(root)
        elif case == "disjoint_models":
            run_disjoint_models()
        else:
            run_training_case(case, root)
    from drivetrain.state import PartialState

    PartialState().destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
