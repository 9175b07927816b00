"""What Kubernetes' training controllers make of scripts/k8s/'s manifests, pod by pod, without a cluster.

Each function reads a manifest as the controller does and returns its pods: host name, the command and arguments
the container runs, the variables the controller adds, and what the job does when a pod ends. The behaviour is
the controllers' own, read from their source at the commits whose CRDs tests/data/k8s/ keeps:

* Kubeflow Trainer (kubeflow/trainer 8c0f5059bd51ec3ba6d6a6a7b2e1471de7bc13b3), the torch plugin's
  ``EnforceMLPolicy`` (pkg/runtime/framework/plugins/torch/torch.go): the TrainJob's ``trainer.numNodes`` is the
  node job's pod count; into container ``node`` it adds ``PET_NNODES`` (that count), ``PET_NPROC_PER_NODE``
  (``trainer.numProcPerNode``), ``PET_NODE_RANK`` (the pod's Job completion index), ``PET_MASTER_ADDR``
  (``<trainjob>-node-0-0.<trainjob>``: JobSet's pod 0 through the job's headless service) and
  ``PET_MASTER_PORT`` (``constants.ContainerTrainerPort``, 29500); the TrainJob's ``trainer.args``/``command``
  replace the runtime container's. JobSet names pod ``i`` of replicated job ``node`` ``<trainjob>-node-0-<i>``.
* The training operator v1.9.0 (kubeflow/training-operator 6f74c7f6b2ed6c27aabd82d0a316b23f0646059c),
  ``setPodEnv`` (pkg/controller.v1/pytorch/envvar.go) and ``MasterEnvVarGenerator`` (master.go): into every
  container ``PYTHONUNBUFFERED=1``, ``MASTER_ADDR`` = ``PET_MASTER_ADDR`` = ``<job>-master-0``, ``MASTER_PORT`` =
  ``PET_MASTER_PORT`` = the Master's container port named ``pytorchjob-port``, ``WORLD_SIZE`` = pods x
  ``nprocPerNode``, ``RANK`` = ``PET_NODE_RANK`` = the pod's index (workers count from 1), ``PET_NPROC_PER_NODE``
  (``nprocPerNode``) and ``PET_NNODES`` (the pods). Pods are ``<job>-<master|worker>-<index>``.

``${VITLARGE_IMAGE}`` is substituted as ``envsubst`` would. A Secret named by ``envFrom`` is taken as absent
(the manifests mark it optional).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

TRAINER_PORT = 29500  # kubeflow/trainer pkg/constants/constants.go ContainerTrainerPort


@dataclass(frozen=True)
class Pod:
    """One pod as its controller starts it. ``fqdn``: the name other pods reach it by (its host name under the
    job's headless service); ``restart``: whether a container that exits non-zero runs again (``OnFailure`` restarts
    it in place, ``Never`` has the Job create a replacement with the same index and name); ``fail_job_on``: the exit
    statuses after which the Job fails instead (podFailurePolicy ``FailJob``); ``backoff_limit``: failed pods the
    Job tolerates in all; ``grace_s``: the seconds between the kubelet's SIGTERM and its SIGKILL."""

    hostname: str
    fqdn: str
    command: list[str]
    env: dict[str, str]
    restart: bool
    fail_job_on: frozenset[int]
    backoff_limit: int
    grace_s: int


def load(path: Path, image: str = "vitlarge:test") -> list[dict]:
    """The manifest's documents, ``${VITLARGE_IMAGE}`` replaced."""
    return list(yaml.safe_load_all(Path(path).read_text().replace("${VITLARGE_IMAGE}", image)))


def by_kind(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _plain_env(container: dict) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def _fail_codes(job_spec: dict, container: str) -> frozenset[int]:
    codes: set[int] = set()
    for rule in job_spec.get("podFailurePolicy", {}).get("rules", []):
        on = rule.get("onExitCodes")
        if rule["action"] == "FailJob" and on and on.get("containerName", container) == container:
            assert on["operator"] == "In", on  # NotIn: not used by the manifests
            codes.update(on["values"])
    return frozenset(codes)


def trainjob_pods(docs: list[dict]) -> list[Pod]:
    """The pods of a TrainJob on the TrainingRuntime in the same manifest."""
    job = by_kind(docs, "TrainJob")
    runtime = by_kind(docs, "TrainingRuntime")
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    (node,) = [r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"] if r["name"] == "node"]
    job_spec = node["template"]["spec"]
    pod_spec = job_spec["template"]["spec"]
    (container,) = [c for c in pod_spec["containers"] if c["name"] == "node"]
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    command = trainer.get("command", container.get("command", [])) + trainer.get("args", container.get("args", []))
    pods = []
    for index in range(nodes):
        env = {**_plain_env(container), **{e["name"]: str(e["value"]) for e in trainer.get("env", [])}}
        env.update(
            PET_NNODES=str(nodes),
            PET_NPROC_PER_NODE=str(trainer.get("numProcPerNode", "auto")),
            PET_NODE_RANK=str(index),
            PET_MASTER_ADDR=f"{name}-node-0-0.{name}",
            PET_MASTER_PORT=str(TRAINER_PORT),
        )
        host = f"{name}-node-0-{index}"
        pods.append(
            Pod(
                host,
                f"{host}.{name}",
                command,
                env,
                pod_spec["restartPolicy"] in ("OnFailure", "Never"),
                _fail_codes(job_spec, "node"),
                job_spec.get("backoffLimit", 6),
                pod_spec.get("terminationGracePeriodSeconds", 30),
            )
        )
    return pods


def pytorchjob_pods(doc: dict) -> list[Pod]:
    """The pods of a PyTorchJob (a Master and its Workers)."""
    name, spec = doc["metadata"]["name"], doc["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    total = sum(r["replicas"] for r in replicas.values())
    nproc = spec.get("nprocPerNode")
    (master,) = [c for c in replicas["Master"]["template"]["spec"]["containers"] if c["name"] == "pytorch"]
    (port,) = [p["containerPort"] for p in master.get("ports", []) if p["name"] == "pytorchjob-port"]
    pods = []
    for rtype in ("Master", "Worker"):
        r = replicas.get(rtype)
        for index in range(r["replicas"] if r else 0):
            (container,) = [c for c in r["template"]["spec"]["containers"] if c["name"] == "pytorch"]
            rank = index + (1 if rtype == "Worker" else 0)
            env = _plain_env(container)
            env.update(
                PYTHONUNBUFFERED="1",
                MASTER_PORT=str(port),
                PET_MASTER_PORT=str(port),
                MASTER_ADDR=f"{name}-master-0",
                PET_MASTER_ADDR=f"{name}-master-0",
                WORLD_SIZE=str(total * (int(nproc) if nproc and nproc.isdigit() else 1)),
                RANK=str(rank),
                PET_NODE_RANK=str(rank),
                **({"PET_NPROC_PER_NODE": nproc} if nproc is not None else {}),
                PET_NNODES=str(total),
            )
            host = f"{name}-{rtype.lower()}-{index}"
            pods.append(
                Pod(
                    host,
                    host,
                    container.get("command", []) + container.get("args", []),
                    env,
                    r.get("restartPolicy", "OnFailure") in ("OnFailure", "Always"),
                    frozenset(),
                    spec.get("runPolicy", {}).get("backoffLimit", 6),
                    r["template"]["spec"].get("terminationGracePeriodSeconds", 30),
                )
            )
    return pods


def scaled(docs: list[dict], nodes: int, nproc: int, args: list[str]) -> list[dict]:
    """The manifest as a user changes it for a smaller job: ``nodes`` pods of ``nproc`` processes running
    ``args`` (the TrainJob's trainer, or the PyTorchJob's Worker count and containers)."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        if doc["kind"] == "TrainJob":
            doc["spec"]["trainer"].update(numNodes=nodes, numProcPerNode=nproc, args=args)
        elif doc["kind"] == "PyTorchJob":
            doc["spec"]["nprocPerNode"] = str(nproc)
            doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = nodes - 1
            for r in doc["spec"]["pytorchReplicaSpecs"].values():
                r["template"] = copy.deepcopy(r["template"])  # the YAML anchor shares one dict
                for c in r["template"]["spec"]["containers"]:
                    c["args"] = args
    return docs
