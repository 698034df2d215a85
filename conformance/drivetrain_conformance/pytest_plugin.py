"""pytest plugin (entry point ``pytest11``): the ``drivetrain_conformance`` fixture for backend authors.

def test_my_backend_conforms(drivetrain_conformance):
    drivetrain_conformance.check("my-backend", processes=2)
"""

from __future__ import annotations

import pytest


def pytest_configure(config) -> None:
    # The marks a backend's conformance tests use, registered so that pytest does not warn about them.
    config.addinivalue_line("markers", "multiprocess: starts real torch.distributed processes (gloo on CPU)")
    config.addinivalue_line("markers", "slow: takes more than about 20 seconds")


class ConformanceFixture:
    def __init__(self, workdir: str) -> None:
        self.workdir = workdir

    def run(
        self, backend: str, processes: int = 1, plugins: tuple[str, ...] = (), timeout: float | None = None
    ):
        """The :class:`~drivetrain_conformance.Report` for one backend (with ``plugins`` named by every
        Accelerator of the checks; ``timeout``: each property's limit in seconds, by default
        ``DEFAULT_TIMEOUT``)."""
        from drivetrain_conformance.properties import DEFAULT_TIMEOUT
        from drivetrain_conformance.runner import run_suite

        limit = DEFAULT_TIMEOUT if timeout is None else timeout
        return run_suite([backend], processes=processes, plugins=plugins, timeout=limit)[backend]

    def check(
        self, backend: str, processes: int = 1, plugins: tuple[str, ...] = (), timeout: float | None = None
    ):
        """Run the suite and fail the test with the verdict table when any property fails."""
        report = self.run(backend, processes, plugins, timeout)
        if not report.ok:
            pytest.fail(report.format(), pytrace=False)
        return report


@pytest.fixture
def drivetrain_conformance(tmp_path) -> ConformanceFixture:
    return ConformanceFixture(str(tmp_path))
