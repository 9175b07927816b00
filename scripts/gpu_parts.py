"""Wheels too large for one device command, sent in parts: pack and split here, receive, reassemble, check and
install there.

The GPU machines this project borrows take at most 64 MiB of files per command (the checkout included), keep
what an earlier command left in an ignored folder only while they stay warm (about 30 s idle), and reach no
network. DALI for CUDA 13 alone is about 190 MiB. So the wheels travel as parts, one part per command, back to
back (docs/GPU_SESSION.md, "DALI in parts"):

    python3 scripts/gpu_parts.py download .gpu/wheels                # here: requirements/gpu-dali.txt and
                                                                     #   gpu-kit.txt, for CPython 3.12 x86-64
    python3 scripts/gpu_parts.py pack .gpu/wheels .gpu/parts         # here: one tar of every wheel, in parts
    python3 scripts/gpu_parts.py receive .gpu/parts                  # there, each command: stage what came
    python3 scripts/gpu_parts.py install .gpu/parts --target DIR     # there, the last: reassemble, install

``pack`` writes ``manifest.json`` (each part's and each wheel's size and sha256) beside ``part-01``... Each
command carries the manifest and one part; ``receive`` checks the part against the manifest and moves it to a
staging folder outside the checkout (``--stage DIR``), so a part survives however the checkout is copied there
next. ``install`` receives the part it was sent with, then needs all of them: it joins them, checks the whole
tar's sha256 and every wheel's, and installs them with pip (``--no-index --no-deps --target``). A missing or
damaged part is one line naming it and what to send, exit 2.

The manifest and the parts come from elsewhere: they are data. The manifest is read with a cap, never through a
link, FIFO or device, and checked whole (every name a plain name, every size and hash of its type and bounds)
before anything is written; each wrong key is one line naming the file and the key, exit 2. The stage is a
private folder (`private_stage`): a new one from ``tempfile.mkdtemp`` when ``--stage`` is not given, else the
folder named, which must be this user's, not a link, and writable by no one else; a link found in it is refused,
never followed, and temporaries are opened ``O_EXCL | O_NOFOLLOW``. The parts are joined into a temporary that
never takes a final name, and the wheels are extracted into a fresh folder renamed to ``wheels`` only once every
one matched its sha256: pip installs only from there.

Standard library and ``vitlarge.fileio`` (standard library only itself), Python 3.10+: it runs on the bare GPU
machine before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]
if not __package__:  # run as a file (python3 scripts/gpu_parts.py): this checkout's vitlarge, ahead of any installed
    sys.path.insert(1, str(ROOT))
from vitlarge.fileio import UnsafeFile, open_new, open_regular, read_capped, remove_name, write_atomic  # noqa: E402

MANIFEST = "manifest.json"
FORMAT = "vitlarge-gpu-parts"
TRAVEL_LIMIT = 64 * 2**20
"""What one device command carries: the checkout (tracked and untracked-not-ignored files) and the carried paths."""
RESERVE = 2 * 2**20
"""Room kept under the limit beside the checkout and the part: the manifest, and a checkout that grows a little
between packing and sending."""
MANIFEST_CAP = 2**20
"""The largest manifest.json read (pack's for 15 wheels and 5 parts: 3 KB); a longer file is refused unread."""
PAYLOAD_LIMIT = 2**30
"""The largest bundle joined, four times the 15 wheels of DALI and Colossal-AI (231 MiB): what the stage's disk
may be asked for."""
EXTENDED_HEADER_LIMIT = 64 * 1024
"""The largest pax or GNU long-name header in the joined tar. tarfile holds one whole and parses it with a regular
expression (100 MiB: 21 s and 330 MB); pack writes a few hundred bytes (a name over 100 characters)."""
EXTENDED = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)
BUNDLES = {"dali": "requirements/gpu-dali.txt", "colossalai": "requirements/gpu-kit.txt"}
"""Each bundle's wheels come from one requirements file; all install into one folder."""
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "manylinux_2_5_x86_64",
)
CHUNK = 4 * 2**20


class PartsError(Exception):
    """One line for the user (printed as ``gpu_parts: <line>``, exit 2)."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def distribution(wheel: str) -> str:
    """A wheel file's distribution name, normalised (PEP 503): ``nvidia_dali_cuda130-2.4.0-...`` -> ``nvidia-dali-cuda130``."""
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


def checkout_bytes(root: Path = ROOT) -> int:
    """What travels with every command besides the carried paths: tracked and untracked-not-ignored files."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in out.decode().split("\0"):
        p = root / name
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def part_budget(checkout: int, manifest_bytes: int = 64 * 1024) -> int:
    """The largest part (bytes, a whole MiB) that fits one command beside ``checkout`` and the manifest."""
    room = TRAVEL_LIMIT - checkout - manifest_bytes - RESERVE
    if room < 2**20:
        raise PartsError(
            f"the checkout travels {mib(checkout)} of the {mib(TRAVEL_LIMIT)} a command carries: no room for a part"
        )
    return room // 2**20 * 2**20


# ---------------------------------------------------------------------------------------------------- here


def requirements(path: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def download(dest: Path, python: str = "3.12", bundles: dict[str, str] = BUNDLES) -> None:
    """Every pinned wheel of each bundle into ``dest/<bundle>/``, for CPython ``python`` on x86-64 Linux. A package
    published only as a source archive (Colossal-AI, contexttimer, tfrecord) is pure Python: pip builds its wheel."""
    for bundle, req in bundles.items():
        out = dest / bundle
        out.mkdir(parents=True, exist_ok=True)
        for pin in requirements(ROOT / req):
            env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}  # PyPI only: no local index or constraints
            plat = [a for p in PLATFORMS for a in ("--platform", p)]
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
            cmd += ["--python-version", python, "--implementation", "cp", *plat, "-d", str(out), pin]
            if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
                built = subprocess.run(
                    [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), pin],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if built.returncode != 0:
                    raise PartsError(f"{req}: {pin} has no wheel for CPython {python} and no buildable source")
        for leftover in out.glob("*.tar.gz"):
            leftover.unlink()
        print(f"gpu_parts: {bundle}: {len(list(out.glob('*.whl')))} wheels in {out}", flush=True)


def pack(wheels: Path, out: Path, part_bytes: int | None = None, checkout: int | None = None) -> dict:
    """One uncompressed tar of ``wheels/<bundle>/*.whl`` (the wheels are zip files already), cut into parts of at
    most ``part_bytes`` (default: what fits one command beside the checkout, `part_budget`), with the manifest.
    Refused: an existing non-empty ``out``, no wheels, two wheels of one distribution (pip would stop on it)."""
    if out.exists() and any(out.iterdir()):
        raise PartsError(f"{out} exists and is not empty; give a new or empty folder")
    files = sorted(p for p in wheels.glob("*/*.whl") if p.is_file())
    if not files:
        raise PartsError(f"{wheels}: no <bundle>/*.whl here; run: python3 scripts/gpu_parts.py download {wheels}")
    seen: dict[str, Path] = {}
    for f in files:
        d = distribution(f.name)
        if d in seen:
            raise PartsError(f"{d} twice: {seen[d].relative_to(wheels)} and {f.relative_to(wheels)}; keep one")
        seen[d] = f
    checkout = checkout_bytes() if checkout is None else checkout
    part_bytes = part_bytes or part_budget(checkout)
    out.mkdir(parents=True, exist_ok=True)
    entries = [{"path": f"{f.parent.name}/{f.name}", "bytes": f.stat().st_size, "sha256": sha256_of(f)} for f in files]
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        tar_path = Path(tmp) / "wheels.tar"
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            for f, e in zip(files, entries):
                info = tarfile.TarInfo(e["path"])
                info.size, info.mode, info.mtime = e["bytes"], 0o644, 0
                with open(f, "rb") as src:
                    tar.addfile(info, src)
        total, parts = tar_path.stat().st_size, []
        with open(tar_path, "rb") as src:
            while True:
                name = f"part-{len(parts) + 1:02d}"
                h, n = hashlib.sha256(), 0
                with open(out / name, "wb") as dst:
                    while n < part_bytes and (block := src.read(min(CHUNK, part_bytes - n))):
                        dst.write(block)
                        h.update(block)
                        n += len(block)
                if n == 0:
                    (out / name).unlink()
                    break
                parts.append({"name": name, "bytes": n, "sha256": h.hexdigest()})
        manifest = {
            "format": FORMAT,
            "version": 1,
            "payload": {"name": "wheels.tar", "bytes": total, "sha256": sha256_of(tar_path)},
            "part_bytes": part_bytes,
            "checkout_bytes": checkout,
            "parts": parts,
            "wheels": entries,
        }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# --------------------------------------------------------------------------------------------------- there


def load_manifest(parts_dir: Path) -> dict:
    """``parts_dir/manifest.json``, read with `MANIFEST_CAP` (a regular file only, not through a link) and checked
    whole (`check_manifest`): what the rest of this module indexes is there, of its type, within its bounds."""
    path = parts_dir / MANIFEST
    try:
        raw = read_capped(path, MANIFEST_CAP, follow=False)
    except FileNotFoundError:
        raise PartsError(f"{path} is not here: carry it with every part (pack wrote it beside part-01)") from None
    except OSError as e:  # UnsafeFile (a link, FIFO, folder, device, a file over the cap) or unreadable
        raise PartsError(f"{path} {e.strerror}: carry the manifest.json pack wrote") from None
    try:
        m = json.loads(raw)
    except (ValueError, RecursionError):
        raise PartsError(f"{path} is not JSON: carry the manifest pack wrote") from None
    check_manifest(m, path)
    return m


PART_NAME = re.compile(r"part-\d{2,3}")
WHEEL_PATH = re.compile(r"[A-Za-z0-9_]+/[A-Za-z0-9_.+-]+\.whl")
PAYLOAD_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\.tar")
"""A plain file name in the stage that no part, the manifest or the wheels folder has (pack writes wheels.tar)."""
SHA256 = re.compile(r"[0-9a-f]{64}")


def check_manifest(m: object, path: Path) -> None:
    """`PartsError` naming ``path`` and the first key that is missing, of another type or out of bounds: the
    format and version; ``payload`` (``name`` a `PAYLOAD_NAME`, ``bytes`` up to `PAYLOAD_LIMIT` and the parts'
    sum, ``sha256``); ``parts`` (each ``name`` a distinct part-NN, ``bytes`` up to one command's `TRAVEL_LIMIT`,
    ``sha256``); ``wheels`` (each ``path`` a distinct <bundle>/<file>.whl, ``bytes`` together within the payload,
    ``sha256``)."""

    def bad(key: str, why: str) -> NoReturn:
        raise PartsError(f"{path}: {key} {why}; carry the manifest.json pack wrote with these parts")

    def show(v: object) -> str:
        try:
            r = repr(v)
        except RecursionError:  # nested as deep as json.loads allows, a few frames below here
            r = type(v).__name__
        return r if len(r) <= 40 else r[:37] + "..."

    def obj(v: object, key: str) -> dict:
        if not isinstance(v, dict):
            bad(key, f"is {show(v)}, not an object")
        return v

    def size(d: dict, key: str, most: int) -> int:
        v = d.get(key.rsplit(".", 1)[-1])
        if type(v) is not int or not 0 < v <= most:
            bad(key, f"is {show(v)}, not a whole number of bytes from 1 to {most:,}")
        return v

    def sha(d: dict, key: str) -> None:
        v = d.get(key.rsplit(".", 1)[-1])
        if not isinstance(v, str) or not SHA256.fullmatch(v):
            bad(key, f"is {show(v)}, not a sha256 (64 lowercase hexadecimal digits)")

    def listed(v: object, key: str, name_key: str, pattern: re.Pattern, what: str, most: int) -> int:
        """Each entry of list ``key``: ``name_key`` a distinct match of ``pattern``, ``bytes`` from 1 to ``most``,
        ``sha256``; returns their bytes' sum."""
        if not isinstance(v, list) or not v:
            bad(key, f"is {show(v)}, not a list of one or more entries")
        seen: set[str] = set()
        total = 0
        for i, e in enumerate(v):
            e = obj(e, f"{key}[{i}]")
            name = e.get(name_key)
            if not isinstance(name, str) or not pattern.fullmatch(name) or name in seen:
                bad(f"{key}[{i}].{name_key}", f"is {show(name)}, not {what} of its own")
            seen.add(name)
            total += size(e, f"{key}[{i}].bytes", most)
            sha(e, f"{key}[{i}].sha256")
        return total

    if not isinstance(m, dict):
        raise PartsError(f"{path} is not a {FORMAT} manifest (a JSON object)")
    if m.get("format") != FORMAT:
        bad("format", f"is {show(m.get('format'))}, not {FORMAT!r}")
    if m.get("version") != 1 or type(m.get("version")) is not int:
        bad("version", f"is {show(m.get('version'))}, not 1 (the one this gpu_parts.py reads)")
    payload = obj(m.get("payload"), "payload")
    name = payload.get("name")
    if not isinstance(name, str) or not PAYLOAD_NAME.fullmatch(name):
        bad("payload.name", f"is {show(name)}, not a plain file name ending .tar (the stage's name the parts join in)")
    total = size(payload, "payload.bytes", PAYLOAD_LIMIT)
    sha(payload, "payload.sha256")
    joined = listed(m.get("parts"), "parts", "name", PART_NAME, "part-NN", TRAVEL_LIMIT)
    if joined != total:
        bad("payload.bytes", f"is {total:,}, not the parts' {joined:,}")
    inside = listed(m.get("wheels"), "wheels", "path", WHEEL_PATH, "a <bundle>/<file>.whl", total)
    if inside > total:
        bad("wheels", f"hold {inside:,} bytes, more than the payload's {total:,}")


def private_stage(stage: Path | None) -> Path:
    """The folder parts wait in between commands, private to this user: a new one (``tempfile.mkdtemp``, mode
    0700) when ``stage`` is None; else ``stage``, made 0700 if absent, and refused unless it is a folder (not a
    link) of this user's that no one else may write in. Then no one else can have put a name in it: a fixed name
    in a shared folder (/tmp) could have been made first by anyone, with their links inside."""
    if stage is None:
        return Path(tempfile.mkdtemp(prefix="vitlarge-parts-"))
    try:
        stage.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(stage, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise PartsError(f"--stage {stage}: cannot make it ({e.strerror}); name a folder of yours") from None
    st = os.lstat(stage)
    why = (
        "is a symbolic link"
        if stat.S_ISLNK(st.st_mode)
        else "is not a folder"
        if not stat.S_ISDIR(st.st_mode)
        else f"belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
        if st.st_uid != os.geteuid()
        else f"may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
        if st.st_mode & 0o022
        else None
    )
    if why:
        raise PartsError(
            f"--stage {stage} {why}: the stage must be a private folder of this user's; name a new one "
            "(or leave --stage out: a fresh private one is made)"
        )
    return stage


def _present(path: Path) -> bool:
    """Whether the name ``path`` in the stage is there; a link there is refused, never followed (only this user
    writes in a private stage, and gpu_parts writes no links)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise PartsError(f"{path} is a symbolic link, which gpu_parts never writes: remove it, or name a new --stage")
    return True


def _label(m: dict, i: int) -> str:
    p = m["parts"][i]
    return f"{p['name']} ({i + 1} of {len(m['parts'])}, {mib(p['bytes'])})"


def receive(parts_dir: Path, stage: Path) -> tuple[dict, list[int]]:
    """Moves each part present in ``parts_dir`` to ``stage`` (a `private_stage`) after checking its size and
    sha256 against the manifest; returns the manifest and the indexes of the parts staged so far. A part that does
    not match is a `PartsError` (nothing of it is staged)."""
    m = load_manifest(parts_dir)
    stage = private_stage(stage)
    kept = stage / MANIFEST
    if _present(kept):
        try:
            old = json.loads(read_capped(kept, MANIFEST_CAP, follow=False)).get("payload")
        except (OSError, ValueError, RecursionError, AttributeError):
            old = None  # not one this module wrote: as another packing's
        if old != m["payload"]:
            for name in os.listdir(stage):  # parts of another packing: they cannot join these
                if PART_NAME.fullmatch(name):
                    remove_name(stage / name)
    write_atomic(kept, json.dumps(m, indent=1) + "\n")
    for i, p in enumerate(m["parts"]):
        src = parts_dir / p["name"]
        try:
            carried = open_regular(src, follow=False)
        except (FileNotFoundError, UnsafeFile):
            continue  # not carried with this command (a link or FIFO is never a carried part)
        tmp, dst = stage / f".{p['name']}.tmp", stage / p["name"]
        _present(tmp)
        _present(dst)
        h, n = hashlib.sha256(), 0
        with carried, open_new(tmp) as out:
            while n <= p["bytes"] and (block := carried.read(CHUNK)):  # a longer file is not read whole
                h.update(block)
                out.write(block)
                n += len(block)
            actual = os.fstat(carried.fileno()).st_size
        if n != p["bytes"] or h.hexdigest() != p["sha256"]:
            remove_name(tmp)
            raise PartsError(
                f"{src}: {actual} bytes whose sha256 is not the manifest's for {_label(m, i)}: "
                "it was cut short or comes from another packing; carry the part and manifest.json pack wrote together"
            )
        os.replace(tmp, dst)
        src.unlink()  # the checkout's copy: the next command's copy of the checkout does not need it
    have = [i for i, p in enumerate(m["parts"]) if _staged(stage / p["name"], p)]
    return m, have


def _staged(path: Path, p: dict) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == p["bytes"]


def missing_line(m: dict, have: list[int], stage: Path) -> str:
    """The one line that says which part is missing and what to send."""
    missing = [i for i in range(len(m["parts"])) if i not in have]
    first = missing[0]
    others = (
        f" (and {len(missing) - 1} more: {', '.join(m['parts'][i]['name'] for i in missing[1:])})"
        if missing[1:]
        else ""
    )
    staged = ", ".join(m["parts"][i]["name"] for i in have) or "none"
    return (
        f"missing {_label(m, first)}{others}; staged in {stage}: {staged}. Send it: carry .gpu/parts/{m['parts'][first]['name']} "
        "and .gpu/parts/manifest.json (a machine given back between commands starts empty: send from part-01 again)"
    )


def assemble(m: dict, stage: Path, have: list[int]) -> Path:
    """Joins the staged parts (each checked again) into a temporary that never takes a final name, checks its
    sha256, extracts the wheels (each checked) into a fresh folder that then becomes ``stage/wheels/<bundle>/``;
    returns ``stage/wheels``. The parts are removed once joined; on any refusal the temporaries are removed and the
    parts kept."""
    if len(have) != len(m["parts"]):
        raise PartsError(missing_line(m, have, stage))
    tar_path = stage / m["payload"]["name"]  # named in messages: the joined bytes stay in tmp
    tmp, wheels, fresh = stage / f".{tar_path.name}.tmp", stage / "wheels", stage / ".wheels.tmp"
    for name in (tmp, wheels, fresh):
        _present(name)
    try:
        _join(m, stage, tmp, tar_path)
        if _present(fresh):
            shutil.rmtree(fresh)  # an interrupted install's (a folder: rmtree follows no link inside it)
        os.mkdir(fresh, 0o700)
        _extract(m, tmp, tar_path, fresh)
        if _present(wheels):
            shutil.rmtree(wheels)
        os.replace(fresh, wheels)
    finally:
        remove_name(tmp)
        shutil.rmtree(fresh, ignore_errors=True)
    for p in m["parts"]:
        remove_name(stage / p["name"])
    return wheels


def _join(m: dict, stage: Path, tmp: Path, tar_path: Path) -> None:
    h = hashlib.sha256()
    with open_new(tmp) as dst:
        for i, p in enumerate(m["parts"]):
            ph, n = hashlib.sha256(), 0
            with open_regular(stage / p["name"], follow=False) as src:
                while n <= p["bytes"] and (block := src.read(CHUNK)):
                    ph.update(block)
                    h.update(block)
                    dst.write(block)
                    n += len(block)
            if n != p["bytes"] or ph.hexdigest() != p["sha256"]:
                raise PartsError(
                    f"{stage / p['name']}: its sha256 is not the manifest's for {_label(m, i)}; send it again"
                )
    if h.hexdigest() != m["payload"]["sha256"]:
        raise PartsError(f"{tar_path}: the joined parts' sha256 is not the manifest's; send every part again")


def _check_headers(tmp: Path, tar_path: Path) -> None:
    """Walks the joined tar's 512-byte headers before tarfile parses them: an extended header over
    `EXTENDED_HEADER_LIMIT` is refused, so no header costs more memory or time than pack's would."""
    with open_regular(tmp, follow=False) as f:
        while (block := f.read(tarfile.BLOCKSIZE)) and block.strip(b"\0"):
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")  # a HeaderError: not a tar
            if info.size < 0:  # base-256 allows it; seeking back would read this header again, forever
                raise tarfile.HeaderError(f"a header's size is {info.size}")
            if info.type in EXTENDED and info.size > EXTENDED_HEADER_LIMIT:
                raise PartsError(
                    f"{tar_path}: an extended header of {info.size:,} bytes (pack writes a few hundred): not a "
                    "bundle pack wrote; pack again, send every part"
                )
            f.seek(-(-info.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE, os.SEEK_CUR)


def _extract(m: dict, tmp: Path, tar_path: Path, into: Path) -> None:
    """Each member of the joined tar into ``into``: only the wheels the manifest lists (so only names inside
    ``into``), each once, at its size and sha256, then none missing."""
    expected = {w["path"]: w for w in m["wheels"]}
    done: set[str] = set()
    try:
        _check_headers(tmp, tar_path)
        with tarfile.open(tmp, "r:") as tar:  # pack's: uncompressed
            for member in tar:
                w = expected.get(member.name)
                if w is None or member.name in done or not member.isfile() or member.size != w["bytes"]:
                    raise PartsError(f"{tar_path}: member {member.name[:100]!r} is not a wheel the manifest lists")
                target = into / member.name
                target.parent.mkdir(exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                h = hashlib.sha256()
                with src, open_new(target) as dst:
                    while block := src.read(CHUNK):
                        h.update(block)
                        dst.write(block)
                if h.hexdigest() != w["sha256"]:
                    raise PartsError(f"{tar_path}: {member.name}'s sha256 is not the manifest's; send every part again")
                done.add(member.name)
    except tarfile.TarError as e:
        raise PartsError(
            f"{tar_path}: the joined parts match the manifest but are not a tar ({' '.join(str(e).split())[:200]}): "
            "pack again, send every part"
        ) from None
    absent = [p for p in expected if p not in done]
    if absent:
        raise PartsError(f"{tar_path}: {len(absent)} wheels the manifest lists are not in it, first {absent[0]}")


def install(wheels: Path, target: Path, python: str = sys.executable) -> list[str]:
    """pip installs every wheel into ``target`` (``--no-index --no-deps``: nothing else is reachable); returns
    their file names."""
    files = sorted(str(p) for p in wheels.glob("*/*.whl"))
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    cmd += ["--upgrade", "--target", str(target), *files]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise PartsError(f"pip could not install the wheels into {target}: {last}")
    return [Path(f).name for f in files]


def check(device: str) -> str:
    """After ``install``: DALI decodes a JPEG on ``device`` (``cuda``: the ``mixed`` decoder, nvImageCodec, nvJPEG),
    and what else the tier imports is there. One line; an import or decode that fails raises with DALI's words."""
    import importlib
    import io

    import numpy as np

    names = ("nvidia.dali", "nvidia.nvimgcodec", "tfrecord", "crc32c", "colossalai")
    versions, absent = {}, []
    for name in names:
        try:
            versions[name] = getattr(importlib.import_module(name), "__version__", "?")
        except Exception as e:  # noqa: BLE001  (reported in the line, with its kind)
            absent.append(f"{name} ({type(e).__name__}: {str(e)[:80]})")
    if "nvidia.dali" not in versions:
        raise PartsError(f"DALI does not import: {'; '.join(absent)}")
    import nvidia.dali.fn as fn
    from nvidia.dali import pipeline_def

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    try:
        from PIL import Image

        Image.fromarray(rng.integers(0, 255, (375, 500, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    except ImportError as e:
        raise PartsError(f"Pillow is needed to make the test JPEG: {e}") from None
    jpeg = np.frombuffer(buf.getvalue(), dtype=np.uint8)

    @pipeline_def(batch_size=4, num_threads=2, device_id=0 if device == "cuda" else None)
    def decode():
        encoded = fn.external_source(source=lambda: [jpeg] * 4, batch=True)
        return fn.decoders.image_random_crop(encoded, device="mixed" if device == "cuda" else "cpu")

    pipe = decode()
    pipe.build()
    (out,) = pipe.run()
    kind = type(out).__name__
    lib = "".join(
        f" {p}" for p in (Path(sys.modules["nvidia.dali"].__file__).parents[1] / "cu13" / "lib").glob("libnvjpeg*")
    )
    return (
        f"gpu_parts: check on {device}: DALI {versions['nvidia.dali']} decoded 4 JPEGs of 500x375 into {kind} "
        f"({'mixed' if device == 'cuda' else 'cpu'} decoder); nvImageCodec {versions.get('nvidia.nvimgcodec', 'absent')}; "
        f"nvJPEG from the wheel:{lib or ' none'}; "
        + ", ".join(f"{n} {v}" for n, v in versions.items() if n not in ("nvidia.dali", "nvidia.nvimgcodec"))
        + (f"; not importable: {'; '.join(absent)}" if absent else "")
    )


# Expected seconds of each device command, excluding the machine's start and the transfer (not measured here:
# the device tool reports neither; a first call starts the machine in "a minute or more"). From: the H200 tier
# run (7 tests in 148 s at -n 6, docs/GPU.md) plus 8 DALI tests; the data step's rows (train.py's start,
# compiling once then from Inductor's cache, 35 steps at the kit's 0.43 s per 1,024 images); the kit's budget.
STEP_SECONDS = {"part": 3, "tier": 300, "data": 300, "kit": 540}
START_SECONDS = 120
IDLE_BETWEEN_CALLS = 20


def plan(parts_dir: Path, checkout: int | None = None, device_seconds: int = 900) -> list[dict]:
    """The device tool's calls for the parts in ``parts_dir``: command, carry, timeout, MiB carried, expected
    seconds and the session's device time used so far (start, commands, idle between calls)."""
    m = load_manifest(parts_dir)
    checkout = checkout_bytes() if checkout is None else checkout
    calls, used = [], START_SECONDS
    n = len(m["parts"])
    man = (parts_dir / MANIFEST).stat().st_size
    for i, p in enumerate(m["parts"], 1):
        last = i == n
        cmd = f"bash scripts/gpu_session.sh part {i}" + (" tier" if last else "")
        secs = STEP_SECONDS["part"] + (STEP_SECONDS["tier"] if last else 0)
        calls.append(
            {
                "command": cmd,
                "carry": [f".gpu/parts/{MANIFEST}", f".gpu/parts/{p['name']}"],
                "timeout_s": 600 if last else 120,
                "carried_bytes": checkout + man + p["bytes"],
                "seconds": secs,
            }
        )
    calls.append(
        {
            "command": "bash scripts/gpu_session.sh data",
            "carry": [],
            "timeout_s": 560,
            "carried_bytes": checkout,
            "seconds": STEP_SECONDS["data"],
        }
    )
    calls.append(
        {
            "command": "bash scripts/gpu_session.sh kit",
            "carry": [],
            "timeout_s": 600,
            "carried_bytes": checkout,
            "seconds": STEP_SECONDS["kit"],
        }
    )
    kit_wheels = sum(w["bytes"] for w in m["wheels"] if w["path"].startswith("colossalai/"))
    for c in calls:
        if c["carried_bytes"] > TRAVEL_LIMIT:
            raise PartsError(
                f"{c['command']} would carry {mib(c['carried_bytes'])}, over {mib(TRAVEL_LIMIT)}: pack again"
            )
        used += c["seconds"] + IDLE_BETWEEN_CALLS
        c["device_seconds_so_far"] = used
        c["fits_this_session"] = used <= device_seconds
    alone = {  # the kit in a session of its own: the Colossal-AI wheels travel whole, beside the checkout
        "command": "bash scripts/gpu_session.sh kit .gpu/wheels/colossalai",
        "carry": [".gpu/wheels/colossalai"],
        "timeout_s": 600,
        "carried_bytes": checkout + kit_wheels,
        "seconds": STEP_SECONDS["kit"] + 15,
    }
    alone["device_seconds_so_far"] = START_SECONDS + alone["seconds"]
    alone["fits_this_session"] = (
        alone["carried_bytes"] <= TRAVEL_LIMIT and alone["device_seconds_so_far"] <= device_seconds
    )
    return calls + [alone]


# ------------------------------------------------------------------------------------------------- command


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_parts.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help="here: the bundles' wheels for the GPU machine's Python")
    d.add_argument("dest", type=Path)
    d.add_argument("--python", default="3.12")
    k = sub.add_parser("pack", help="here: one tar of the wheels, in parts, with manifest.json")
    k.add_argument("wheels", type=Path)
    k.add_argument("out", type=Path)
    k.add_argument("--part-mib", type=int, help="part size (default: what fits one command beside the checkout)")
    c = sub.add_parser("check", help="there, after install: DALI decodes on the device; what imports")
    c.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    pl = sub.add_parser("plan", help="here: the device tool's calls for the packed parts")
    pl.add_argument("parts", type=Path)
    pl.add_argument("--device-seconds", type=int, default=900, help="the session's device time (default 900)")
    for name in ("receive", "install"):
        r = sub.add_parser(
            name, help="there: stage the carried part" + ("; then join and install" if name == "install" else "")
        )
        r.add_argument("parts", type=Path)
        r.add_argument(
            "--stage",
            type=Path,
            help="the private folder parts wait in between commands (made 0700 if absent; refused if a link, "
            "another user's or writable by others); default: a new one from mkdtemp, named in the output",
        )
        if name == "install":
            r.add_argument("--target", type=Path, required=True, help="folder for the packages (then PYTHONPATH)")
    a = p.parse_args(argv)
    try:
        if a.cmd == "download":
            download(a.dest, a.python)
        elif a.cmd == "check":
            print(check(a.device))
        elif a.cmd == "plan":
            calls = plan(a.parts, device_seconds=a.device_seconds)
            print("| # | run: command | carry | timeout_s | MiB carried | command s (est.) | device s so far (est.) |")
            print("|---:|---|---|---:|---:|---:|---:|")
            for i, c in enumerate(calls, 1):
                over = "" if c["fits_this_session"] else f" (past {a.device_seconds} s: next session)"
                if i == len(calls):
                    print("| | **or, the kit in a session of its own (one call):** | | | | | |")
                    over = "" if c["fits_this_session"] else " (does not fit)"
                print(
                    f"| {i} | `{c['command']}` | {', '.join(c['carry']) or '-'} | {c['timeout_s']} | "
                    f"{c['carried_bytes'] / 2**20:.1f} | {c['seconds']} | {c['device_seconds_so_far']}{over} |"
                )
        elif a.cmd == "pack":
            m = pack(a.wheels, a.out, a.part_mib and a.part_mib * 2**20)
            print(
                f"gpu_parts: {len(m['wheels'])} wheels, {mib(m['payload']['bytes'])} in {len(m['parts'])} parts of at "
                f"most {mib(m['part_bytes'])} in {a.out} (each command: checkout {mib(m['checkout_bytes'])} + part + "
                f"manifest, under {mib(TRAVEL_LIMIT)})"
            )
        else:
            stage = private_stage(a.stage)
            again = "" if a.stage else f" (a new private folder: give --stage {stage} to the next receive and install)"
            try:
                m, have = receive(a.parts, stage)
                if a.cmd == "receive":
                    left = [m["parts"][i]["name"] for i in range(len(m["parts"])) if i not in have]
                    print(
                        f"gpu_parts: {len(have)} of {len(m['parts'])} parts staged in {stage}{again}"
                        + (f"; still to send: {', '.join(left)}" if left else "; all here: run install")
                    )
                else:
                    wheels = assemble(m, stage, have)
                    names = install(wheels, a.target)
                    print(
                        f"gpu_parts: {len(m['parts'])} parts joined, sha256 {m['payload']['sha256'][:12]} ok, "
                        f"{len(names)} wheels installed into {a.target}"
                    )
            finally:
                if not a.stage and (a.cmd == "install" or not any(stage.iterdir())):
                    shutil.rmtree(stage, ignore_errors=True)  # its own mkdtemp, which no later command is told of
    except PartsError as e:
        print(f"gpu_parts: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
