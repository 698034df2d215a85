"""flat-dp, broken: the flat all-reduce sums the gradients without dividing by the number of processes.
Adam and clipping hide the scale from every property but multi_process_matches_combined_batch (SGD), which
catches it on purpose."""

from flat_dp import declaring, reference_backward, setup_process_group, wrap_model, wrappers  # noqa: F401

from drivetrain import hookimpl

PLUGIN_INFO = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one


@hookimpl
def backward(loss, accelerator, backward_kwargs):
    if accelerator.num_processes == 1:
        return None
    reference_backward(loss, accelerator, backward_kwargs)
    for wrapper in wrappers(accelerator):
        if wrapper.require_sync:
            wrapper.average_gradients(divide=False)  # the mistake
    return True
