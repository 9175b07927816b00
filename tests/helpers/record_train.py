"""train.py that records what each rank trained on: a test-only entry point that wraps the batch source.

    VITLARGE_RECORD=<folder> python tests/helpers/record_train.py train.py-arguments...

Every micro-batch a rank takes appends one line to ``<folder>/rank_<R>.jsonl``: the process id (one per
attempt), the rank, the world size and a SHA-256 of the images' bytes with the labels. Nothing else
changes. Used by tests/e2e/test_fresh_streams.py to show a resume at another world size does not replay
the images the run started with.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root


class RecordedBatches:
    def __init__(self, source, path: Path, rank: int, world_size: int):
        self.source, self.path, self.rank, self.world_size = source, path, rank, world_size

    def __iter__(self):
        return self

    def __next__(self):
        images, labels = next(self.source)
        digest = hashlib.sha256(images.detach().cpu().numpy().tobytes()).hexdigest()[:16]
        record = {"pid": os.getpid(), "rank": self.rank, "world": self.world_size, "images": digest}
        with open(self.path, "a") as f:
            f.write(json.dumps({**record, "labels": labels.detach().cpu().tolist()}) + "\n")
        return images, labels

    def state(self):
        return self.source.state()

    def __getattr__(self, name):  # anything else (reset, close, ...) is the source's
        return getattr(self.source, name)


def main(argv: list[str]) -> int:
    import train
    from vitlarge.data import sources

    folder, real = Path(os.environ["VITLARGE_RECORD"]), sources.train_loader
    folder.mkdir(parents=True, exist_ok=True)

    def train_loader(cfg, rank, world_size, *args, **kwargs):
        return RecordedBatches(
            real(cfg, rank, world_size, *args, **kwargs), folder / f"rank_{rank}.jsonl", rank, world_size
        )

    sources.train_loader = train_loader  # vitlarge.data.phased looks it up on vitlarge.data.sources at call time
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
