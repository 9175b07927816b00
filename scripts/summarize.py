"""Prints the final validation accuracy of a run and where its logs are: ``python -m scripts.summarize WORKDIR``."""

import sys
from pathlib import Path

from vitlarge.checkpoint.export import EXPORT_DIR
from vitlarge.report.metrics_log import FILENAME, PLOT_FILENAME, TB_DIRNAME, read_metrics


def main(workdir: str) -> int:
    path = Path(workdir) / FILENAME
    if not path.is_file():
        print(f"error: {path} does not exist; did the run start?", file=sys.stderr)
        return 2
    evals = [r for r in read_metrics(path) if r.get("event") == "eval"]
    if not evals:
        print(f"error: {path} has no evaluation yet", file=sys.stderr)
        return 2
    last = evals[-1]
    print(
        f"final validation top-1 {100 * last['val_top1']:.2f}% (top-5 {100 * last['val_top5']:.2f}%, "
        f"loss {last['val_loss']:.4f}) at step {last['step']} on {last['val_images']} images"
    )
    w = Path(workdir)
    print(f"picture: {w / PLOT_FILENAME}  logs: {path}  TensorBoard: tensorboard --logdir {w / TB_DIRNAME}")
    print(f'model: {w / EXPORT_DIR}  (timm.create_model("local-dir:{w / EXPORT_DIR}", pretrained=True))')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/demo_digits"))
