"""The GPU measurement kit: ``python -m benchmarks.gpu`` (`kit`); its parts: `device`, `train`, `optim`, `report`.

Nothing imported here needs Colossal-AI, DALI, TFRecord or crc32c (a bare CUDA machine has none).
"""
