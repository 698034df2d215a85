"""The plugin contract: the hook specs, what plugins declare, how they are discovered, loaded and called,
and which of them run. Plugins import from here only through :mod:`drivetrain.plugin_api`.

hookspecs.py    the hooks, and how each is called (first result, chain, broadcast)
info.py         PluginInfo, Capabilities, ExtensionRegistry: what a plugin declares and registers
environment.py  DistributedEnvironment and Collectives: what setup_process_group returns
arguments.py    ShardingOptions and PreparedObjects: what hooks receive besides the Accelerator
registry.py     discovery from entry points, validation, loading
attribution.py  naming the plugin on an error raised in its hook
calling.py      PluginStack: the active plugins of one Accelerator, called through pluggy
selection.py    which backend and precision plugin run, and the backend's settings
exports.py      names plugins provide to the public namespaces
"""
