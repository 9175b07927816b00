"""The model: timm's ViTs with vitlarge's options (`vit`) and mixed precision (`precision`)."""
