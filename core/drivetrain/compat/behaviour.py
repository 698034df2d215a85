"""Behaviour Accelerate ties to a backend or precision by name (to become plugin declarations)."""

#: Accelerate's distributed types of plain data parallelism, whose models torch's ``Join`` can shadow in
#: ``join_uneven_inputs`` (sharded or compiled engines run collectives Join does not know).
JOINABLE_DISTRIBUTED_TYPES = frozenset(
    {"MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_XPU", "MULTI_HPU", "MULTI_SDAA", "MULTI_MUSA"}
)

#: Accelerate's ``ParallelismConfig.sp_backend`` values (sequence parallelism run by a backend's own groups);
#: the first is the default, as in Accelerate.
SEQUENCE_PARALLEL_BACKENDS = ("deepspeed",)

#: Distributed types whose parameters are sharded: ``get_grad_scaler`` gives torch's sharded scaler there.
ACCELERATE_SHARDED_SCALER_TYPES = ("FSDP",)

#: Mixed precisions whose autocast computes in bfloat16 (``get_mixed_precision_context_manager``).
ACCELERATE_BF16_AUTOCAST_PRECISIONS = ("bf16", "fp8")

#: torch's gradient scaler for sharded parameters (``get_grad_scaler``), as ``module:attribute``.
SHARDED_GRAD_SCALER = "torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler"
