"""hcsim: simulate distributed AI training on heterogeneous, cache-coherent computing systems."""

__version__ = "0.1.0"
