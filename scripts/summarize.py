"""Prints the final validation accuracy of a run and where its logs are: ``python -m scripts.summarize WORKDIR``."""

import sys
from pathlib import Path

from hooks.jsonl import read_metrics


def main(workdir: str) -> int:
    path = Path(workdir) / "metrics.jsonl"
    if not path.is_file():
        print(f"error: {path} does not exist; did the run start?", file=sys.stderr)
        return 2
    evals = [r for r in read_metrics(path) if r.get("event") == "eval"]
    if not evals:
        print(f"error: {path} has no evaluation yet", file=sys.stderr)
        return 2
    last = evals[-1]
    print(f"final validation top-1 {100 * last['val_top1']:.2f}% (top-5 {100 * last['val_top5']:.2f}%, "
          f"loss {last['val_loss']:.4f}) at step {last['step']} on {last['val_images']} images")
    print(f"logs: {path}  TensorBoard: tensorboard --logdir {Path(workdir) / 'tb'}  "
          f"model: {Path(workdir) / 'model.safetensors'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo_digits"))
