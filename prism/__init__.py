"""prism: run a PyTorch distributed training job at logical scale on a few devices."""

__version__ = "0.1.0"
