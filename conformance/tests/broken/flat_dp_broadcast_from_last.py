"""flat-dp, broken: the wrapper broadcasts the last process's weights instead of process 0's (caught by
prepare_synchronises_weights: every process agrees, on the wrong weights)."""

from flat_dp import FlatDataParallel, backward, declaring, setup_process_group  # noqa: F401

from drivetrain import hookimpl

PLUGIN_INFO = declaring("no")  # fewer precisions, fewer runs: the mistake shows in this one


@hookimpl
def wrap_model(model, accelerator, evaluation_mode):
    if evaluation_mode or accelerator.num_processes == 1:
        return None
    return FlatDataParallel(model, source=accelerator.num_processes - 1)
