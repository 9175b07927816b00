"""scripts/k8s/'s manifests against the real schemas (tests/data/k8s/: the CRDs of Kubeflow Trainer and the training
operator, Kubernetes' own definitions of a Job and pod template), and what their controllers make of them.

Validation is as strict as ``kubectl apply`` (server-side field validation ``Strict``, kubectl's default since
Kubernetes 1.27): an unknown field is an error, like a wrong type or a missing required field. What the schemas
cannot say (CEL rules, ``x-kubernetes-validations``; the controllers' webhooks) is not checked here.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from functools import cache

import jsonschema
import pytest
import yaml

from tests.helpers import ROOT, controllers
from vitlarge.distributed.launcher import pod_rendezvous
from vitlarge.errors import EXIT_BAD_INPUT

DATA = ROOT / "tests" / "data" / "k8s"
TRAINJOB = ROOT / "scripts" / "k8s" / "trainjob.yaml"
PYTORCHJOB = ROOT / "scripts" / "k8s" / "pytorchjob.yaml"
CRDS = {
    ("trainer.kubeflow.org", "TrainJob"): "trainer/trainer.kubeflow.org_trainjobs.yaml.gz",
    ("trainer.kubeflow.org", "TrainingRuntime"): "trainer/trainer.kubeflow.org_trainingruntimes.yaml.gz",
    ("kubeflow.org", "PyTorchJob"): "training-operator/kubeflow.org_pytorchjobs.yaml.gz",
}
CORE = "kubernetes/swagger-jobtemplatespec.json.gz"
CORE_SHA256 = "c316f6e232c666148076e82e20371ff656ffbb12e59d8953e6d94ec7685bc75c"


def strict(schema):
    """``schema`` with unknown fields refused wherever it lists an object's fields (and does not keep unknown ones)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) if k != "properties" else {n: strict(s) for n, s in v.items()} for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


@cache
def crd_validator(group: str, version: str, kind: str) -> jsonschema.Draft4Validator:
    crd = yaml.load(gzip.decompress((DATA / CRDS[group, kind]).read_bytes()), Loader=yaml.CSafeLoader)
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == (group, kind)
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    return jsonschema.Draft4Validator(strict(served["schema"]["openAPIV3Schema"]))


@cache
def core_definitions() -> dict:
    return strict(json.loads(gzip.decompress((DATA / CORE).read_bytes()))["definitions"])


def core_validator(definition: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator({"$ref": f"#/definitions/{definition}", "definitions": core_definitions()})


def errors(validator: jsonschema.Draft4Validator, value) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(value)]


def crd_errors(doc: dict) -> list[str]:
    group, version = doc["apiVersion"].split("/")
    found = errors(crd_validator(group, version, doc["kind"]), doc)
    # A CRD's schema leaves the object's own metadata to the API server: Kubernetes' ObjectMeta.
    return found + errors(core_validator("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"), doc["metadata"])


def pod_templates(doc: dict) -> list[tuple[str, str, dict]]:
    """(where, Kubernetes definition, value) for each part of ``doc`` that is one of Kubernetes' own types."""
    if doc["kind"] == "TrainingRuntime":
        jobs = doc["spec"]["template"]["spec"]["replicatedJobs"]
        return [(f"replicatedJobs.{j['name']}", "io.k8s.api.batch.v1.JobTemplateSpec", j["template"]) for j in jobs]
    if doc["kind"] == "TrainJob":
        return [
            (
                "trainer.resourcesPerNode",
                "io.k8s.api.core.v1.ResourceRequirements",
                doc["spec"]["trainer"]["resourcesPerNode"],
            )
        ]
    specs = doc["spec"]["pytorchReplicaSpecs"]
    return [(r, "io.k8s.api.core.v1.PodTemplateSpec", s["template"]) for r, s in specs.items()]


def documents() -> list[tuple[str, dict]]:
    return [(f"{p.name}:{d['kind']}", d) for p in (TRAINJOB, PYTORCHJOB) for d in controllers.load(p)]


def test_the_kept_schemas_are_the_files_their_repositories_hold():
    readme = (DATA / "README.md").read_text()
    for name in CRDS.values():
        digest = hashlib.sha256(gzip.decompress((DATA / name).read_bytes())).hexdigest()
        assert f"`{name}` | " in readme and digest in readme.split(f"`{name}` | ")[1].split("\n")[0], name
    assert CORE_SHA256 in readme
    for project in ("trainer", "training-operator", "kubernetes"):
        assert "Apache License" in (DATA / project / "LICENSE").read_text()


@pytest.mark.parametrize("where,doc", documents(), ids=[w for w, _ in documents()])
def test_each_manifest_validates_against_its_crd_and_kubernetes_core_schemas(where, doc):
    assert crd_errors(doc) == []
    for part, definition, value in pod_templates(doc):
        assert errors(core_validator(definition), value) == [], part


@pytest.mark.parametrize(
    "kind,edit,error",
    [
        ("TrainJob", lambda d: d["spec"]["trainer"].update(numProcPerNode="8"), "'8' is not of type 'integer'"),
        ("TrainJob", lambda d: d["spec"]["trainer"].update(gpus=8), "'gpus' was unexpected"),
        (
            "PyTorchJob",
            lambda d: d["spec"]["pytorchReplicaSpecs"]["Worker"].update(replica=3),
            "'replica' was unexpected",
        ),
        ("PyTorchJob", lambda d: d["spec"]["runPolicy"].update(backoffLimit="16"), "is not of type 'integer'"),
        (
            "TrainingRuntime",
            lambda d: d["spec"]["template"]["spec"]["replicatedJobs"][0].pop("name"),
            "'name' is a required",
        ),
        (
            "TrainingRuntime",
            lambda d: d["spec"]["template"]["spec"].update(failurePolicy={"restartStrategy": "Later"}),
            "is not one of",
        ),
    ],
)
def test_the_crd_check_refuses_a_wrong_type_an_unknown_field_a_bad_value_a_missing_field(kind, edit, error):
    doc = next(d for _, d in documents() if d["kind"] == kind)
    edit(doc)
    assert any(error in e for e in crd_errors(doc)), crd_errors(doc)


def test_the_core_check_refuses_what_kubernetes_refuses_in_a_pod_template():
    doc = next(d for _, d in documents() if d["kind"] == "PyTorchJob")
    template = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    container = template["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")  # misspelt
    del template["spec"]["volumes"][0]["name"]  # a volume must have a name
    found = errors(core_validator("io.k8s.api.core.v1.PodTemplateSpec"), template)
    assert any("'volumeMount' was unexpected" in e for e in found), found
    assert any("'name' is a required property" in e for e in found), found


def pod_specs(doc: dict) -> list[tuple[dict, dict]]:
    """(pod spec, training container) of each pod template of ``doc``."""
    if doc["kind"] == "TrainingRuntime":
        specs = [j["template"]["spec"]["template"]["spec"] for j in doc["spec"]["template"]["spec"]["replicatedJobs"]]
    else:
        specs = [s["template"]["spec"] for s in doc["spec"]["pytorchReplicaSpecs"].values()]
    return [(s, next(c for c in s["containers"] if c["name"] in ("node", "pytorch"))) for s in specs]


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=lambda p: p.name)
def test_the_pods_share_the_workdir_read_the_data_read_only_get_shared_memory_and_the_secret(path):
    docs = controllers.load(path)
    (pod_doc,) = [d for d in docs if d["kind"] in ("TrainingRuntime", "PyTorchJob")]
    for spec, container in pod_specs(pod_doc):
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert volumes[mounts["/workdir"]["name"]]["persistentVolumeClaim"]["claimName"] == "vitlarge-workdir"
        data = volumes[mounts["/data"]["name"]]["persistentVolumeClaim"]
        assert data["readOnly"] and mounts["/data"]["readOnly"]
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
        assert container["envFrom"] == [{"secretRef": {"name": "vitlarge-trackers", "optional": True}}]
        assert not any(e["name"].startswith(("WANDB", "MLFLOW")) for e in container.get("env", []))
        assert container["command"] == ["python", "-m", "vitlarge.run.pod"]
        assert spec["terminationGracePeriodSeconds"] >= 60  # time for the checkpoint SIGTERM asks for
    args = next(
        p.command
        for p in (controllers.trainjob_pods(docs) if path == TRAINJOB else controllers.pytorchjob_pods(docs[0]))
    )
    assert "--workdir" in args and args[args.index("--workdir") + 1].startswith("/workdir/")
    assert args[args.index("--data") + 1].startswith("/data/")


@pytest.mark.parametrize("path", [TRAINJOB, PYTORCHJOB], ids=lambda p: p.name)
def test_each_pod_gets_the_rendezvous_of_4_nodes_x_8_gpus_and_restarts_on_failure(path):
    docs = controllers.load(path)
    pods = controllers.trainjob_pods(docs) if path == TRAINJOB else controllers.pytorchjob_pods(docs[0])
    assert len(pods) == 4
    master = pods[0].fqdn
    for index, pod in enumerate(pods):
        rendezvous = pod_rendezvous(pod.env)
        assert (rendezvous.nnodes, rendezvous.node_rank, rendezvous.nproc_per_node) == (4, index, "8")
        assert rendezvous.master_addr == master
        assert pod.restart and pod.backoff_limit >= 2 * len(pods)  # a lost node fails every pod once
        assert pod.command[:3] == ["python", "-m", "vitlarge.run.pod"] and pod.command[3] == "train.py"
    if path == TRAINJOB:  # bad input fails the job instead of restarting it; a failed rendezvous (69), a checkpoint
        # on SIGTERM (75) and a timed-out collective (124) are restarted
        assert pods[0].fail_job_on == {EXIT_BAD_INPUT}


def test_the_containerfile_installs_as_the_readme_says():
    text = (ROOT / "scripts" / "k8s" / "Containerfile").read_text()
    readme = (ROOT / "README.md").read_text()
    for step in ("pip install -r requirements.txt", "pip install --no-deps -r requirements/colossalai.txt"):
        assert step in readme
        assert step.replace("pip install", "pip install --no-cache-dir") in text
    assert "FROM ${BASE}" in text and "cuda" in text.split("ARG BASE=")[1].split("\n")[0]
