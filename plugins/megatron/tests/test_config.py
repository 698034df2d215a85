"""MegatronLMPlugin from the constructor, launch flags, the config file and MEGATRON_LM_* variables; what
runs in one process (groups of one, the dummy scheduler, train steps); the clear errors for what cannot run."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from drivetrain_megatron.config import MegatronLMPlugin
from drivetrain_megatron.process_group import check_degrees

from drivetrain.errors import ConfigurationError

SEED_FIELDS = (
    "tp_degree",
    "pp_degree",
    "num_micro_batches",
    "gradient_clipping",
    "sequence_parallelism",
    "recompute_activations",
    "use_distributed_optimizer",
    "pipeline_model_parallel_split_rank",
    "num_layers_per_virtual_pipeline_stage",
    "is_train_batch_min",
    "train_iters",
    "train_samples",
    "weight_decay_incr_style",
    "start_weight_decay",
    "end_weight_decay",
    "lr_decay_style",
    "lr_decay_iters",
    "lr_decay_samples",
    "lr_warmup_iters",
    "lr_warmup_samples",
    "lr_warmup_fraction",
    "min_lr",
    "consumed_samples",
    "no_wd_decay_cond",
    "scale_lr_cond",
    "lr_mult",
    "megatron_dataset_flag",
    "seq_length",
    "encoder_seq_length",
    "decoder_seq_length",
    "tensorboard_dir",
    "set_all_logging_options",
    "eval_iters",
    "eval_interval",
    "return_logits",
    "custom_train_step_class",
    "custom_train_step_kwargs",
    "custom_model_provider_function",
    "custom_prepare_model_function",
    "custom_megatron_datasets_provider_function",
    "custom_get_batch_function",
    "custom_loss_function",
    "other_megatron_args",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("DRIVETRAIN_BACKEND_CONFIG", "DRIVETRAIN_CONFIG_FILE", "MEGATRON_LM_TP_DEGREE"):
        monkeypatch.delenv(name, raising=False)


def test_accelerates_fields_and_defaults():
    plugin = MegatronLMPlugin(tp_degree=2)
    for name in SEED_FIELDS:
        assert hasattr(plugin, name), name
    resolved = plugin.resolved()
    assert (resolved.tp_degree, resolved.pp_degree, resolved.num_micro_batches) == (2, 1, 1)
    assert resolved.gradient_clipping == 1.0 and resolved.lr_decay_style == "linear"
    assert resolved.sequence_parallelism is False and resolved.use_distributed_optimizer is False


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"tp_degree": 0}, "tp_degree must be an integer >= 1"),
        ({"sequence_parallelism": "maybe"}, "MegatronLMPlugin.sequence_parallelism='maybe' is not a boolean"),
        ({"lr_decay_style": "steps"}, "lr_decay_style='steps' is not valid; choose one of"),
        ({"custom_loss_function": 3}, "custom_loss_function must be callable"),
    ],
)
def test_bad_values_name_the_field(fields, words):
    with pytest.raises(ConfigurationError, match=words):
        MegatronLMPlugin(**fields)


def test_combinations_that_cannot_run():
    with pytest.raises(ConfigurationError, match="sequence_parallelism=True needs tp_degree > 1"):
        MegatronLMPlugin(sequence_parallelism=True).resolved()
    cpu = torch.device("cpu")
    with pytest.raises(ConfigurationError, match=r"= 4 must divide the number of processes \(2\)"):
        check_degrees(MegatronLMPlugin(tp_degree=4).resolved(), 2, cpu)
    # a CPU-only torch (this one) cannot run megatron-core's schedules or sequence-parallel collectives
    with pytest.raises(
        ConfigurationError, match=r"pp_degree=2 / num_micro_batches=1 \(megatron-core's schedules"
    ):
        check_degrees(MegatronLMPlugin(pp_degree=2).resolved(), 2, cpu)
    with pytest.raises(ConfigurationError, match="pp_degree=1 / num_micro_batches=4 .* need CUDA"):
        check_degrees(MegatronLMPlugin(num_micro_batches=4).resolved(), 2, cpu)
    with pytest.raises(ConfigurationError, match="sequence_parallelism=True .* need CUDA"):
        check_degrees(MegatronLMPlugin(tp_degree=2, sequence_parallelism=True).resolved(), 2, cpu)


def test_launch_flags_reach_the_plugin(monkeypatch):
    from drivetrain.contract.registry import get_plugin_registry

    manager = get_plugin_registry()
    manager.load("megatron")
    parser = argparse.ArgumentParser()
    for owner, add_arguments in manager.extensions.launch_options:
        if owner == "megatron":
            add_arguments(parser)
    flags = parser.parse_args(["--megatron_lm_tp_degree", "2", "--megatron_lm_sequence_parallelism", "true"])
    # drivetrain launch hands the set flags to the processes in DRIVETRAIN_BACKEND_CONFIG
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({k: v for k, v in vars(flags).items() if v}))
    resolved = MegatronLMPlugin().resolved()
    assert resolved.tp_degree == 2 and resolved.sequence_parallelism is True
    info = manager.info("megatron")
    assert (info.distributed_type, info.config_section, info.launch_flag) == (
        "MEGATRON_LM",
        "megatron_lm_config",
        "use_megatron_lm",
    )


def test_accelerate_config_file_section(tmp_path, monkeypatch):
    path = tmp_path / "megatron_gpt_config.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MEGATRON_LM\nmegatron_lm_config:\n"
        "  megatron_lm_gradient_clipping: 0.5\n  megatron_lm_num_micro_batches: 2\n  megatron_lm_pp_degree: 2\n"
        "  megatron_lm_recompute_activations: true\n  megatron_lm_tp_degree: 2\n"
    )
    monkeypatch.setenv("DRIVETRAIN_CONFIG_FILE", str(path))
    resolved = MegatronLMPlugin().resolved()
    assert (resolved.tp_degree, resolved.pp_degree, resolved.num_micro_batches) == (2, 2, 2)
    assert resolved.gradient_clipping == 0.5 and resolved.recompute_activations is True


def test_environment_variables_and_conflicts(monkeypatch):
    monkeypatch.setenv("MEGATRON_LM_TP_DEGREE", "2")
    assert MegatronLMPlugin().resolved().tp_degree == 2
    assert MegatronLMPlugin(tp_degree=2).resolved().tp_degree == 2
    with pytest.raises(
        ConfigurationError, match="conflicting megatron setting 'tp_degree'.*MEGATRON_LM_TP_DEGREE"
    ):
        MegatronLMPlugin(tp_degree=4).resolved()
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"megatron_lm_tp_degre": 2}))
    with pytest.raises(ConfigurationError, match="unknown megatron setting 'megatron_lm_tp_degre'"):
        MegatronLMPlugin().resolved()
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"megatron_lm_pp_degree": "two"}))
    with pytest.raises(ConfigurationError, match="DRIVETRAIN_BACKEND_CONFIG.*pp_degree must be an integer"):
        MegatronLMPlugin().resolved()


def test_a_launcher_setting_conflicting_with_the_scripts_plugin_raises_naming_both(monkeypatch):
    from drivetrain_megatron.config import resolve_config

    # drivetrain launch --megatron_lm_tp_degree 2 hands its flags over in DRIVETRAIN_BACKEND_CONFIG
    monkeypatch.setenv("DRIVETRAIN_BACKEND_CONFIG", json.dumps({"megatron_lm_tp_degree": 2}))
    with pytest.raises(ConfigurationError) as caught:
        resolve_config(MegatronLMPlugin(tp_degree=4))
    assert str(caught.value) == (
        "conflicting megatron setting 'tp_degree': MegatronLMPlugin(tp_degree=4) in the script but 2 from "
        "environment DRIVETRAIN_BACKEND_CONFIG; remove one of them or make them agree"
    )
    mine = MegatronLMPlugin(pp_degree=1)
    assert resolve_config(mine) is mine and mine.tp_degree == 2  # filled in place, resolved once per run
    assert resolve_config(mine) is mine


def test_accelerate_names_are_exported():
    from drivetrain_megatron import dummies, train_steps

    import drivetrain
    import drivetrain.utils as utils

    assert drivetrain.MegatronLMPlugin is MegatronLMPlugin
    assert utils.MegatronLMDummyScheduler is dummies.MegatronLMDummyScheduler
    assert utils.MegatronLMDummyDataLoader is dummies.MegatronLMDummyDataLoader
    for name in ("AbstractTrainStep", "GPTTrainStep", "BertTrainStep", "T5TrainStep"):
        assert getattr(utils, name) is getattr(train_steps, name)
    assert utils.avg_losses_across_data_parallel_group is train_steps.avg_losses_across_data_parallel_group


@pytest.fixture
def one_process():
    """A real one-process megatron run (a gloo group of one), torn down afterwards."""
    from drivetrain_megatron.process_group import shutdown

    from drivetrain import reset_state

    yield
    reset_state()
    shutdown()


def test_one_process_run_scheduler_and_train_step(one_process):
    from megatron.core import parallel_state

    from drivetrain import Accelerator, DistributedType
    from drivetrain.utils import GPTTrainStep, MegatronLMDummyScheduler, avg_losses_across_data_parallel_group

    plugin = MegatronLMPlugin(gradient_clipping=0, lr_warmup_iters=2, lr_decay_style="linear", min_lr=0.01)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    assert accelerator.distributed_type == DistributedType.MEGATRON_LM
    assert (
        parallel_state.model_parallel_is_initialized() and parallel_state.get_data_parallel_world_size() == 1
    )
    assert accelerator.state.megatron_lm_plugin is plugin

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=6, warmup_num_steps=5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    lrs = []
    for _ in range(6):
        accelerator.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        lrs.append(round(optimizer.param_groups[0]["lr"], 6))
    # the plugin's lr_warmup_iters=2 wins over warmup_num_steps: 0.05, 0.1 (the first step ran at 0), then
    # linear decay to min_lr=0.01 at step 6 (total_num_steps)
    assert lrs == pytest.approx([0.05, 0.1, 0.0775, 0.055, 0.0325, 0.01])
    state = scheduler.state_dict()
    assert state["num_steps"] == 6

    class TokenLoss(torch.nn.Module):
        def forward(self, tokens, position_ids, attention_mask, labels):
            assert attention_mask.shape == (1, 1, 3, 3) and attention_mask[0, 0, 0, 1]
            return (labels == tokens).float() + position_ids.float()

    step = GPTTrainStep(plugin)
    output, loss_func = step.forward_step(iter([{"input_ids": torch.tensor([[5, 5, 6, 7]])}]), TokenLoss())
    loss, logged = loss_func(output)
    # per-token losses (1, 0, 0) + positions (0, 1, 2): mean 4/3, averaged over a data-parallel group of one
    assert loss.item() == pytest.approx(4 / 3) and logged["lm loss"].item() == pytest.approx(4 / 3)
    assert avg_losses_across_data_parallel_group([torch.tensor(2.0), torch.tensor(4.0)]).tolist() == [
        2.0,
        4.0,
    ]


def test_dummy_data_loader_and_bert_step(one_process):
    from drivetrain import Accelerator
    from drivetrain.utils import BertTrainStep, MegatronLMDummyDataLoader

    def datasets(seq_length, **_):
        assert seq_length == 4
        return [list(range(n)) for n in (10, 4, 2)]

    plugin = MegatronLMPlugin(custom_megatron_datasets_provider_function=datasets)
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    megatron_loader = MegatronLMDummyDataLoader(seq_length=4, micro_batch_size=2)
    train, valid, test = accelerator.prepare(megatron_loader, megatron_loader, megatron_loader)
    assert plugin.megatron_dataset_flag is True and plugin.global_batch_size == 2
    assert sorted(torch.cat(list(train)).tolist()) == list(range(10))
    assert [batch.tolist() for batch in valid] == [[0, 1], [2, 3]] and len(test) == 1
    with pytest.raises(ConfigurationError, match="prepared at most 3 times"):
        accelerator.prepare(megatron_loader)

    step = BertTrainStep(plugin)
    batch = {
        "text": torch.tensor([[1, 2]]),
        "types": torch.tensor([[0, 0]]),
        "labels": torch.tensor([[1, 2]]),
        "is_random": torch.tensor([1]),
        "loss_mask": torch.tensor([[1.0, 0.0]]),
        "padding_mask": torch.tensor([[1, 1]]),
    }

    def model(tokens, padding_mask, tokentype_ids, lm_labels):
        return torch.tensor([[0.5, 9.0]]), torch.tensor([[0.0, 0.0]])

    output, loss_func = step.forward_step(iter([batch]), model)
    loss, logged = loss_func(output)
    # masked-LM loss keeps the first token (0.5); sentence order: cross-entropy of equal logits, log 2
    assert loss.item() == pytest.approx(0.5 + 0.693147, abs=1e-5)
    assert logged["sop loss"].item() == pytest.approx(0.693147, abs=1e-5)


def test_indexed_dataset_arguments_name_what_is_missing(tmp_path):
    from drivetrain_megatron.indexed_data import build_gpt_datasets

    config = MegatronLMPlugin().resolved()
    with pytest.raises(ConfigurationError, match="data_path '.*missing' names no indexed dataset"):
        build_gpt_datasets(
            {"data_path": str(tmp_path / "missing"), "seq_length": 4, "eod_token": 0}, config, 1
        )
    with pytest.raises(ConfigurationError, match=r"needs seq_length=\.\.\."):
        build_gpt_datasets({"data_path": str(tmp_path / "missing")}, config, 1)


def test_pipeline_stage_needs_what_the_schedule_calls():
    from drivetrain_megatron.schedule import prepare_stage

    plugin = MegatronLMPlugin(pp_degree=2).resolved()
    with pytest.raises(ConfigurationError, match="needs a set_input_tensor"):
        prepare_stage(torch.nn.Linear(2, 2), plugin)

    class Stage(torch.nn.Linear):
        def set_input_tensor(self, tensors):
            self.input_tensor = tensors

    with pytest.raises(ConfigurationError, match="model.config needs hidden_size"):
        prepare_stage(Stage(2, 2), plugin)
    config = plugin.model_parallel_config(num_layers=2, hidden_size=2, num_attention_heads=1)
    stage = Stage(2, 2)
    stage.config = config
    with pytest.raises(ConfigurationError, match="pp_degree=2 needs seq_length"):
        prepare_stage(stage, plugin)


def test_distributed_optimizer_is_refused_off_cuda_with_the_reason():
    from types import SimpleNamespace

    from drivetrain_megatron.training import prepare_optimizer

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    accelerator = SimpleNamespace(device=torch.device("cpu"))
    with pytest.raises(
        ConfigurationError,
        match="use_distributed_optimizer=True needs CUDA: .*torch.cuda.*on cpu leave it off",
    ):
        prepare_optimizer(optimizer, accelerator, MegatronLMPlugin(use_distributed_optimizer=True).resolved())


def test_adamw_settings_become_megatron_cores_optimizer_config():
    from drivetrain_megatron.optimizer import optimizer_config

    weights = [torch.nn.Parameter(torch.zeros(2))]
    adamw = torch.optim.AdamW(weights, lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)
    plugin = MegatronLMPlugin(gradient_clipping=0.5, use_distributed_optimizer=True).resolved()
    settings = optimizer_config(adamw, plugin, "bf16")
    assert (settings.optimizer, settings.lr, settings.min_lr, settings.weight_decay) == (
        "adam",
        3e-4,
        0.0,
        0.05,
    )
    assert (settings.adam_beta1, settings.adam_beta2, settings.adam_eps) == (0.8, 0.95, 1e-6)
    assert settings.decoupled_weight_decay is True
    assert (settings.clip_grad, settings.use_distributed_optimizer) == (0.5, True)
    assert (settings.bf16, settings.fp16) == (True, False)
    # a schedule already at its first (warm-up) rate: megatron-core gets the peak rate
    torch.optim.lr_scheduler.LambdaLR(adamw, lambda step: 0.0)
    assert adamw.param_groups[0]["lr"] == 0.0 and optimizer_config(adamw, plugin).lr == 3e-4
    # torch's Adam adds the decay to the gradient: megatron-core's coupled mode
    adam = torch.optim.Adam(weights, lr=1e-3, weight_decay=0.1)
    coupled = optimizer_config(adam, MegatronLMPlugin().resolved())
    assert coupled.decoupled_weight_decay is False and coupled.bf16 is False
    assert (coupled.clip_grad, coupled.use_distributed_optimizer) == (1.0, False)


def test_sgd_settings_become_megatron_cores_optimizer_config():
    from drivetrain_megatron.optimizer import optimizer_config

    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.2, momentum=0.7, weight_decay=0.01)
    settings = optimizer_config(sgd, MegatronLMPlugin(gradient_clipping=0.0).resolved())
    assert (settings.optimizer, settings.lr, settings.sgd_momentum, settings.weight_decay) == (
        "sgd",
        0.2,
        0.7,
        0.01,
    )
    assert settings.clip_grad == 0.0


def test_optimizers_megatron_core_cannot_run_are_refused_by_name():
    from drivetrain_megatron.optimizer import optimizer_config

    weights = [torch.nn.Parameter(torch.zeros(2))]
    plugin = MegatronLMPlugin().resolved()
    with pytest.raises(ConfigurationError, match="torch.optim.rmsprop.RMSprop; pass torch.optim.AdamW"):
        optimizer_config(torch.optim.RMSprop(weights, lr=0.1), plugin)
    with pytest.raises(ConfigurationError, match=r"SGD\(nesterov=True\) has no equivalent"):
        optimizer_config(torch.optim.SGD(weights, lr=0.1, momentum=0.9, nesterov=True), plugin)
    other = [torch.nn.Parameter(torch.zeros(2))]
    groups = torch.optim.AdamW([{"params": weights}, {"params": other, "lr": 0.5}], lr=0.1)
    with pytest.raises(ConfigurationError, match="AdamW parameter group 1 has lr=0.5 but group 0 has 0.1"):
        optimizer_config(groups, plugin)


def test_the_distributed_optimizer_with_sgd_is_refused_before_megatron_core_asserts():
    from drivetrain_megatron.optimizer import optimizer_config

    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    plugin = MegatronLMPlugin(use_distributed_optimizer=True).resolved()
    with pytest.raises(ConfigurationError, match="use_distributed_optimizer=True needs torch.optim.AdamW"):
        optimizer_config(sgd, plugin)
    adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    assert optimizer_config(adam, plugin).use_distributed_optimizer is True
