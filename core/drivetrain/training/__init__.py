"""The training step's wrappers: AcceleratedOptimizer, AcceleratedScheduler, forward patches for mixed
precision and unwrapping (modeling.py), and the profiler (profiling.py)."""
