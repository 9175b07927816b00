"""vitlarge: large-batch ViT pretraining recipes on Colossal-AI."""

__version__ = "0.1.0"
