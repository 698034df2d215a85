"""Build hook: the two files drivetrain-accelerate installs at the root of site-packages, in regular and editable
wheels alike (hatchling's ``force-include`` covers regular wheels only):

- ``drivetrain-accelerate.pth``: Python runs it at start-up; it puts the ``accelerate`` finder on sys.meta_path;
- ``accelerate.egg-info/``: the metadata of the distribution name ``accelerate`` (version = the Accelerate API
  drivetrain implements), which transformers, peft and trl read, and which pip counts as the installed
  Accelerate, so that installing peft or trl afterwards does not bring the real one.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ROOT_FILES = {
    "drivetrain-accelerate.pth": "drivetrain-accelerate.pth",
    "metadata/PKG-INFO": "accelerate.egg-info/PKG-INFO",
    "metadata/installed-files.txt": "accelerate.egg-info/installed-files.txt",
}


class RootFilesHook(BuildHookInterface):  # type: ignore[misc]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data.setdefault(key, {}).update(ROOT_FILES)
