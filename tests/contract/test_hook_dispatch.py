"""The per-step hook caller (``PluginStack.caller``) calls plain first-result implementations directly; what a
plugin observes must be exactly what pluggy's own hook caller gives: the same order, the first non-None answer,
the same error for a missing argument before anything ran, and pluggy itself whenever an implementation needs
its special handling (wrappers) or tracing is on."""

from __future__ import annotations

import pytest
from pluggy import HookCallError

from drivetrain.contract.calling import PluginStack
from drivetrain.plugin_api import hookimpl


def recording_plugin(calls: list[str], name: str, answer):
    class Plugin:
        @staticmethod
        @hookimpl
        def backward(loss, accelerator, backward_kwargs):
            calls.append(name)
            return answer

    return Plugin()


def stack_of(*plugins, fallback=None):
    """A stack of backend/feature/precision plugins (composition order: backend, feature, precision) with
    ``fallback`` as ``local``."""
    kinds = ("backend", "feature", "precision")
    fallback = fallback if fallback is not None else recording_plugin([], "local", True)
    return PluginStack(
        [(f"p{index}", kinds[index], plugin) for index, plugin in enumerate(plugins)], ("local", fallback)
    )


NAMES = ("backend", "feature", "local")
ARGUMENTS = {"loss": 1.0, "accelerator": None, "backward_kwargs": {}}


@pytest.mark.parametrize(
    "answers",  # (backend's, feature's, local's)
    [(None, None, True), (None, "feature", True), ("backend", "feature", True), ("backend", None, True)],
)
def test_direct_caller_answers_and_orders_as_pluggy(answers):
    def build(calls):
        backend, feature, local = (
            recording_plugin(calls, name, answer) for name, answer in zip(NAMES, answers)
        )
        return stack_of(backend, feature, fallback=local)

    direct_calls: list[str] = []
    pluggy_calls: list[str] = []
    answer = build(direct_calls).caller("backward")(**ARGUMENTS)
    assert answer == build(pluggy_calls).hook.backward(**ARGUMENTS)
    assert direct_calls == pluggy_calls
    # composition order (a feature plugin before the backend, local last), stopping at the first answer
    asked = ["feature", "backend", "local"]
    answers_in_order = dict(zip(NAMES, answers))
    stop = next(index for index, name in enumerate(asked) if answers_in_order[name] is not None)
    assert direct_calls == asked[: stop + 1]
    assert answer == answers_in_order[asked[stop]]


def test_missing_argument_is_pluggys_error_and_runs_nothing():
    calls: list[str] = []
    stack = stack_of(
        recording_plugin(calls, "backend", None), fallback=recording_plugin(calls, "local", True)
    )
    with (
        pytest.raises(HookCallError, match="backward_kwargs"),
        pytest.warns(UserWarning, match="backward_kwargs"),
    ):
        stack.caller("backward")(loss=1.0, accelerator=None)
    assert calls == []


def test_an_error_keeps_its_type_and_names_the_plugin():
    class Failing:
        @staticmethod
        @hookimpl
        def backward(loss, accelerator, backward_kwargs):
            raise KeyError("inside the plugin")  # a KeyError from the plugin is not a missing argument

    stack = stack_of(Failing())
    with pytest.raises(KeyError, match="inside the plugin") as raised:
        stack.caller("backward")(**ARGUMENTS)
    assert any("p0" in note for note in getattr(raised.value, "__notes__", []))


def test_wrappers_go_through_pluggy():
    seen: list[str] = []

    class Wrapper:
        @staticmethod
        @hookimpl(wrapper=True)
        def backward(loss, accelerator, backward_kwargs):
            seen.append("before")
            result = yield
            seen.append(f"after {result}")
            return result

    stack = stack_of(Wrapper())
    assert stack.caller("backward")(**ARGUMENTS) is True
    assert seen == ["before", "after True"]


def test_tracing_sees_the_per_step_hook(monkeypatch, caplog):
    monkeypatch.setenv("DRIVETRAIN_TRACE_PLUGINS", "1")
    stack = stack_of()
    import drivetrain.contract.calling as calling

    traced: list[str] = []
    monkeypatch.setattr(calling, "_emit_trace", traced.append)
    stack.caller("backward")(**ARGUMENTS)
    assert len(traced) == 1 and traced[0].startswith("hook backward -> plugin local")


@pytest.mark.parametrize(
    ("answers", "listed"),  # (backend's, feature's, local's) -> the plugins the trace names
    [
        (
            ("backend", None, True),
            "p1, p0",
        ),  # the feature returned None, the backend answered: local never ran
        ((None, None, True), "p1, p0, local"),
        ((None, "feature", True), "p1"),
    ],
)
def test_trace_lists_only_the_implementations_that_ran(monkeypatch, answers, listed):
    """DRIVETRAIN_TRACE_PLUGINS names the implementations that ran, in order, not every one that could have."""
    monkeypatch.setenv("DRIVETRAIN_TRACE_PLUGINS", "1")
    import drivetrain.contract.calling as calling

    traced: list[str] = []
    monkeypatch.setattr(calling, "_emit_trace", traced.append)
    calls: list[str] = []
    backend, feature, local = (recording_plugin(calls, name, answer) for name, answer in zip(NAMES, answers))
    stack = stack_of(backend, feature, fallback=local)
    stack.caller("backward")(**ARGUMENTS)
    assert len(traced) == 1 and traced[0].startswith(f"hook backward -> plugin {listed} ("), traced
    assert len(calls) == len(listed.split(", "))
