"""flat-dp, broken: backward averages the gradients of the first model the Accelerator prepared only
(``accelerator.prepared.models[0]``), although ``prepared.models`` holds every model prepared so far, in
order: a model prepared later by the same Accelerator never synchronises (caught by no_sync, whose second
model is such a one)."""

from flat_dp import declaring, reference_backward, setup_process_group, wrap_model, wrappers  # noqa: F401

from drivetrain import hookimpl

PLUGIN_INFO = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one


@hookimpl
def backward(loss, accelerator, backward_kwargs):
    if accelerator.num_processes == 1:
        return None
    reference_backward(loss, accelerator, backward_kwargs)
    first = wrappers(accelerator)[:1]  # the mistake
    for wrapper in first:
        if wrapper.require_sync:
            wrapper.average_gradients()
    return True
