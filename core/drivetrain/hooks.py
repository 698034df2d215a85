"""``drivetrain.hooks``: Accelerate's ``accelerate.hooks`` names, for scripts that import them from there.

These are **module hooks** (functions run around a module's forward, used for offloading), not plugin hooks
(see ``drivetrain.contract.hookspecs``). They live in the offload plugin; without ``drivetrain-offload`` installed
they are importable, and using one raises an ImportError naming it.
"""

from drivetrain.contract.reexport import reexport

__getattr__, __dir__, __all__ = reexport(__name__, {})
