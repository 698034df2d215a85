"""Fixtures for the Hugging Face stack tests: the shared scenarios module and a clean environment."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "hf_scenarios.py"


def load_scenarios() -> ModuleType:
    if "hf_scenarios" not in sys.modules:
        spec = importlib.util.spec_from_file_location("hf_scenarios", SCENARIOS)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["hf_scenarios"] = module
        spec.loader.exec_module(module)
    return sys.modules["hf_scenarios"]


@pytest.fixture
def scenarios(monkeypatch) -> ModuleType:
    """hf_scenarios.py, with the process environment restored after the test: TrainingArguments exports
    ACCELERATE_* variables (ACCELERATE_MIXED_PRECISION=bf16, ...) that must not reach the next test."""
    pytest.importorskip("transformers")
    saved = dict(os.environ)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    yield load_scenarios()
    os.environ.clear()
    os.environ.update(saved)
