"""``python -m vitlarge.run.pod``: the command of a training pod on Kubernetes (scripts/k8s/).

    python -m vitlarge.run.pod train.py --config recipes/vit_b16.py --data /data/imagenet-tfrecord --workdir ...

Kubeflow Trainer's torch runtime (TrainJob) and the training operator (PyTorchJob) start every pod of a job with
the rendezvous in its environment (`vitlarge.distributed.launcher.pod_rendezvous`). This reads it and runs
``python -m vitlarge.run`` (torchrun's agent, one worker per process of the pod) with it, so a pod's command is
the same on both controllers and any number of nodes. A pod started without those variables (a bare Pod, a
runtime that is not torch's) would train a run of its own into the shared workdir: it stops with one line and
exit status 2 instead, as does a variable torchrun would refuse with a traceback (a port out of range, a master
that is no host name, an elastic range of nodes, ``PET_NPROC_PER_NODE=gpu`` without a GPU). Restarts are the controller's (torchrun's ``--max_restarts`` stays 0); each start
resumes from the newest checkpoint in the workdir, as a requeued Slurm job does.
"""

from __future__ import annotations

import os
import sys

from vitlarge.distributed.launcher import pod_rendezvous
from vitlarge.errors import EXIT_BAD_INPUT, UserError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        rendezvous = pod_rendezvous(os.environ)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    import torch  # lazy: keeps torch off the one-line error path

    from vitlarge.run import supervisor  # lazy: keeps torch off the one-line error path

    if rendezvous.nproc_per_node == "gpu" and not torch.cuda.is_available():  # torchrun: "Cuda is not available."
        print(
            "error: PET_NPROC_PER_NODE='gpu' asks for one process per GPU, but CUDA sees no GPU in this pod; "
            "request nvidia.com/gpu in the pod's resources, or set numProcPerNode / nprocPerNode to a count",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_BAD_INPUT
    print(f"vitlarge.run.pod: {' '.join(rendezvous.torchrun_args())} (from {rendezvous.source})", flush=True)
    return supervisor.main([*rendezvous.torchrun_args(), *argv])


if __name__ == "__main__":
    sys.exit(main())
