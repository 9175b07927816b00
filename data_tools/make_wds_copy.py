"""The images of a converted TFRecord data set as a WebDataset set in timm's layout, for tests and benchmarks.

    python -m data_tools.make_wds_copy data/digits data/digits-wds

Writes one tar per shard, ``<name>-<split>-NNNN.tar``, with the same records in the same order (each sample
``<key>.jpg`` with the record's bytes, ``<key>.cls`` with its class index, ``<key>.json`` with its class name),
and ``_info.json`` naming each split's tars and counts, with the ``webdataset`` library's own ``TarWriter``: the
layout of ``timm/imagenet-1k-wds``, which ``python -m data_tools.make_index`` then indexes in place. Record for
record the same images as the TFRecords, so the two sources can be compared batch for batch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from vitlarge import command
from vitlarge.data.manifest import load_manifest, shard_files
from vitlarge.errors import cli_main
from vitlarge.fileio import write_atomic


def make_wds_copy(src: str, out: str, *, name: str = "digits") -> str:
    """Writes ``src``'s splits into ``out`` (created) as described above; returns ``out``."""
    import webdataset as wds  # lazy: the writer only where a copy is made

    from vitlarge.data.repeats import IndexedRecords  # lazy: tfrecord's parser, as above

    m = load_manifest(src)
    names = {c.label: c for c in m.classes}
    os.makedirs(out, exist_ok=True)
    info: dict = {"name": name, "splits": {}}
    for split in m.splits:
        files, lengths = [], []
        for i, shard in enumerate(shard_files(m, split)):
            records = IndexedRecords([shard], world_size=1)
            tar = f"{name}-{split}-{i:04d}.tar"
            with wds.TarWriter(  # pyright: ignore[reportAttributeAccessIssue] (webdataset re-exports it lazily)
                os.path.join(out, tar)
            ) as sink:
                for k in range(records.num_examples):
                    image, label = records.read(k)
                    c = names.get(label)
                    meta: dict[str, str | int] = {"label": label - m.label_offset}
                    if c is not None:
                        meta.update(synset=c.synset, class_name=c.text or c.synset)
                    sink.write(
                        {
                            "__key__": f"{split}_{i:04d}_{k:06d}",
                            "jpg": image,
                            "cls": str(label - m.label_offset),
                            "json": meta,
                        }
                    )
            records.close()
            files.append(tar)
            lengths.append(records.num_examples)
        info["splits"][split] = {
            "name": split,
            "num_samples": sum(lengths),
            "filenames": files,
            "shard_lengths": lengths,
        }
    write_atomic(os.path.join(out, "_info.json"), json.dumps(info, indent=1), root=out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.make_wds_copy"), description=__doc__.split("\n\n")[0])
    p.add_argument("src")
    p.add_argument("out")
    a = p.parse_args(argv)
    return cli_main(lambda: make_wds_copy(a.src, a.out))


if __name__ == "__main__":
    sys.exit(main())
