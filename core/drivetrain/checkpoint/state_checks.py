"""Whether a saved state is what the live object holds: the checks ``load_state`` runs on everything it
restores before it changes anything (issue 29: verify everything, then apply).

A model's names and shapes and an optimizer's parameter groups are compared with the live objects. A
scheduler's or GradScaler's state must be a dict holding every public attribute the live one has, each of
the same kind (missing private attributes are tolerated: torch adds some between releases). What only an
object's own ``load_state_dict`` can judge (a registered object, the random generators) is tried on the live
object and put back at once, so the failure surfaces here and nothing stays changed.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

from drivetrain.checkpoint.serialization import _shared_groups
from drivetrain.errors import CheckpointError
from drivetrain.safetensors_reader import read_header


def check_model_source(model: torch.nn.Module, source: Any, where: str) -> None:
    """Raise :class:`CheckpointError` unless ``source`` (a safetensors path or a state dict) fits ``model``
    exactly (names, shapes; tied weights saved once count for every name), before anything is copied."""
    targets = model.state_dict()
    if isinstance(source, str):
        shapes = {name: tuple(record.shape) for name, record in read_header(source).items()}
    elif isinstance(source, dict):
        shapes = {
            name: tuple(value.shape) for name, value in source.items() if isinstance(value, torch.Tensor)
        }
    else:
        raise CheckpointError(f"{where} holds a {type(source).__name__}, not a state dict")
    groups = _shared_groups(targets)
    unexpected = [name for name in shapes if name not in targets]
    mismatched = [
        f"{name}: checkpoint {shapes[name]}, model {tuple(targets[name].shape)}"
        for name in shapes
        if name in targets
        and isinstance(targets[name], torch.Tensor)
        and shapes[name] != tuple(targets[name].shape)
    ]
    missing = [
        name
        for name, value in targets.items()
        if isinstance(value, torch.Tensor) and not any(other in shapes for other in groups.get(name, [name]))
    ]
    problems = []
    if mismatched:
        problems.append("shape mismatch for " + "; ".join(mismatched[:10]))
    if missing:
        problems.append(f"missing keys {missing[:10]}{' ...' if len(missing) > 10 else ''}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
    if problems:
        raise CheckpointError(f"cannot load {where} into {type(model).__name__}: " + "; ".join(problems))


def check_optimizer_layout(optimizer: Any, state: Any, where: str) -> None:
    """Raise :class:`CheckpointError` unless the saved optimizer state has this optimizer's parameter groups
    (their number, and the number of parameters in each): what ``load_state_dict`` would refuse, checked
    before anything is applied."""
    inner = getattr(optimizer, "optimizer", optimizer)
    saved_groups = state.get("param_groups") if isinstance(state, dict) else None
    if not isinstance(saved_groups, list) or not all(
        isinstance(group, dict) and isinstance(group.get("params"), list) for group in saved_groups
    ):
        raise CheckpointError(f"{where} is not an optimizer state (no list of parameter groups)")
    entries = state.get("state", {})
    if not isinstance(entries, dict) or not all(isinstance(entry, dict) for entry in entries.values()):
        raise CheckpointError(
            f"{where} is not an optimizer state (its 'state' is not one dict per parameter)"
        )
    listed = {identifier for group in saved_groups for identifier in group["params"]}
    unknown = [identifier for identifier in entries if identifier not in listed]
    if unknown:
        raise CheckpointError(
            f"{where} holds state for parameters {unknown[:5]} that none of its parameter groups lists"
        )
    saved = [len(group["params"]) for group in saved_groups]
    current = [len(group["params"]) for group in inner.param_groups]
    if saved != current:
        raise CheckpointError(
            f"{where} holds {len(saved)} parameter group(s) of {saved} parameters but "
            f"{type(inner).__name__} has {len(current)} of {current}: build the optimizer with the same "
            "parameter groups as the run that saved it"
        )


def _kind(value: Any) -> str:
    """What kind of value a state entry is, loosely: ints and floats are both numbers, lists and tuples
    both sequences (torch.save keeps tuples, JSON-like states have lists)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, torch.Tensor):
        return "tensor"
    return type(value).__name__


def check_state_layout(live: Any, saved: Any, where: str, what: str) -> None:
    """Raise :class:`CheckpointError` naming ``where`` unless ``saved`` is a dict that holds every public
    key of ``live`` (a state_dict) and each shared key holds the same kind of value (None matches
    anything); dicts inside are compared the same way, also in lists of the same length (the states of
    the schedulers a SequentialLR chains)."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where} holds a {type(saved).__name__}, not the state of {what}")
    missing = sorted(str(key) for key in live if key not in saved and not str(key).startswith("_"))
    if missing:
        raise CheckpointError(f"{where} is not the state of {what}: it lacks {', '.join(missing[:10])}")
    for key, value in live.items():
        if key not in saved or value is None or saved[key] is None:
            continue
        if _kind(value) != _kind(saved[key]):
            raise CheckpointError(
                f"{where} is not the state of {what}: {key!r} holds a {type(saved[key]).__name__} where "
                f"{what} has a {type(value).__name__}"
            )
        if isinstance(value, dict):
            check_state_layout(value, saved[key], where, f"{what}[{key!r}]")
        elif _kind(value) == "sequence" and len(value) == len(saved[key]):
            for index, (item, saved_item) in enumerate(zip(value, saved[key])):
                if isinstance(item, dict):
                    check_state_layout(item, saved_item, where, f"{what}[{key!r}][{index}]")


def check_scheduler_state(scheduler: Any, state: Any, where: str) -> None:
    """Raise :class:`CheckpointError` unless ``state`` loads into ``scheduler`` (a prepared scheduler or
    torch's): its layout is checked, then it is loaded into a copy of the scheduler that shares nothing
    with it but the optimizer (which ``load_state_dict`` does not touch)."""
    inner = getattr(scheduler, "scheduler", scheduler)
    what = type(inner).__name__
    check_state_layout(inner.state_dict(), state, where, what)
    # The optimizers it (or a scheduler it chains, as SequentialLR does) refers to are shared, not copied:
    # a copy would duplicate every parameter.
    shared = {}
    for owner in (inner, *getattr(inner, "_schedulers", ())):
        optimizer = getattr(owner, "optimizer", None)
        while optimizer is not None and id(optimizer) not in shared:
            shared[id(optimizer)] = optimizer
            optimizer = getattr(optimizer, "optimizer", None)
    probe = copy.copy(inner)
    probe.__dict__ = copy.deepcopy(inner.__dict__, memo=dict(shared))
    try:
        probe.load_state_dict(copy.deepcopy(state))
    except Exception as exc:
        raise CheckpointError(f"{where} does not load into {what}: {type(exc).__name__}: {exc}") from None


def try_loading(obj: Any, state: Any, where: str) -> None:
    """Load ``state`` into ``obj`` (a registered object) and put its own state back at once: raises
    :class:`CheckpointError` naming ``where`` if the object refuses it, with ``obj`` as it was. A registered
    module or optimizer is compared instead (no copy of its tensors is made)."""
    if isinstance(obj, torch.nn.Module):
        check_model_source(obj, state, where)
        return
    if isinstance(obj, torch.optim.Optimizer):
        check_optimizer_layout(obj, state, where)
        return
    own = obj.state_dict()
    if isinstance(own, dict) and not isinstance(state, dict):
        raise CheckpointError(
            f"{where} holds a {type(state).__name__}, but {type(obj).__name__}.state_dict() gives a dict"
        )
    try:
        kept, trial = copy.deepcopy(own), copy.deepcopy(state)
    except Exception:
        # A state that cannot be copied (a file handle, loaded with weights_only=False from a trusted
        # checkpoint) is not tried: it is loaded once, last, when everything else is in.
        return
    try:
        obj.load_state_dict(trial)
    except Exception as exc:
        _put_back(obj, kept, where)
        raise CheckpointError(
            f"{where} does not load into {type(obj).__name__}: {type(exc).__name__}: {exc}"
        ) from None
    _put_back(obj, kept, where)


def _put_back(obj: Any, kept: Any, where: str) -> None:
    try:
        obj.load_state_dict(kept)
    except Exception as exc:
        raise CheckpointError(
            f"trying {where} on {type(obj).__name__} changed it, and its own state_dict() does not load back "
            f"into it ({type(exc).__name__}: {exc}): its load_state_dict cannot take what state_dict gives"
        ) from None


def try_rng_state(state: Any, where: str) -> None:
    """Restore the random states ``state`` (from ``capture_rng_state``) and put the current ones back:
    raises :class:`CheckpointError` naming ``where`` if any generator refuses its state."""
    from drivetrain.operations.random import capture_rng_state, restore_rng_state

    current = capture_rng_state()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # said once, when the state is restored for real
            restore_rng_state(state)
    except Exception as exc:
        restore_rng_state(current)
        raise CheckpointError(
            f"{where} does not hold random generator states this process can restore: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    restore_rng_state(current)
