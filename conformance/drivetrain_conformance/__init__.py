"""The drivetrain conformance suite: does a backend keep the promises of the plugin contract?

``drivetrain conformance NAME [--processes N]`` prints one verdict per property; :func:`run_suite` is the
same from Python, and the ``drivetrain_conformance`` pytest fixture runs it inside a plugin's own tests.
See docs/conformance.md.
"""

from drivetrain_conformance.properties import PROPERTIES, TOLERANCES, Property, Tolerance
from drivetrain_conformance.runner import Report, Verdict, run_suite

__all__ = ["PROPERTIES", "TOLERANCES", "Property", "Report", "Tolerance", "Verdict", "run_suite"]
