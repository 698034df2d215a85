"""The contract's name and version (pluggy's project name; see docs/plugins/versioning.md)."""

PROJECT_NAME = "drivetrain"
#: The contract version this kernel implements. A plugin declares the version it was written for
#: (``PluginInfo.contract``); a different major version is refused with a clear error.
CONTRACT_VERSION = "1.3"
