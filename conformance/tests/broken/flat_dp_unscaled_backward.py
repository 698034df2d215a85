"""flat-dp, broken: backward re-implemented as loss.backward(), forgetting the fp16 GradScaler, whose
unscaling then divides unscaled gradients (caught by the properties that train in fp16)."""

from flat_dp import declaring, setup_process_group, wrap_model, wrappers  # noqa: F401

from drivetrain import hookimpl

PLUGIN_INFO = declaring("fp16")  # fewer precisions, fewer runs: the mistake shows in this one


@hookimpl
def backward(loss, accelerator, backward_kwargs):
    if accelerator.num_processes == 1:
        return None
    loss.backward(**backward_kwargs)  # the mistake: accelerator.scaler.scale(loss) under fp16
    for wrapper in wrappers(accelerator):
        if wrapper.require_sync:
            wrapper.average_gradients()
    return True
