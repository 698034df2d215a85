"""ipex.optimize through the Accelerator (needs IPEX: run in the pinned env with scripts/test-ipex).

Every training test runs the same steps twice, with ipex asked for and with the reference backend alone
(``local``), and compares the weights. Tolerances, from measurements on this project's CPU (AVX2):

- fp32: ``atol 1e-6`` — ipex's fused SGD/AdamW step equals torch's (measured difference 0 to ~1e-7);
- fp16: ``atol 1e-3`` — both run under fp16 autocast with fp32 weights; IPEX brings its own CPU autocast
  kernels for some operators;
- bf16: ``atol 5e-3 + rtol 1e-2`` (the conformance suite's bf16 tolerance) — ipex keeps the model's weights in
  bf16 (fp32 master copies in the optimizer) where ``local`` keeps fp32 weights under autocast.
"""

from __future__ import annotations

import pytest
import torch

from drivetrain import Accelerator

pytestmark = pytest.mark.needs_ipex

FEATURES = 6
STEPS = 3
TOLERANCES = {"no": (0.0, 1e-6), "fp16": (0.0, 1e-3), "bf16": (1e-2, 5e-3)}
#: SGD and Adam have IPEX's fused CPU step (and, in bf16, the split fp32 master weights); AdamW has neither
#: on CPU (IPEX keeps separate fp32 master weights and torch's step).
OPTIMIZERS = {
    "sgd": lambda parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
    "adam": lambda parameters: torch.optim.Adam(parameters, lr=0.01),
    "adamw": lambda parameters: torch.optim.AdamW(parameters, lr=0.01),
}
FUSED_ON_CPU = ("sgd", "adam")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batches(count: int = STEPS, rows: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    found = []
    for _ in range(count):
        x = torch.randn(rows, FEATURES, generator=generator)
        found.append((x, x.sum(dim=1, keepdim=True).sin()))
    return found


def train(accelerator, model, optimizer, data, scheduler=None) -> None:
    for x, y in data:
        accelerator.backward(torch.nn.functional.mse_loss(model(x).float(), y))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad()


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The fp32 weights (the state dict: ipex's bf16 mode reports its fp32 master weights there)."""
    return [tensor.detach().float().clone() for tensor in model.state_dict().values()]


def assert_close(actual: list[torch.Tensor], expected: list[torch.Tensor], precision: str) -> None:
    rtol, atol = TOLERANCES[precision]
    for a, e in zip(actual, expected, strict=True):
        worst = float((a - e).abs().max())
        assert torch.allclose(a, e, rtol=rtol, atol=atol), f"{precision}: weights differ by {worst:.3g}"


def trained(plugins: list[str], precision: str, optimizer_name: str = "sgd", **kwargs):
    accelerator = Accelerator(mixed_precision=precision, plugins=plugins, **kwargs)
    model = make_model()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    prepared, prepared_optimizer = accelerator.prepare(model, optimizer)
    train(accelerator, prepared, prepared_optimizer, batches())
    return accelerator, model, optimizer, prepared


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_training_steps_match_local(precision, optimizer_name):
    accelerator, model, optimizer, prepared = trained(["ipex"], precision, optimizer_name)
    assert hasattr(optimizer, "params_attr"), "ipex did not convert the optimizer"
    assert getattr(optimizer, "fused", False) == (optimizer_name in FUSED_ON_CPU)
    assert prepared is model and accelerator.unwrap_model(prepared) is model
    if precision == "bf16":
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        # fused optimizers step the bf16 weights with their lower 16 bits kept aside (split master
        # weights); AdamW steps separate fp32 master copies
        master = torch.bfloat16 if optimizer_name in FUSED_ON_CPU else torch.float32
        assert {p.dtype for group in optimizer.param_groups for p in group["params"]} == {master}
    else:
        assert {p.dtype for p in model.parameters()} == {torch.float32}
    _, reference, _, _ = trained([], precision, optimizer_name)
    assert_close(weights(model), weights(reference), precision)
    assert list(model.state_dict()) == list(reference.state_dict())


def test_bf16_without_avx512_falls_back_to_no_prepack_with_one_notice(capfd, monkeypatch):
    from drivetrain_ipex import optimize

    monkeypatch.setattr(optimize, "_noticed", set())  # the notice is once per process
    if optimize.bf16_prepack_supported():
        pytest.skip("this CPU prepacks bf16 weights; the fallback is for CPUs without AVX-512/AMX")
    trained(["ipex"], "bf16")
    trained(["ipex"], "bf16")
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("drivetrain-ipex:")]
    assert len(lines) == 1 and "weights_prepack=False" in lines[0]


@pytest.mark.filterwarnings("error:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_users_scheduler_drives_the_converted_optimizer():
    """ipex converts in place, so the scheduler the user built on the optimizer keeps setting the learning
    rate of the optimizer that steps: training with StepLR equals local's."""
    results = []
    for plugins in (["ipex"], []):
        accelerator = Accelerator(plugins=plugins)
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        prepared, prepared_optimizer, prepared_scheduler = accelerator.prepare(model, optimizer, scheduler)
        train(accelerator, prepared, prepared_optimizer, batches(), prepared_scheduler)
        results.append((weights(model), optimizer.param_groups[0]["lr"], getattr(optimizer, "fused", False)))
    (ipex_weights, ipex_lr, fused), (local_weights, local_lr, _) = results
    assert fused and ipex_lr == local_lr == 0.2 * 0.5**STEPS
    assert_close(ipex_weights, local_weights, "no")


def test_model_and_optimizer_in_separate_prepare_calls():
    """wrap_model remembers the training model; wrap_optimizer converts the pair when its optimizer comes."""
    accelerator = Accelerator(plugins=["ipex"])
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    prepared = accelerator.prepare(model)
    assert not hasattr(optimizer, "params_attr")
    prepared_optimizer = accelerator.prepare(optimizer)
    assert hasattr(optimizer, "params_attr") and prepared_optimizer.optimizer is optimizer
    train(accelerator, prepared, prepared_optimizer, batches())
    _, reference, _, _ = trained([], "no", "adamw")
    assert_close(weights(model), weights(reference), "no")


def test_a_prepacked_root_module_is_still_the_users_object():
    """IPEX prepacks Conv2d weights for fp32 training, replacing the module by its own class: for a bare
    Conv2d (the root module itself) the plugin converts the user's object in place, so it is the one that
    trains, its state dict keeps torch's keys and shapes, and training equals local's."""
    found = []
    for plugins in (["ipex"], []):
        torch.manual_seed(0)
        model = torch.nn.Conv2d(3, 4, kernel_size=3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        accelerator = Accelerator(plugins=plugins)
        prepared, prepared_optimizer = accelerator.prepare(model, optimizer)
        generator = torch.Generator().manual_seed(2)
        for _ in range(STEPS):
            x = torch.randn(2, 3, 8, 8, generator=generator)
            accelerator.backward(prepared(x).square().mean())
            prepared_optimizer.step()
            prepared_optimizer.zero_grad()
        assert prepared is model and accelerator.unwrap_model(prepared) is model
        found.append(
            (type(model).__name__, {k: tuple(v.shape) for k, v in model.state_dict().items()}, model)
        )
    (ipex_class, ipex_shapes, ipex_model), (local_class, local_shapes, local_model) = found
    assert ipex_class == "_IPEXConv2d" and local_class == "Conv2d"
    assert ipex_shapes == local_shapes == {"weight": (4, 3, 3, 3), "bias": (4,)}
    assert_close(weights(ipex_model), weights(local_model), "no")


def test_an_eval_model_without_optimizer_is_optimised_for_inference():
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 3).eval()
    plain = torch.nn.Linear(FEATURES, 3).eval()
    plain.load_state_dict(model.state_dict())
    accelerator = Accelerator(plugins=["ipex"])
    prepared = accelerator.prepare(model)
    assert prepared is model and type(model).__name__ == "_IPEXLinear"  # prepacked for inference
    x = torch.randn(5, FEATURES)
    with torch.no_grad():
        assert torch.allclose(prepared(x), plain(x), atol=1e-6)
    with pytest.raises(Exception, match="was optimised for inference"):
        accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_save_load_resume_equals_the_uninterrupted_run(tmp_path, precision):
    """Resuming in a fresh Accelerator (new model and optimizer, converted again, then load_state) continues
    bit for bit as the uninterrupted run: Adam's state, the LR schedule and, in bf16, the fp32 master
    weights survive the checkpoint."""
    data = batches(count=4)

    def fresh():
        accelerator = Accelerator(mixed_precision=precision, plugins=["ipex"])
        model = make_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
        return (accelerator, model, *accelerator.prepare(model, optimizer, scheduler))

    accelerator, model, prepared, optimizer, scheduler = fresh()
    train(accelerator, prepared, optimizer, data, scheduler)
    uninterrupted = weights(model)

    accelerator, model, prepared, optimizer, scheduler = fresh()
    train(accelerator, prepared, optimizer, data[:2], scheduler)
    saved = weights(model)
    accelerator.save_state(str(tmp_path / "checkpoint"))
    accelerator.wait_for_checkpoint()  # the save finishes in the background; the next Accelerator reads it

    accelerator, model, prepared, optimizer, scheduler = fresh()
    accelerator.load_state(str(tmp_path / "checkpoint"))
    assert all(torch.equal(a, b) for a, b in zip(weights(model), saved))
    train(accelerator, prepared, optimizer, data[2:], scheduler)
    assert all(torch.equal(a, b) for a, b in zip(weights(model), uninterrupted)), "resume differs"
    assert scheduler.get_last_lr() == [0.05 * 0.7**4]


@pytest.fixture
def fake_xpu(monkeypatch):
    """torch says an Intel XPU is there (none is: nothing may run on it, so device_placement=False)."""
    import intel_extension_for_pytorch  # noqa: F401  (imported before torch's XPU check is patched)

    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)


def test_asking_for_ipex_on_an_xpu_with_the_cpu_build_is_a_one_line_error(fake_xpu):
    accelerator = Accelerator(plugins=["ipex"], device_placement=False)
    assert accelerator.device == torch.device("xpu", 0)
    model = make_model()
    with pytest.raises(Exception) as error:
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    message = str(error.value).splitlines()[0]
    assert message.startswith("Accelerator(plugins=['ipex']) asks for ipex.optimize on xpu:0, but")
    assert "is a CPU build; install IPEX's XPU build" in message


def test_use_xpu_with_the_cpu_build_trains_with_torch_alone(fake_xpu, monkeypatch, capfd):
    import json

    from drivetrain_ipex import optimize

    monkeypatch.setattr(optimize, "_noticed", set())
    monkeypatch.setenv("DRIVETRAIN_PLUGIN_OPTIONS", json.dumps({"ipex": {"use_xpu": True}}))
    accelerator = Accelerator(device_placement=False)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, _ = accelerator.prepare(model, optimizer)
    assert prepared is model and not hasattr(optimizer, "params_attr")
    assert "is a CPU build: training on the XPU with torch alone" in capfd.readouterr().err
