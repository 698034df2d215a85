"""Test setup for the megatron plugin: skipped where megatron-core is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core", reason="drivetrain-megatron tests need the megatron-core package")
