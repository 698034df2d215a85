"""Copied into each side's start-up folder, which the harness puts first on PYTHONPATH, so that every process
of a run (pytest, and any process a test starts) runs it at start-up. What it does is chosen by variables the
harness sets (hfstack/sides.py):

- ``HFSTACK_NETWORK_LOG``: stop every connection that leaves this machine at once and log which test tried
  (``hfstack_network``);
- ``HFSTACK_ALIAS=1``: ``import accelerate`` gives drivetrain's modules (``hfstack_alias``), for as long as the
  ``drivetrain-accelerate`` distribution is not installed;
- ``HFSTACK_PATCH_BLOCKERS=1``: with the alias, work around the two known blockers in this process only
  (``hfstack_blockers``), so the tests can show what lies behind them.
"""

import os

if os.environ.get("HFSTACK_NETWORK_LOG"):
    import hfstack_network

    hfstack_network.install(os.environ["HFSTACK_NETWORK_LOG"])

if os.environ.get("HFSTACK_ALIAS") == "1":
    import hfstack_alias

    hfstack_alias.install(patch_blockers=os.environ.get("HFSTACK_PATCH_BLOCKERS") == "1")
