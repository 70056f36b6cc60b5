"""coralloc's benchmark runner: our own workloads under every allocator, side by side."""

__version__ = "0.1.0"
