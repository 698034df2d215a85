"""Checkpoints of one Accelerator: save_state / load_state and what they call around the backend.

The order of a save: pre-hooks see the state dicts; the backend's ``save_state`` hook writes models,
optimizers and schedulers into a staging folder; the kernel adds RNG states, the GradScaler, data loader
positions and registered objects; once every process reports success, the writing process fsyncs and
checksums every file, lists them in a manifest and puts them in place (``checkpoint/publishing.py``: a new
folder is renamed into place, an existing one gets only the checkpoint's files), then prunes old automatic
checkpoints — on a background thread unless the save is blocking (see ``checkpoint/finishing.py``). A
failure on any process makes every process raise (see ``_agree``) instead of leaving the others waiting.

The order of a load: a save still finishing is waited for; the checking process reads the manifest, checks
names and sizes, and starts checksumming every file in background threads; the kernel reads its own files
and checks them against their objects (``checkpoint/state_checks.py``); the backend reads and checks its
files (the reference backend: everything, into memory); then all processes agree that the hashes matched
and nothing failed, and only then is anything applied.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import shutil
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.hooks import RemovableHandle

from drivetrain.checkpoint import files, publishing, rotation
from drivetrain.checkpoint import manifest as manifests
from drivetrain.checkpoint.dcp_reading import dcp_failure
from drivetrain.checkpoint.files import atomic_write
from drivetrain.checkpoint.finishing import FinishingSave
from drivetrain.checkpoint.model_files import write_model_files
from drivetrain.checkpoint.serialization import deduplicate_shared, save_safetensors_atomically
from drivetrain.checkpoint.training_objects import (
    read_kernel_objects,
    write_kernel_objects,
    writes_shared_files,
)
from drivetrain.errors import CheckpointError, CheckpointWarning, ConfigurationError, DrivetrainError

if TYPE_CHECKING:
    from drivetrain.contract.arguments import PluginAccelerator as Accelerator
    from drivetrain.contract.arguments import PreparedObjects
    from drivetrain.contract.calling import PluginStack

logger = logging.getLogger(__name__)

CHECKPOINTS_FOLDER = "checkpoints"


class Checkpointer:
    """The checkpoints of one :class:`~drivetrain.Accelerator` (see docs/checkpointing.md); the Accelerator's
    ``save_state``, ``load_state``, ``save_model`` ... call it.

    It depends on what it is given: the plugins to call (``plugins``), what ``prepare`` has seen
    (``prepared``, plus the objects registered for checkpointing), where checkpoints go
    (``project_configuration``) and the Accelerator, which it hands to the plugins' hooks and whose public
    ``scaler``, ``step``, ``unwrap_model`` and process facts it reads (``step`` is restored on load).
    """

    def __init__(
        self,
        accelerator: Accelerator,
        plugins: PluginStack,
        prepared: PreparedObjects,
        project_configuration: Any,
    ) -> None:
        self.accelerator = accelerator
        self.plugins = plugins
        self.prepared = prepared
        self.project_configuration = project_configuration
        self._save_state_pre_hooks: dict[int, Callable] = collections.OrderedDict()
        self._load_state_pre_hooks: dict[int, Callable] = collections.OrderedDict()
        #: the last save whose background finish was not collected yet
        self._finishing_save: FinishingSave | None = None
        #: the project_dir writer lock this Checkpointer holds (taken by its first automatic save)
        self._writer_lock: str | None = None

    # -- registration ------------------------------------------------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load ``objects`` with every checkpoint (each needs ``state_dict`` and ``load_state_dict``)."""
        invalid = [
            f"Item at index {index} ({type(obj).__name__})"
            for index, obj in enumerate(objects)
            if not (
                callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
            )
        ]
        if invalid:
            raise ValueError(
                "register_for_checkpointing needs objects with both a state_dict() and a load_state_dict() "
                f"method; these lack one: {', '.join(invalid)}"
            )
        self.prepared.custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in :meth:`save_state` before anything is written.
        ``weights`` holds the models' state dicts; remove one to keep that model out of the checkpoint.
        ``output_dir`` is the folder being built (renamed into place once complete): write extra files there."""
        handle = RemovableHandle(self._save_state_pre_hooks)
        self._save_state_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in :meth:`load_state` before anything is read; remove a model from
        ``models`` to keep it from being loaded."""
        handle = RemovableHandle(self._load_state_pre_hooks)
        self._load_state_pre_hooks[handle.id] = hook
        return handle

    # -- where checkpoints go ------------------------------------------------------------------------------
    def _checkpoints_root(self) -> str:
        project_dir = self.project_configuration.project_dir
        if project_dir is None:
            raise ConfigurationError(
                "automatic_checkpoint_naming needs a project directory: pass project_dir= to the Accelerator "
                "or ProjectConfiguration(project_dir=...)"
            )
        return os.path.join(os.path.abspath(project_dir), CHECKPOINTS_FOLDER)

    def _save_location(self, output_dir: str | os.PathLike | None) -> str:
        config = self.project_configuration
        if config.automatic_checkpoint_naming:
            return os.path.join(self._checkpoints_root(), f"checkpoint_{config.iteration}")
        if output_dir is None:
            raise ValueError(
                "save_state() needs output_dir, unless ProjectConfiguration(automatic_checkpoint_naming=True)"
            )
        return os.fspath(output_dir)

    def _become_the_writer(self) -> None:
        """Hold the lock that makes this run the only one saving into ``project_dir/checkpoints`` (see
        :mod:`drivetrain.checkpoint.rotation`), until this Checkpointer is gone or the process ends."""
        if self._writer_lock is None:
            self._writer_lock = rotation.acquire_writer_lock(self._checkpoints_root())
            weakref.finalize(self, rotation.release_writer_lock, self._writer_lock)

    def _gather(self, value: Any) -> list[Any]:
        return self.accelerator.state.collectives.all_gather_object(value)

    # -- agreement between processes -----------------------------------------------------------------------
    def _writer_rank(self) -> int:
        """Global rank of the process that writes (and on load, verifies) this process's shared files: the
        main process, or this machine's local main process with ``save_on_each_node``."""
        if self.project_configuration.save_on_each_node:
            return self.accelerator.process_index - self.accelerator.local_process_index
        return 0

    def _agree(
        self, what: str, error: BaseException | None, payload: Any = None, after: str = ""
    ) -> list[Any]:
        """Every process's ``payload`` for a step they all run, once each says whether it succeeded. If one
        failed, every process raises a :class:`CheckpointError` naming the failed ranks (rather than the
        others waiting forever at the next collective); alone, the original error is raised."""
        report = (payload, None if error is None else f"{type(error).__name__}: {error}")
        gathered = self._gather(report)
        failed = [(rank, message) for rank, (_, message) in enumerate(gathered) if message is not None]
        if failed:
            if error is not None and len(gathered) == 1:
                if isinstance(error, DrivetrainError) or not after:
                    raise error
                # A raw OSError ("No space left on device") says neither which operation failed nor what
                # was kept: say both.
                raise CheckpointError(f"{what} failed: {type(error).__name__}: {error}{after}") from error
            if len(failed) == 1:
                where = f"rank {failed[0][0]}: {failed[0][1]}"
            else:
                ranks = ", ".join(str(rank) for rank, _ in failed)
                where = f"ranks {ranks} (" + "; ".join(f"rank {r}: {message}" for r, message in failed) + ")"
            raise CheckpointError(f"{what} failed on {where}{after}") from error
        return [payload for payload, _ in gathered]

    # -- save ----------------------------------------------------------------------------------------------
    def save_state(
        self,
        output_dir: str | os.PathLike | None = None,
        safe_serialization: bool = True,
        blocking: bool | None = None,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, GradScaler, RNG states, data loader positions and registered
        objects into one folder, atomically; returns the folder. ``save_model_func_kwargs`` are passed on to
        the backend's ``save_state`` hook (``save_kwargs``).

        Returns once the files are written. Unless ``blocking`` (default: not
        ``ProjectConfiguration.async_save``), the checkpoint is then finished in the background — files
        fsynced, manifest written, folder renamed into place, old checkpoints pruned — and the folder
        appears when that is done; :meth:`wait_for_checkpoint` waits for it, and every later checkpoint
        operation, :meth:`wait_for_everyone` and :meth:`end_training` do so first.

        If any process fails while writing, every process raises a :class:`CheckpointError` naming it, the
        unfinished folder is removed and earlier checkpoints stay as they were (a failure while finishing
        in the background is raised by :meth:`wait_for_checkpoint` the same way)."""
        self.wait_for_checkpoint()
        location = os.path.abspath(self._save_location(output_dir))
        if self.accelerator.num_processes > 1:
            # One checkpoint, in the writer's folder: processes that name different folders (each its own
            # tempfile.TemporaryDirectory(), as scripts written for Accelerate do) all write there, and
            # load_state reads the folder the writer names, whatever the others pass.
            location = self._gather(location)[self._writer_rank()]
        writer = writes_shared_files(self.accelerator)
        config = self.project_configuration
        not_written = f"; {location} was not written and earlier checkpoints are untouched"
        error: BaseException | None = None
        temporary = None
        if writer:
            try:
                if config.automatic_checkpoint_naming:
                    self._become_the_writer()
                    if os.path.exists(location):
                        raise CheckpointError(
                            f"checkpoint folder {location} already exists; set "
                            "accelerator.project_configuration.iteration to the number to continue from"
                        )
                os.makedirs(os.path.dirname(location), exist_ok=True)
                temporary = publishing.start_staging(location)
            except Exception as exc:
                error = exc
        # Every process writes into the folder its writer staged (inside or beside the destination).
        temporary = self._agree(f"save_state into {location}", error, temporary, after=not_written)[
            self._writer_rank()
        ]
        assert temporary is not None
        wait = (not config.async_save) if blocking is None else blocking
        checksums = files.SHA256_CHECKSUMS if config.checkpoint_sha256 else files.DEFAULT_CHECKSUMS
        try:
            with files.blocking_save(wait, checksums):
                self._write_checkpoint_files(temporary, safe_serialization, save_model_func_kwargs)
        except (KeyboardInterrupt, SystemExit):
            if writer:
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        except BaseException as exc:  # torch's CheckpointException is a BaseException: agree on it too
            error = exc if isinstance(exc, Exception) else dcp_failure(exc, "writing the checkpoint files")
        try:
            self._agree(f"save_state into {location}", error, after=not_written)
        except BaseException:
            if writer:  # no debris: the unfinished folder goes, whatever the failure
                shutil.rmtree(temporary, ignore_errors=True)
            raise

        finish = None
        if writer:
            # Everything the finishing thread needs is fixed now: the training loop goes on meanwhile.
            metadata = {
                "step": self.accelerator.step,
                "num_processes": self.accelerator.num_processes,
                "iteration": config.iteration,
                "safe_serialization": safe_serialization,
            }
            automatic = config.automatic_checkpoint_naming
            limit = config.total_limit if automatic else None
            finish = functools.partial(
                _finish_save, temporary, location, metadata, limit, checksums, replace=not automatic
            )
        number = config.iteration if config.automatic_checkpoint_naming else None
        self._finishing_save = FinishingSave(location, finish, number)
        config.iteration += 1
        if wait:
            self.wait_for_checkpoint()
        return location

    def wait_for_checkpoint(self) -> None:
        """Wait until the last :meth:`save_state` is complete on disk (folder renamed into place, old
        checkpoints pruned); returns at once when nothing is finishing. Every process must call it, like
        :meth:`wait_for_everyone`. Raises :class:`CheckpointError` on every process if finishing failed on
        one (that checkpoint was not written; earlier ones are untouched)."""
        pending = self._finishing_save
        if pending is None:
            return
        self._finishing_save = None
        error = pending.wait()
        for warning in pending.warnings:
            warnings.warn(warning, CheckpointWarning, stacklevel=3)
        what = f"finishing save_state into {pending.location}"
        after = f"; {pending.location} was not written and earlier checkpoints are untouched"
        try:
            if self.accelerator.num_processes > 1:
                self._agree(what, error, after=after)
            elif error is not None:
                raise CheckpointError(f"{what} failed: {type(error).__name__}: {error}{after}") from error
        except CheckpointError:
            # As after a save that failed before returning: the next automatic save takes the same number.
            config = self.project_configuration
            if pending.iteration is not None and config.iteration == pending.iteration + 1:
                config.iteration = pending.iteration
            raise

    def _write_checkpoint_files(
        self, temporary: str, safe_serialization: bool, save_model_func_kwargs: dict[str, Any]
    ) -> None:
        """Pre-hooks, then the backend's files, then the kernel's, into the temporary folder."""
        models = list(self.prepared.models)
        # The user's module's own state dict (not get_state_dict): a sharded backend saves its shards itself
        # and must not gather the whole model on every save just for the pre-hooks.
        weights = [self.accelerator.unwrap_model(model).state_dict() for model in models]
        pairs = list(zip(models, weights))
        for hook in list(self._save_state_pre_hooks.values()):
            # Hooks write their extra files (configs, models they save themselves) into the folder being
            # built, so the manifest covers them and the rename publishes them with the rest.
            hook(models, weights, temporary)
        # A hook drops a model from the checkpoint by removing its state dict from ``weights``.
        kept = {id(state) for state in weights}
        saved = [(model, state) for model, state in pairs if id(state) in kept]
        written = self.plugins.call(
            "save_state",
            output_dir=temporary,
            accelerator=self.accelerator,
            models=[model for model, _ in saved],
            weights=[state for _, state in saved],
            optimizers=list(self.prepared.optimizers),
            schedulers=list(self.prepared.schedulers),
            safe_serialization=safe_serialization,
            save_kwargs=dict(save_model_func_kwargs),
        )
        if not written:
            raise CheckpointError("no plugin wrote the checkpoint (every save_state hook returned None)")
        write_kernel_objects(temporary, self.accelerator, self.prepared)
        files.on_stage("objects_written", temporary)

    # -- load ----------------------------------------------------------------------------------------------
    def _resolve_checkpoint(
        self, input_dir: str | None, verify_manifest: bool | str
    ) -> tuple[str, manifests.Verification | None]:
        """(folder, its checksums being checked) on a process that checks files; raises CheckpointError."""
        checksum = "fast" if verify_manifest is True else str(verify_manifest)
        if input_dir is None:
            root = self._checkpoints_root()
            if verify_manifest:
                return rotation.newest_verified(root, checksum)
            complete = rotation.complete_checkpoints(root)
            if not complete:
                raise CheckpointError(
                    f"no complete checkpoint under {root} (a folder counts once its {manifests.MANIFEST_NAME} "
                    "lists files that are all present)"
                )
            input_dir = complete[-1]
        publishing.recover(input_dir)
        if not verify_manifest:
            if not os.path.isdir(input_dir):
                raise CheckpointError(f"checkpoint folder {input_dir} does not exist")
            return input_dir, None
        return input_dir, manifests.start_verification(input_dir, checksum)

    def _reads_while_verifying(self) -> bool:
        """Whether the plugin that answers ``load_state`` takes ``verified``: it reads while the files'
        hashes are checked and applies nothing before ``verified()`` returned."""
        implementations = self.plugins.hook.load_state.get_hookimpls()
        # pluggy calls the last registered first: that implementation answers (they all return True).
        return bool(implementations) and "verified" in implementations[-1].argnames

    def load_state(
        self,
        input_dir: str | os.PathLike | None = None,
        load_kwargs: dict[str, Any] | None = None,
        **load_model_func_kwargs: Any,
    ) -> str:
        """Restore everything :meth:`save_state` wrote; returns the folder loaded.

        With no ``input_dir``, picks the newest ``project_dir/checkpoints/checkpoint_<n>`` whose files all
        match their manifest (``automatic_checkpoint_naming``), with a :class:`CheckpointWarning` for each
        newer one it skipped; a save still finishing in the background is waited for first. Every file is
        checked against the manifest (size and xxh3-128 checksums; ``verify_manifest="sha256"`` checks the
        sha256 digests instead), and everything read is checked against the object it is for (names and
        shapes, parameter groups, the layout of scheduler, scaler, loader and random states, the step), before
        anything is applied: a mismatch raises one :class:`CheckpointError` naming the file and leaves models,
        optimizers and the rest as they were. Only the files the manifest lists are read. ``map_location`` ("cpu" by
        default, "on_device" for this process's device) places loaded optimizer states; ``load_kwargs`` go to
        ``torch.load`` — ``{"weights_only": False}`` is the explicit opt-out of safe unpickling, for
        checkpoints you trust. ``verify_manifest=False`` loads a folder without a manifest (e.g. written by
        another tool).
        """
        verify_manifest = load_model_func_kwargs.pop("verify_manifest", True)
        if verify_manifest not in (True, False, *manifests.CHECKSUM_CHOICES):
            raise ValueError(
                f"load_state(verify_manifest={verify_manifest!r}): valid values are True (the manifest's fast "
                "checksums), 'sha256' (its sha256 digests) and False (no manifest needed)"
            )
        self.wait_for_checkpoint()
        map_location = load_model_func_kwargs.pop("map_location", None)
        if input_dir is None and not self.project_configuration.automatic_checkpoint_naming:
            raise ValueError(
                "load_state() needs input_dir, unless ProjectConfiguration(automatic_checkpoint_naming=True)"
            )
        if input_dir is not None:
            input_dir = os.path.abspath(os.fspath(input_dir))

        resolved: tuple[str | None, dict[str, Any]] = (None, {})
        verification = None
        error: Exception | None = None
        if writes_shared_files(self.accelerator):
            try:
                folder, verification = self._resolve_checkpoint(input_dir, verify_manifest)
                resolved = (folder, verification.manifest.get("metadata", {}) if verification else {})
                _check_step(folder, resolved[1])
            except CheckpointError as exc:
                error = exc
        gathered = self._agree("load_state", error, resolved)
        # Each process loads the folder its writer checked (its own machine's copy with save_on_each_node).
        location, metadata = gathered[self._writer_rank()]
        assert location is not None
        metadata = metadata or {}
        gate = _VerificationGate(self, verification, location)

        if map_location is None or map_location == "on_device":
            map_location = self.accelerator.device if map_location == "on_device" else "cpu"
        models = list(self.prepared.models)
        # A plugin that takes ``verified`` reads while the hashes are checked and applies only after
        # verified(); anything else (another backend, a pre-hook reading its own files) starts after the check.
        deferred = not self._load_state_pre_hooks and self._reads_while_verifying()
        if not deferred:
            gate.wait()
        for hook in list(self._load_state_pre_hooks.values()):
            hook(models, location)
        load_kwargs = dict(load_kwargs or {})
        # The kernel's files are read and checked before the backend applies anything, so a bad one leaves
        # all untouched: read now, and tried on their objects once the checksums matched (in the gate).
        kernel_objects = None
        error = None
        try:
            kernel_objects = read_kernel_objects(
                location, self.accelerator, self.prepared, map_location, load_kwargs
            )
        except Exception as exc:
            error = exc
        if deferred:
            if error is not None:
                gate.wait(error)
            assert kernel_objects is not None
            gate.checks = kernel_objects.check
        else:
            if error is None:
                assert kernel_objects is not None
                try:
                    kernel_objects.check()
                except Exception as exc:
                    error = exc
            self._agree(f"load_state({location})", error, after="; nothing was loaded from the checkpoint")
        assert kernel_objects is not None
        loaded = self.plugins.call(
            "load_state",
            input_dir=location,
            accelerator=self.accelerator,
            models=models,
            optimizers=list(self.prepared.optimizers),
            schedulers=list(self.prepared.schedulers),
            map_location=map_location,
            load_kwargs=load_kwargs,
            verified=gate.wait,
        )
        gate.wait()
        if not loaded:
            raise CheckpointError("no plugin loaded the checkpoint (every load_state hook returned None)")
        kernel_objects.apply()
        if "step" in metadata:
            self.accelerator.step = metadata["step"]
        number = rotation.checkpoint_number(location)
        config = self.project_configuration
        if (
            config.automatic_checkpoint_naming
            and number is not None
            and config.project_dir is not None
            and (os.path.dirname(location) == os.path.abspath(self._checkpoints_root()))
        ):
            config.iteration = number + 1
        return location

    # -- single objects and models ---------------------------------------------------------------------------
    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The full state dict of a prepared model; ``unwrap`` takes the user's module's (no ``module.``
        prefix).

        A backend whose wrapped model holds only a shard (FSDP, DeepSpeed ZeRO-3) gives its wrapper a
        ``full_state_dict()`` method — part of the model protocol in docs/hooks.md — that gathers the whole
        state dict (on CPU, complete on the main process); it is used whenever present.
        """
        gather_full = getattr(model, "full_state_dict", None)
        if callable(gather_full):
            return gather_full()
        if unwrap:
            model = self.accelerator.unwrap_model(model)
        return onloaded_state_dict(model)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write ``model``'s weights (wrapped or not) into ``save_directory`` for ``load_checkpoint_in_model``
        or transformers: ``model.safetensors``, or shards of at most ``max_shard_size`` with
        ``model.safetensors.index.json`` (``pytorch_model*.bin`` names without ``safe_serialization``)."""
        save_directory = os.fspath(save_directory)
        if os.path.isfile(save_directory):
            raise ValueError(f"save_directory {save_directory} is a file; save_model needs a directory")
        state_dict = self.get_state_dict(model, unwrap=True)
        if writes_shared_files(self.accelerator):
            write_model_files(state_dict, save_directory, max_shard_size, safe_serialization)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save`` (or safetensors for a dict of tensors) once per machine set, atomically: the main
        process writes, or every machine's local main process with ``save_on_each_node``."""
        save(
            obj,
            f,
            save_on_each_node=self.project_configuration.save_on_each_node,
            safe_serialization=safe_serialization,
        )


def onloaded_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with weights that an offload hook keeps on CPU or disk (``meta`` in the module
    between forwards, after ``dispatch_model``/``cpu_offload``) read back onto the CPU, so a saved model is
    complete. The offload plugin provides the hooks, hence its ``align_module_device``."""
    state_dict = model.state_dict()
    if not any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in state_dict.values()):
        return state_dict
    from drivetrain.contract.exports import resolve_export

    has_offloaded_params = resolve_export("has_offloaded_params")
    align_module_device = resolve_export("align_module_device")
    for prefix, module in model.named_modules():
        if not has_offloaded_params(module):
            continue
        with align_module_device(module, "cpu"):
            for name, tensor in module.named_parameters(recurse=False):
                state_dict[f"{prefix}.{name}" if prefix else name] = tensor.detach().clone()
    missing = [
        key for key, t in state_dict.items() if isinstance(t, torch.Tensor) and t.device.type == "meta"
    ]
    if missing:
        raise CheckpointError(
            f"cannot save {len(missing)} weights on the meta device that no offload hook holds (first: "
            f"{missing[0]}); load the weights (load_checkpoint_in_model) before saving"
        )
    return state_dict


def _finish_save(
    temporary: str,
    location: str,
    metadata: dict[str, Any],
    total_limit: int | None,
    checksums: tuple[str, ...] = files.DEFAULT_CHECKSUMS,
    replace: bool = True,
) -> list[str]:
    """The writing process's part of a save after every process wrote its files: make them durable and
    checksum them, write the manifest, put the checkpoint in place (``replace``: into an existing folder,
    beside the user's files; otherwise a folder that exists already is refused), then prune old automatic
    checkpoints. Runs on a background thread (see :mod:`drivetrain.checkpoint.finishing`).

    Pruning is not part of the save: once the checkpoint is in place it is complete whatever happens
    to older ones, so a failed prune comes back as a warning (returned), never as a failed save."""
    try:
        manifests.write_manifest(temporary, metadata, checksums)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    publishing.publish(temporary, location, replace=replace)
    if total_limit is None:
        return []
    try:
        rotation.prune(os.path.dirname(location), total_limit, keep=location)
    except Exception as exc:
        left = "; ".join(exc.left) if isinstance(exc, rotation.PruneError) else f"{type(exc).__name__}: {exc}"
        return [
            f"checkpoint {location} is complete, but pruning older checkpoints (total_limit={total_limit}) "
            f"left behind: {left}. Delete it by hand; later saves are not affected"
        ]
    return []


class _VerificationGate:
    """The point of a load after which what was read may be applied: the checking process's hashes all
    matched, and every process read its part without error (all agree, so none applies alone)."""

    def __init__(
        self, checkpointer: Checkpointer, verification: manifests.Verification | None, location: str
    ) -> None:
        self._checkpointer = checkpointer
        self._verification = verification
        self._location = location
        self._done = False
        #: what else must pass once the checksums matched, before anything is applied
        self.checks: Callable[[], None] | None = None

    def wait(self, error: Exception | None = None) -> None:
        """Collective: every process calls it once (later calls return at once, or raise ``error``)."""
        if self._done:
            if error is not None:
                raise error
            return
        self._done = True
        if error is None and self._verification is not None:
            try:
                self._verification.wait()
            except CheckpointError as exc:
                error = exc
        if error is None and self.checks is not None:
            try:
                self.checks()
            except Exception as exc:
                error = exc
        self._checkpointer._agree(
            f"load_state({self._location})", error, after="; nothing was loaded from the checkpoint"
        )


def _check_step(folder: str, metadata: dict[str, Any]) -> None:
    """The manifest's ``metadata.step`` is restored into ``Accelerator.step``: a whole number >= 0."""
    step = metadata.get("step", 0)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(
            f"{os.path.join(folder, manifests.MANIFEST_NAME)} has metadata.step={step!r}; a whole number >= 0 "
            "is needed: the manifest is damaged"
        )


def save(obj: Any, f: Any, save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """Accelerate's ``utils.save``: write ``obj`` on the main process (each machine's local main process with
    ``save_on_each_node``), through a temporary file renamed into place. ``safe_serialization`` writes a
    dict of tensors as safetensors (tied tensors once)."""
    from drivetrain.state import PartialState

    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if safe_serialization:
        if not isinstance(f, (str, os.PathLike)):
            raise ValueError("save(..., safe_serialization=True) needs a file path, not a file object")
        tensors, aliases = deduplicate_shared(obj)
        if aliases:
            logger.warning(
                "Removed shared tensor %s while saving %s: safetensors stores shared memory once; each name is "
                "filled again when loaded into the model",
                sorted(aliases),
                os.fspath(f),
            )
        save_safetensors_atomically(tensors, os.fspath(f))
    elif isinstance(f, (str, os.PathLike)):
        atomic_write(os.fspath(f), lambda out: torch.save(obj, out))
    else:
        torch.save(obj, f)


def clean_state_dict_for_safetensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accelerate's name: ``state_dict`` without the second and later names of tied tensors."""
    return deduplicate_shared(state_dict)[0]
