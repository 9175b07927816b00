"""Offline data preparation. Each module is a CLI (``python -m data_tools.<name> --help``):

- ``imagenet_to_tfrecord``: ImageFolder-style JPEG tree -> TFRecord shards + DALI indexes + manifest.
- ``make_index``: DALI indexes and a manifest for TFRecord shards made elsewhere (e.g. TensorFlow).
- ``make_demo_dataset``: scikit-learn's digits as a tiny real data set, converted (seconds, CPU).
- ``make_bench_dataset``: ImageNet-sized JPEGs from scikit-learn's sample photos, for benchmarks.

The tools share only the manifest format (``vitlarge.data.manifest``) with the training library.
"""
