"""Convert an ImageFolder-style JPEG tree (ImageNet or any other) to TFRecord shards for DALI.

    python -m data_tools.imagenet_to_tfrecord --src /data/imagenet --out /data/imagenet-tfr \\
        --workers 16            # ImageNet: ~1.28M + 50K images, 1024 + 128 shards

Output in OUT: ``train-NNNNN-of-01024`` / ``validation-NNNNN-of-00128`` shards of
``tf.train.Example`` records with the schema of TensorFlow's ImageNet records (original JPEG
bytes, ``image/class/label`` = 1 + sorted class index), a DALI index ``<shard>.idx`` next to each,
and ``dataset.json`` (see vitlarge/data/manifest.py). Train examples are shuffled across shards
with ``--seed``; validation examples are written sorted by aspect ratio, and each validation image's size is
recorded beside its shard (``<shard>.sizes``, named by ``dataset.json``; `data_tools.val_order`: what rectangular
validation, ``data.rect_val``, reads). A source without ``train/`` (``ROOT/val/<class>/*``, or class folders directly
in ROOT) converts to a validation split alone, a set to evaluate an export on (``vitlarge-evaluate --data OUT``).

Resumable: each committed shard gets a done-record in ``OUT/.progress/`` (`data_tools.done_records`);
a rerun keeps shards whose record, size and index still match and whose input list is unchanged,
and redoes the rest. Ctrl-C stops after the shards in progress are complete, with one line saying
what was done; the same command resumes. A re-conversion that replaces shards under their names
removes ``dataset.json`` before the first one is replaced, so a run that stops part-way never leaves
a manifest that disagrees with the shards (and ``make_index`` refuses the mixture it leaves).
Shards are written as ``*.tmp``, fsynced and renamed, so a killed run leaves no partial file
under a final name; a rerun removes only those temporary files of its own. One shard set at a
time: converting again with other shard counts removes the earlier run's shards of the old set
once the new manifest is written, and shard files in OUT that this converter did not write are
refused with the fix.

The tree's names and links are data too: a name with a control character (it would print lines of its own) and a
link that makes an image reachable twice (under two classes: a mislabel) are refused in one line
(`data_tools.imagefolder`). Source images are data: PIL's decompression-bomb guard stays on (``--max-image-pixels``, default
PIL's 89,478,485 pixels, about 9459 x 9459); a larger image is an unreadable image (stop, or skipped
with ``--skip-bad``) whose reason names the option.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import math
import multiprocessing as mp
import os
import queue
import random
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from vitlarge import command
from vitlarge.data.manifest import (
    ASPECT_ORDER,
    INDEX_LINE_MAX,
    MANIFEST_NAME,
    SHARD_RE,
    ClassInfo,
    Manifest,
    ShardInfo,
    load_manifest,
    shard_name,
    write_manifest,
)
from vitlarge.data.manifest_schema import CHECKSUM_RE, MAX_SIDE, SIZES_SUFFIX, out_of_aspect_order
from vitlarge.errors import EXIT_INTERRUPTED, UserError, cli_main
from vitlarge.fileio import UnsafeFile, check_inside, fsync_dir, open_regular, probe_writable, write_atomic
from vitlarge.text import plural

from . import done_records, imagefolder, tfrecord_io, val_order
from .done_records import PROGRESS_DIR
from .imagefolder import DEFAULT_MAX_IMAGE_PIXELS, BadImage, Item, Prepared

TOOL = "data_tools.imagenet_to_tfrecord"
TOOL_VERSION = "1.1.0"  # 1.1: re-encoded images upright and transparent ones on white (`imagefolder.upright_rgb`)
LABEL_OFFSET = 1  # TF ImageNet records reserve label 0 for "background"
SKIPPED_LIST = "skipped.txt"


def example_features(item: Item, jpeg: bytes, height: int, width: int) -> dict:
    return {
        "image/encoded": (jpeg, "byte"),
        "image/format": (b"JPEG", "byte"),
        "image/colorspace": (b"RGB", "byte"),
        "image/channels": (3, "int"),
        "image/height": (height, "int"),
        "image/width": (width, "int"),
        "image/class/label": (item.label, "int"),
        # A name is bytes on disk: os.fsencode gives them back as they were (b"\xff\xfe.JPEG"), where str.encode fails
        "image/class/synset": (os.fsencode(item.synset), "byte"),
        "image/class/text": (item.text.encode(), "byte"),
        "image/filename": (os.fsencode(os.path.basename(item.path)), "byte"),
    }


# ImageNet's shard sizes, the defaults' basis: 1,281,167 train images in 1024 shards, 50,000 in 128.
IMAGES_PER_SHARD = {"train": 1252, "validation": 391}
MAX_SHARDS = {"train": 1024, "validation": 128}


def default_shards(split: str, count: int) -> int:
    """ImageNet's shard size for ``count`` images: 1024 / 128 shards at ImageNet's size, fewer for a smaller
    set (350 images: one shard, not 350 one-image files), never more than ImageNet's counts."""
    return max(1, min(MAX_SHARDS[split], math.ceil(count / IMAGES_PER_SHARD[split])))


def plan_shards(
    items: list[Item], num_shards: int | None, split: str, shuffle_seed: int | None
) -> list[tuple[str, list[Item]]]:
    """Split items into contiguous, near-equal shards; train is shuffled first with a fixed seed.
    ``num_shards`` None: `default_shards`."""
    items = list(items)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(items)
    num_shards = default_shards(split, len(items)) if num_shards is None else num_shards
    n = min(num_shards, len(items))  # never an empty shard: DALI can't index one
    return [(shard_name(split, i, n), items[i * len(items) // n : (i + 1) * len(items) // n]) for i in range(n)]


def inputs_digest(items: list[Item], skip_bad: bool, check: str, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> str:
    limit = "" if max_pixels == DEFAULT_MAX_IMAGE_PIXELS else f"|{max_pixels}"  # unchanged digests by default
    h = hashlib.sha256(f"{TOOL_VERSION}|{skip_bad}|{check}{limit}".encode())
    for it in items:
        h.update(os.fsencode(f"\n{it.path}|{it.size}|{it.label}|{it.synset}"))  # a UTF-8 name: the bytes of .encode()
    return h.hexdigest()


# --- worker side -------------------------------------------------------------------------------

_progress_queue = None
_stop = None  # set by the parent on Ctrl-C: shards not yet started are not started
_opts: dict = {}  # the conversion's options, handed to each worker once (a parquet set's carry its validation index)


def _init_worker(q, stop, opts: dict) -> None:
    global _progress_queue, _stop, _opts
    _progress_queue, _stop, _opts = q, stop, opts
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and cleans up


def _write_shard_unless_stopped(out_dir: str, name: str, items: list[Item], digest: str) -> dict | None:
    """`write_shard` with the worker's options, or None where the parent was interrupted before this shard started.
    The pool hands a worker more shards than it runs (its call queue holds workers + 1), which ``cancel_futures``
    cannot take back: without this, Ctrl-C would wait for those too."""
    if _stop is not None and _stop.is_set():
        return None
    return write_shard(out_dir, name, items, _opts, digest)


def write_shard(out_dir: str, name: str, items: list[Item], opts: dict, digest: str) -> dict:
    """Write one shard + index atomically and its done-record; return the done-record.

    ``opts``: skip_bad, check, max_pixels, conversion and src (recorded). A replaced shard's old record
    stays until the new one is written: a run that stops in this shard leaves it naming the old
    conversion (for `done_records.mixture_problem`); between the rename and the new record it matches
    neither and counts as of no recorded conversion."""
    path = os.path.join(out_dir, name)
    try:
        record = _write_records(path, name, items, opts)
    except OSError as e:  # name the file even when a buffered write or fsync failed
        raise OSError(e.errno, e.strerror, e.filename or path + tfrecord_io.TMP_SUFFIX) from None
    record.update(inputs=digest, conversion=opts["conversion"], src=opts["src"])
    if not _records_sizes(name):
        del record["sizes"]
    write_atomic(done_records.record_path(out_dir, name), json.dumps(record), root=out_dir)
    return record


def _records_sizes(name: str) -> bool:
    """Whether the shard's done-record (and so the manifest) lists its images' sizes: validation shards."""
    m = SHARD_RE.match(name)
    return m is not None and m.group(1) == "validation"


def folder_images(items: list[Item], opts: dict) -> Iterator[tuple[Item, Prepared | BadImage]]:
    """Each image file of ``items`` prepared for its record (`imagefolder.prepare_image`), or why it cannot be."""
    for item in items:
        try:
            yield item, imagefolder.prepare_image(item.path, opts["check"], opts["max_pixels"])
        except BadImage as e:
            yield item, e


def _parquet_images(items: list, opts: dict) -> Iterator[tuple[Item, Prepared | BadImage]]:
    from . import parquet_source  # lazy: pyarrow only where a parquet set is converted

    return parquet_source.shard_images(items, opts)


SOURCES = {"folder": folder_images, "parquet": _parquet_images}
"""How a worker reads a shard's items, by ``opts["source"]``: an image-folder tree's files, or parquet rows."""


def _write_records(path, name, items, opts) -> dict:
    skip_bad = opts["skip_bad"]
    images = SOURCES[opts["source"]](items, opts)
    skipped, reencoded, transparent, pending, sizes = [], 0, [], [0, 0], []
    with tfrecord_io.ShardWriter(path) as writer:
        for item, image in images:
            if isinstance(image, BadImage):
                if not skip_bad:
                    raise image
                skipped.append([image.args[0], image.args[1]])
                print(f"skipped {image.args[0]}: {image.args[1]}", file=sys.stderr)
                continue
            reencoded += image.reencoded
            if image.transparent:
                transparent.append(item.path)
            writer.write(tfrecord_io.example_parts(example_features(item, image.data, image.height, image.width)))
            sizes.append([image.height, image.width])
            pending[0] += 1
            pending[1] += item.size
            if pending[0] >= 32 and _progress_queue is not None:
                _progress_queue.put(tuple(pending))
                pending = [0, 0]
        if not writer.num_records:
            raise UserError(f"{path}: every image of this shard was unreadable; check the source")
        written = writer.commit()
    if _progress_queue is not None and pending[0]:
        _progress_queue.put(tuple(pending))
    return {
        "shard": name,
        "num_records": written.num_records,
        "bytes": written.bytes,
        "checksum": written.checksum,
        "skipped": skipped,
        "reencoded": reencoded,
        "transparent": transparent,
        "sizes": sizes,
    }


# --- driver side -------------------------------------------------------------------------------


def _done_record(out_dir: str, name: str, digest: str) -> dict | None:
    """The shard's done-record if the shard on disk is complete and made from the same inputs (regular
    files only: a FIFO or a link planted in --out reads as no record)."""
    rec = done_records.read_record(out_dir, name)
    if rec is None or rec.get("inputs") != digest or not _record_is_sound(rec):
        return None
    if _records_sizes(name) and not _sizes_are_sound(rec):  # written before the converter recorded them
        return None
    path = os.path.join(out_dir, name)
    try:
        with open_regular(path, follow=False) as f:
            if os.fstat(f.fileno()).st_size != rec["bytes"]:
                return None
        with open_regular(path + ".idx", follow=False) as f:
            if os.fstat(f.fileno()).st_size > rec["num_records"] * INDEX_LINE_MAX:
                return None
            if sum(1 for line in f if line.strip()) != rec["num_records"]:
                return None
    except OSError:
        return None
    return rec


def _record_is_sound(rec: dict) -> bool:
    """The fields the manifest and summary take from a done-record have their types and ranges."""
    ints = [rec.get(k) for k in ("num_records", "bytes", "reencoded")]
    skipped = rec.get("skipped")
    return (
        all(type(v) is int and v >= 0 for v in ints)
        and rec["num_records"] >= 1
        and isinstance(rec.get("checksum"), str)
        and CHECKSUM_RE.match(rec["checksum"]) is not None
        and isinstance(skipped, list)
        and all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x) for x in skipped)
        and isinstance(rec.get("transparent"), list)
        and all(isinstance(x, str) for x in rec["transparent"])
    )


def _sizes_are_sound(rec: dict) -> bool:
    """A validation shard's done-record lists ``[height, width]`` of each of its records."""
    sizes = rec.get("sizes")
    return (
        isinstance(sizes, list)
        and len(sizes) == rec["num_records"]
        and all(
            isinstance(s, list) and len(s) == 2 and all(type(x) is int and 1 <= x <= MAX_SIDE for x in s) for s in sizes
        )
    )


def _prepare_out_dir(out_dir: str, planned: list[str]) -> list[str]:
    """Make ``out_dir`` ready for the shards ``planned``; return the stale shards to remove at the end.

    Removes only this converter's own temporary files for the planned names (a killed run's
    leftovers; any other ``*.tmp`` in the directory is not ours and stays). Shards of another
    set (``-of-M`` for a count this run does not write) that an earlier run of this converter
    wrote (they have a done-record) are returned, to be deleted once the new manifest is in
    place; any other shard file is refused with the fix, before anything is written.
    """
    progress = os.path.join(out_dir, PROGRESS_DIR)
    try:
        os.makedirs(out_dir, exist_ok=True)
        check_inside(progress, out_dir)  # a planted .progress link would carry the done-records elsewhere
        os.makedirs(progress, exist_ok=True)
        probe_writable(out_dir, f".write-test-{os.getpid()}{tfrecord_io.TMP_SUFFIX}")
        names = os.listdir(out_dir)
    except UnsafeFile as e:
        raise UserError(f"{e.filename}: {e.strerror}; remove it, or choose another --out") from None
    except OSError as e:
        raise UserError(f"{out_dir}: output directory is not writable ({e.strerror}); choose another --out") from None
    ours = (
        set(planned)
        | {n + ".idx" for n in planned}
        | {n + SIZES_SUFFIX for n in planned}
        | {MANIFEST_NAME, SKIPPED_LIST}
    )
    for n in names:
        if n.endswith(tfrecord_io.TMP_SUFFIX) and n[: -len(tfrecord_io.TMP_SUFFIX)] in ours:
            os.remove(os.path.join(out_dir, n))
    stale = sorted(n for n in names if SHARD_RE.match(n) and n not in set(planned))
    foreign = [n for n in stale if not os.path.exists(done_records.record_path(out_dir, n))]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UserError(
            f"{os.path.join(out_dir, foreign[0])}{more}: shards this conversion does not write, and not "
            "from an earlier run of this converter; move them out of --out or choose an empty --out"
        )
    return stale


def _remove_shards(out_dir: str, names: list[str]) -> None:
    """Delete shards of a replaced set with their indexes and done-records (after the new manifest)."""
    for n in names:
        for path in (
            os.path.join(out_dir, n),
            os.path.join(out_dir, n + ".idx"),
            os.path.join(out_dir, n + SIZES_SUFFIX),
            done_records.record_path(out_dir, n),
        ):
            for p in (path, path + tfrecord_io.TMP_SUFFIX):
                try:
                    os.remove(p)
                except FileNotFoundError:
                    pass


class _Rate:
    """Images/s and MB/s over the whole run, for the progress bar and the summary."""

    def __init__(self):
        self.t0, self.images, self.bytes = time.perf_counter(), 0, 0

    def __str__(self):
        dt = max(time.perf_counter() - self.t0, 1e-9)
        return f"{self.images / dt:,.0f} img/s, {self.bytes / dt / 1e6:,.0f} MB/s"


def convert(
    src: str,
    out: str,
    *,
    train_shards: int | None = None,
    val_shards: int | None = None,
    workers: int | None = None,
    skip_bad: bool = False,
    val_labels: str | None = None,
    seed: int = 0,
    check: str = "header",
    progress: bool = True,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    min_class_images: int = imagefolder.MIN_CLASS_IMAGES,
) -> Manifest:
    """Convert ``src`` into ``out``; return the manifest written. Raises UserError on bad input and
    `Interrupted` on Ctrl-C (after the shards in progress are complete)."""
    if workers is None:
        workers = os.cpu_count() or 1
    imagefolder.check_out(src, out)
    classes, splits = imagefolder.discover(src, val_labels, LABEL_OFFSET)
    for line in imagefolder.layout_warnings(src, classes, splits, min_class_images):
        print(f"warning: {line}", file=sys.stderr)
    texts = imagefolder.class_texts(classes)
    plans = {}
    if "train" in splits:
        plans["train"] = plan_shards(splits["train"], train_shards, "train", seed)
    else:
        print(_evaluation_only_note(src, out, len(classes)), file=sys.stderr)
    if splits.get("validation"):
        ordered = val_order.aspect_sorted(splits["validation"], max_image_pixels)
        plans["validation"] = plan_shards(ordered, val_shards, "validation", None)
    digests = {
        name: inputs_digest(items, skip_bad, check, max_image_pixels)
        for shards in plans.values()
        for name, items in shards
    }
    opts = dict(skip_bad=skip_bad, check=check, max_pixels=max_image_pixels, src=src, source="folder")
    return write_plan(src, out, Plan(plans, digests, classes, texts), opts, workers=workers, progress=progress)


def total_rows(sources) -> int:
    return sum(sum(src.groups) for src in sources)


def convert_parquet(
    src: str,
    out: str,
    *,
    train_shards: int | None = None,
    val_shards: int | None = None,
    workers: int | None = None,
    progress: bool = True,
    **options,
) -> Manifest:
    """Convert the Hugging Face parquet shards of ``src`` into ``out`` (`data_tools.parquet_source`: the layout,
    what is read and how); return the manifest written. ``options``: ``skip_bad``, ``check``, ``max_image_pixels``
    and ``seed``, as `convert` takes them."""
    from . import parquet_source  # lazy: pyarrow only where a parquet set is converted

    unknown = set(options) - {"skip_bad", "check", "max_image_pixels", "seed"}
    if unknown:
        raise TypeError(f"convert_parquet: unknown options {sorted(unknown)}")
    skip_bad, check = options.get("skip_bad", False), options.get("check", "header")
    max_pixels, seed = options.get("max_image_pixels", DEFAULT_MAX_IMAGE_PIXELS), options.get("seed", 0)
    classes, splits = parquet_source.discover(src)
    counts = {"train": train_shards, "validation": val_shards}
    plans = {
        split: (parquet_source.plan_train if split == "train" else parquet_source.plan_val)(
            files,
            counts[split] or default_shards(split, total_rows(files)),
            *([seed] if split == "train" else []),
        )
        for split, files in splits.items()
    }
    sources = {s.path: s for files in splits.values() for s in files}
    head = f"{TOOL_VERSION}|parquet|{skip_bad}|{check}|{max_pixels}|{seed}|" + "\n".join(classes)
    digests = {
        name: hashlib.sha256(f"{head}|{parquet_source.items_digest(items, sources)}".encode()).hexdigest()
        for shards in plans.values()
        for name, items in shards
    }
    spill = os.path.join(out, PROGRESS_DIR, parquet_source.SPILL)

    def before_writing(tasks: list) -> dict:
        if not any(isinstance(items[0], parquet_source.ValSlice) for _, items, _ in tasks):
            return {}
        return {"spill": spill, "spilled": parquet_source.spill_validation(splits["validation"], spill, max_pixels)}

    opts = dict(skip_bad=skip_bad, check=check, max_pixels=max_pixels, src=src, source="parquet", seed=seed)
    opts.update(classes=classes, label_offset=LABEL_OFFSET)
    try:
        return write_plan(
            src, out, Plan(plans, digests, classes, {c: "" for c in classes}), opts,
            workers=(os.cpu_count() or 1) if workers is None else workers, progress=progress, before_writing=before_writing,
        )  # fmt: skip
    finally:
        if os.path.lexists(spill):
            os.remove(spill)


@dataclass(frozen=True)
class Plan:
    """What a conversion writes: ``shards`` ({split: [(shard name, its items)]}), each shard's inputs digest, and
    the classes (in label order) with their texts."""

    shards: dict[str, list[tuple[str, list]]]
    digests: dict[str, str]
    classes: list[str]
    texts: dict[str, str]


def write_plan(
    src: str,
    out: str,
    plan: Plan,
    opts: dict,
    *,
    workers: int,
    progress: bool,
    before_writing=None,
) -> Manifest:
    """Write the shards of ``plan`` that have no matching done-record, then ``dataset.json``; return it. ``opts["source"]`` names
    how a worker reads its items (`SOURCES`); ``before_writing(tasks)`` runs once the shards to write are known,
    before any is (a source's preparation that only those need). Raises UserError on bad input and `Interrupted`
    on Ctrl-C (after the shards in progress are complete)."""
    plans, digests, classes, texts = plan.shards, plan.digests, plan.classes, plan.texts
    stale = _prepare_out_dir(out, [name for shards in plans.values() for name, _ in shards])
    conversion = done_records.conversion_id(digests)
    opts = dict(opts, conversion=conversion)
    tasks, records = [], {}
    for shards in plans.values():
        for name, items in shards:
            rec = _done_record(out, name, digests[name])
            if rec is None:
                tasks.append((name, items, digests[name]))
                continue
            if rec.get("conversion") != conversion:  # the same shard in another plan: now this conversion's
                rec.update(conversion=conversion, src=src)
                write_atomic(done_records.record_path(out, name), json.dumps(rec), root=out)
            records[name] = rec
    _unpublish_before_replacing(out, [name for name, _, _ in tasks])
    todo_images = sum(getattr(it, "rows", 1) for t in tasks for it in t[1])  # an item is an image or ``rows`` of them
    if tasks:
        print(
            f"{src} -> {out}: {plural(len(tasks), 'shard')} to write ({plural(todo_images, 'image', grouped=True)}), "
            f"{plural(len(records), 'complete shard')} kept",
            file=sys.stderr,
        )
    if tasks and before_writing is not None:
        opts = dict(opts, **before_writing(tasks))
    rate = _Rate()
    kept = len(records)
    try:
        _run_tasks(out, tasks, opts, workers, todo_images, rate, progress, records)
    except KeyboardInterrupt:
        total = len(digests)
        raise Interrupted(
            f"interrupted: {len(records) - kept} of the {plural(len(tasks), 'shard')} to write were written "
            f"({len(records)} of {total} complete in {out}); run the same command again to resume "
            "(complete shards are kept)"
        ) from None

    def sizes(name: str) -> tuple[tuple[int, int], ...] | None:
        return tuple((h, w) for h, w in records[name]["sizes"]) if _records_sizes(name) else None

    splits_written = {
        split: [
            ShardInfo(
                name,
                name + ".idx",
                records[name]["num_records"],
                records[name]["bytes"],
                records[name]["checksum"],
                sizes(name),
            )
            for name, _ in shards
        ]
        for split, shards in plans.items()
    }
    manifest = Manifest(
        num_classes=len(classes),
        label_offset=LABEL_OFFSET,
        classes=[ClassInfo(i + LABEL_OFFSET, c, texts[c]) for i, c in enumerate(classes)],
        splits=splits_written,
        skipped={split: sum(len(records[n]["skipped"]) for n, _ in shards) for split, shards in plans.items()},
        order=_val_order(splits_written.get("validation")),
        tool=TOOL,
        tool_version=TOOL_VERSION,
        data_dir=out,
    )
    write_manifest(manifest, out)
    _remove_shards(out, stale)  # only now: until the new manifest is in place, the old one stays valid
    if stale:
        print(f"removed {plural(len(stale), 'shard')} of the replaced shard set(s) ({stale[0]}, ...)", file=sys.stderr)
    skipped = [s for r in records.values() for s in r["skipped"]]
    skipped_list = os.path.join(out, SKIPPED_LIST)
    if skipped:
        write_atomic(skipped_list, os.fsencode("".join(f"{p}\t{why}\n" for p, why in skipped)), root=out)
    elif os.path.exists(skipped_list):  # from an earlier run whose bad files have since been fixed
        os.remove(skipped_list)
    counts = ", ".join(
        f"{s}: {plural(manifest.num_examples(s), 'image', grouped=True)} in {plural(len(manifest.shards(s)), 'shard')}"
        for s in plans
    )
    extra = f"; {plural(len(skipped), 'unreadable image')} skipped (listed in {skipped_list})" if skipped else ""
    print(
        f"wrote {os.path.join(out, 'dataset.json')}: {counts}; {plural(manifest.num_classes, 'class')}; "
        f"{reencoded_summary(list(records.values()))}{extra}" + (f"; {rate}" if tasks else ""),
        file=sys.stderr,
    )
    return load_manifest(out)


def reencoded_summary(records: list[dict]) -> str:
    """The summary's words on the images decoded and written again (`imagefolder.prepare_bytes`): how many, and
    the transparent ones among them, counted and named (the first three), since their look depends on the
    background they were composited on."""
    reenc = sum(r["reencoded"] for r in records)
    transparent = sorted(p for r in records for p in r["transparent"])
    line = f"{plural(reenc, 'image')} re-encoded as RGB JPEG"
    if transparent:
        named = ", ".join(transparent[:3]) + (f" and {len(transparent) - 3:,} more" if len(transparent) > 3 else "")
        background = "white" if imagefolder.BACKGROUND == (255, 255, 255) else str(imagefolder.BACKGROUND)
        line += f" ({len(transparent):,} of them transparent, composited on {background}: {named})"
    return line


def _evaluation_only_note(src: str, out: str, num_classes: int) -> str:
    """The line a conversion without ``train/`` prints: what it converts, and what the result is for."""
    return (
        f"{src} has no train/: converting the {plural(num_classes, 'class folder')} of "
        f"{imagefolder.evaluation_folder(src)} as a validation split only, to evaluate on "
        f"(vitlarge-evaluate --data {out}); training needs ROOT/train/<class>/*"
    )


def _val_order(shards: list[ShardInfo] | None) -> dict[str, str]:
    """The validation split's ``order`` for the manifest: by aspect ratio, as `val_order.aspect_sorted` planned it,
    where the sizes the writer read agree (an image whose header PIL could not parse, planned last, may
    have been written all the same: the split is then in no promised order)."""
    if not shards:
        return {}
    sizes = [size for s in shards for size in s.sizes or ()]
    return {"validation": ASPECT_ORDER} if out_of_aspect_order(sizes) is None else {}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a conversion; the text says what was done and that a rerun resumes."""


def _unpublish_before_replacing(out: str, names: list[str]) -> None:
    """Remove ``dataset.json`` (durably) before any shard in ``names`` is replaced under its name: from
    then on the old manifest would describe files that are no longer there, and a run that stops
    part-way must leave no manifest rather than a wrong one. A run that replaces nothing keeps it."""
    path = os.path.join(out, MANIFEST_NAME)
    if os.path.lexists(path) and any(os.path.lexists(os.path.join(out, n)) for n in names):
        os.remove(path)
        fsync_dir(out)
        print(f"removed {path}: shards are replaced under their names; it is written again at the end", file=sys.stderr)


def _run_tasks(out, tasks, opts, workers, todo_images, rate, progress, records: dict) -> None:
    """Write the shards of ``tasks``, adding each done-record to ``records`` as it completes."""
    if not tasks:
        return
    # lazy: rich only where there are shards to write
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("converting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        disable=not progress,
        transient=False,
    )
    with bar:
        task = bar.add_task("convert", total=todo_images, rate="")

        def advance(n, nbytes):
            rate.images += n
            rate.bytes += nbytes
            bar.update(task, advance=n, rate=str(rate))

        if workers <= 0:  # in-process: debugging and tests
            for name, items, digest in tasks:
                rec = _guard(lambda: write_shard(out, name, items, opts, digest))
                records[name] = rec
                advance(rec["num_records"] + len(rec["skipped"]), sum(i.size for i in items))
            return
        ctx = mp.get_context(_start_method())
        q, stop = ctx.Queue(), ctx.Event()
        futures: dict = {}
        pool = cf.ProcessPoolExecutor(
            min(workers, len(tasks)), mp_context=ctx, initializer=_init_worker, initargs=(q, stop, opts)
        )  # the options once a worker (forked: not even copied), not pickled with each of 1,152 ImageNet shards
        try:
            futures = {pool.submit(_write_shard_unless_stopped, out, n, items, d): (n, items) for n, items, d in tasks}
            pending = set(futures)
            while pending:
                done, pending = cf.wait(pending, timeout=0.2, return_when=cf.FIRST_COMPLETED)
                _drain(q, advance)
                for f in done:
                    rec = _guard(f.result)
                    records[rec["shard"]] = rec
                    if opts["skip_bad"] and rec["skipped"]:
                        advance(len(rec["skipped"]), 0)
            _drain(q, advance)
        except BaseException:
            stop.set()  # shards in progress complete and keep their records; the others do not start
            pool.shutdown(wait=True, cancel_futures=True)
            for f in futures:
                if f.done() and not f.cancelled() and f.exception() is None and f.result() is not None:
                    records[f.result()["shard"]] = f.result()
            raise
        pool.shutdown(wait=True)


def _start_method() -> str:
    """fork (workers start in milliseconds) unless this process has loaded torch or DALI.

    Their thread pools may hold locks at fork time and deadlock the child, so a process that
    imported them (a test session, a notebook) pays spawn's ~0.5 s of imports per worker instead.
    """
    threaded = any(m in sys.modules for m in ("torch", "nvidia.dali.backend_impl"))
    return "fork" if not threaded and "fork" in mp.get_all_start_methods() else "spawn"


def _drain(q, advance) -> None:
    while True:
        try:
            n, nbytes = q.get_nowait()
        except queue.Empty:
            return
        advance(n, nbytes)


def _guard(fn):
    """Run a shard task, turning bad images and I/O failures into one-line UserErrors."""
    try:
        return fn()
    except BadImage as e:
        raise UserError(
            f"{e.args[0]}: unreadable image ({e.args[1]}); replace or remove it, or rerun with --skip-bad "
            "to skip and count such files (complete shards are kept)"
        ) from None
    except OSError as e:
        where = e.filename or "output"
        if e.errno == 28:  # ENOSPC
            raise UserError(
                f"{where}: disk full while writing (partial files removed); free space or choose another "
                "--out, then rerun: complete shards are kept"
            ) from None
        raise UserError(f"{where}: {e.strerror or e}; fix the file system problem and rerun") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=command("data_tools.imagenet_to_tfrecord"), description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--src",
        required=True,
        help="ROOT with ROOT/train/<class>/* and ROOT/val/...; without train/, ROOT/val/<class>/* or ROOT/<class>/* "
        "converts a validation split only, to evaluate on; or a Hugging Face data set's folder of parquet shards "
        "(ROOT/data/train-NNNNN-of-NNNNN.parquet, ...: data_tools.parquet_source)",
    )
    p.add_argument("--out", required=True, help="output directory for shards, indexes and dataset.json")
    p.add_argument(
        "--train-shards", type=int, help="default: ImageNet's shard size (1,252 images), at most 1024 shards"
    )
    p.add_argument("--val-shards", type=int, help="default: ImageNet's shard size (391 images), at most 128 shards")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="processes; 0 = in-process")
    p.add_argument("--val-labels", help="labels for a flat ROOT/val: LOC_val_solution.csv or 'filename class' lines")
    bad = p.add_mutually_exclusive_group()
    bad.add_argument("--skip-bad", action="store_true", help="skip unreadable images, report and count them")
    bad.add_argument(
        "--fail-on-bad", dest="skip_bad", action="store_false", help="stop at the first unreadable image (default)"
    )
    p.add_argument(
        "--check",
        choices=("header", "decode"),
        default="header",
        help="header: parse headers, require the JPEG end marker (fast); decode: decode every image",
    )
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="larger images are unreadable (PIL's decompression-bomb guard); raise it for trusted, very large images",
    )
    p.add_argument(
        "--min-class-images",
        type=int,
        default=imagefolder.MIN_CLASS_IMAGES,
        metavar="N",
        help="warn about classes with fewer training images (default %(default)s); the conversion goes on",
    )
    p.add_argument("--seed", type=int, default=0, help="train shuffle seed")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if (a.train_shards is not None and a.train_shards < 1) or (a.val_shards is not None and a.val_shards < 1):
        p.error("--train-shards and --val-shards must be >= 1")
    if a.max_image_pixels < 1:
        p.error("--max-image-pixels must be >= 1")
    shared = ("train_shards", "val_shards", "workers", "skip_bad", "seed", "check", "max_image_pixels")
    common = {k: getattr(a, k) for k in shared} | {"progress": not a.no_progress}
    if not os.path.isdir(os.path.join(a.src, "train")):
        from . import parquet_source  # lazy: pyarrow only where the source may be parquet

        if parquet_source.is_parquet_source(a.src):  # a Hugging Face data set's folder
            return run_cli(lambda: convert_parquet(a.src, a.out, **common))
    return run_cli(
        lambda: convert(a.src, a.out, val_labels=a.val_labels, min_class_images=a.min_class_images, **common)
    )


def run_cli(work) -> int:
    """`cli_main` for the converters: Ctrl-C is one line saying what was done and that a rerun resumes
    (the `Interrupted` text), no traceback; then the process ends by SIGINT, as an interrupted
    command should (a shell sees status 130 and a script running it stops too)."""
    try:
        return cli_main(work)
    except KeyboardInterrupt as e:
        text = str(e) if isinstance(e, Interrupted) else "interrupted; run the same command again to resume"
        print(text, file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return EXIT_INTERRUPTED  # where SIGINT is blocked


if __name__ == "__main__":
    sys.exit(main())
