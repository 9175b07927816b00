"""WebDataset sets in timm's layout (``timm/imagenet-1k-wds``), written with the ``webdataset`` library itself.

``write_timm_wds(root)``: tars ``tiny-<split>-NNNN.tar`` from ``wds.ShardWriter`` (``<key>.jpg``, ``<key>.cls``,
``<key>.json`` with timm's ``filename``, ``label`` and ``class_name``) and ``_info.json`` naming each split's
``filenames``, ``shard_lengths`` and ``num_samples`` as timm's reader reads them. ``member_tar``: a tar with
members the library never writes (links, devices, names leading out), made with ``tarfile``.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

CLASSES = ("tench", "goldfish", "great white shark")


def jpeg(width: int, height: int, shade: int) -> bytes:
    from PIL import Image  # lazy: PIL only where an image is made

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (shade, 255 - shade, 128)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def write_timm_wds(root: str, counts: dict[str, int] | None = None, per_tar: int = 7, edit=None) -> str:
    """Writes the set into ``root`` (``counts``: samples per split; ``edit(split, i, sample)`` may change or drop
    (return None) a sample before it is written); returns ``root``."""
    import webdataset as wds  # lazy: the library only where a set is written

    counts = counts or {"train": 20, "validation": 11}
    os.makedirs(root, exist_ok=True)
    info: dict = {"name": "tiny", "splits": {}}
    for split, n in counts.items():
        pattern = os.path.join(root, f"tiny-{split}-%04d.tar")
        written = 0
        with wds.ShardWriter(pattern, maxcount=per_tar, verbose=0) as sink:  # pyright: ignore[reportAttributeAccessIssue]
            for i in range(n):
                label = i % len(CLASSES)
                sample = {
                    "__key__": f"{split}_{i:06d}",
                    "jpg": jpeg(16 + i % 5 * 4, 16 + i % 3 * 4, i * 7 % 256),
                    "cls": str(label),
                    "json": {"filename": f"{split}_{i}.JPEG", "label": label, "class_name": CLASSES[label]},
                }
                sample = edit(split, i, sample) if edit else sample
                if sample is not None:
                    sink.write(sample)
                    written += 1
        files = sorted(f for f in os.listdir(root) if f.startswith(f"tiny-{split}-"))
        lengths = [min(per_tar, written - k * per_tar) for k in range(len(files))]
        info["splits"][split] = {"name": split, "num_samples": written, "filenames": files, "shard_lengths": lengths}
    with open(os.path.join(root, "_info.json"), "w") as f:
        json.dump(info, f)
    return root


def member_tar(path: str, kind: str) -> None:
    """A tar of one good sample and one member of ``kind``: ``symlink``, ``hardlink``, ``device``, ``absolute``
    or ``dotdot``."""
    with tarfile.open(path, "w") as tar:
        for name, data in (("a.jpg", jpeg(16, 16, 9)), ("a.cls", b"0")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo({"absolute": "/etc/b.jpg", "dotdot": "../b.jpg"}.get(kind, "b.jpg"))
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "a.jpg"
        elif kind == "device":
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
        data = jpeg(16, 16, 3) if kind in ("absolute", "dotdot") else b""
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
