"""The Kubernetes manifests: schema-valid for a pinned Kubernetes version (offline schemas from
``kubernetes-validate``), and consistent with each other and with the daemons' settings."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from redis.connection import parse_url

REPO = Path(__file__).resolve().parents[1]
KUBE = REPO / "deploy" / "kubernetes"
BASE = KUBE / "base"
OVERLAYS = sorted(p.parent for p in (KUBE / "overlays").glob("*/kustomization.yaml"))
# The schemas ship inside the package; this version is the oldest the manifests must support.
KUBERNETES_VERSION = "1.30"
# console script -> (module, class) of its settings model
DAEMONS = {
    "omni-router": ("router.settings", "RouterSettings"),
    "omni-worker": ("worker.settings", "WorkerSettings"),
}


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())


def resource_files(directory: Path) -> Iterator[Path]:
    """The files a kustomization lists as resources, following directories."""
    for entry in kustomization(directory).get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            yield from resource_files(target)
        else:
            yield target


def base_docs() -> list[dict[str, Any]]:
    return [doc for path in resource_files(BASE) for doc in load_all(path)]


def is_custom(doc: dict[str, Any]) -> bool:
    """A resource of an add-on's API (KEDA's ScaledObject), not of Kubernetes itself."""
    return doc["apiVersion"].split("/")[0].endswith(".sh")


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def daemon_containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(console script, container) for every container that runs an omni daemon."""
    for doc in docs:
        if doc["kind"] not in ("Deployment", "DaemonSet", "StatefulSet"):
            continue
        for container in pod_spec(doc)["containers"]:
            command = container.get("command", [])
            if command and command[0] in DAEMONS:
                yield command[0], container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def settings_class(daemon: str) -> type:
    module_name, class_name = DAEMONS[daemon]
    try:
        module = __import__(module_name, fromlist=[class_name])
    except ImportError as err:  # the daemon is being written in parallel
        pytest.skip(f"{module_name} is not importable yet ({err}); env vars cannot be checked")
    return getattr(module, class_name)


# -- schema ----------------------------------------------------------------------------------


def every_resource_file() -> list[Path]:
    files = {p for d in [BASE, *OVERLAYS] for p in resource_files(d) if p.is_relative_to(KUBE)}
    return sorted(files)


@pytest.mark.parametrize("path", every_resource_file(), ids=lambda p: str(p.relative_to(KUBE)))
def test_manifest_is_valid_for_the_pinned_kubernetes_version(path: Path) -> None:
    docs = load_all(path)
    assert docs, f"{path} has no documents"
    for doc in docs:
        if is_custom(doc):
            continue  # not Kubernetes' schema: test_keda_scales_the_worker_deployment_on_...
        # strict: unknown fields (typos such as `readinesProbe`) are errors too
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_schemas_are_offline_in_the_package() -> None:
    versions = kubernetes_validate.utils.all_versions()
    assert any(v.startswith(KUBERNETES_VERSION) for v in versions), versions


def test_validation_catches_a_typo_and_a_wrong_type() -> None:
    router = find(base_docs(), "Deployment", "omni-router")
    typo = yaml.safe_load(yaml.safe_dump(router))
    container = pod_spec(typo)["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(typo, KUBERNETES_VERSION, strict=True)
    wrong = yaml.safe_load(yaml.safe_dump(router))
    wrong["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSION, strict=True)


def test_every_yaml_file_is_used_by_a_kustomization() -> None:
    used: set[Path] = set()
    for directory in [BASE, *OVERLAYS]:
        used.add(directory / "kustomization.yaml")
        used.update(resource_files(directory))
        for patch in kustomization(directory).get("patches", []):
            used.add((directory / patch["path"]).resolve())
    on_disk = {p.resolve() for p in KUBE.rglob("*.yaml")}
    assert on_disk - used == set(), "YAML files no kustomization refers to"
    assert {p for p in used if not p.exists()} == set(), "kustomizations name missing files"


def test_overlay_patches_target_resources_of_the_base() -> None:
    ids = {(d["kind"], d["metadata"]["name"]) for d in base_docs()}
    for directory in OVERLAYS:
        for patch in kustomization(directory).get("patches", []):
            for doc in load_all(directory / patch["path"]):
                assert (doc["kind"], doc["metadata"]["name"]) in ids, (directory, patch)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not on PATH")
@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: str(p.relative_to(KUBE)))
def test_kustomize_renders_valid_manifests(directory: Path) -> None:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for doc in docs:
        if not is_custom(doc):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "omni-fleet"
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    redis_parts = {n for n in names if n[1] == "omni-redis"}
    if directory.name == "external-redis":
        assert not redis_parts, names
    else:
        assert {k for k, _ in redis_parts} == {"StatefulSet", "Service", "NetworkPolicy"}
    assert {("Deployment", "omni-router"), ("Deployment", "omni-worker")} <= names


# -- cross-references ------------------------------------------------------------------------


def test_services_select_their_workloads_and_name_real_ports() -> None:
    docs = base_docs()
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"]
        targets = [
            d
            for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
            and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(targets) == 1, f"Service {service['metadata']['name']} selects {targets}"
        workload = targets[0]
        assert selector.items() <= workload["spec"]["selector"]["matchLabels"].items()
        ports = {p["name"] for c in pod_spec(workload)["containers"] for p in c["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports


def test_disruption_budgets_and_network_policies_select_real_pods() -> None:
    docs = base_docs()
    labels = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }

    def selects(selector: dict[str, Any]) -> list[str]:
        wanted = selector["matchLabels"].items()
        return [name for name, have in labels.items() if wanted <= have.items()]

    budget = find(docs, "PodDisruptionBudget", "omni-router")
    assert selects(budget["spec"]["selector"]) == ["omni-router"]
    router = find(docs, "Deployment", "omni-router")
    assert budget["spec"]["minAvailable"] < router["spec"]["replicas"], "drains would block"

    policy = find(docs, "NetworkPolicy", "omni-redis")
    assert selects(policy["spec"]["podSelector"]) == ["omni-redis"]
    sources = [p["podSelector"] for rule in policy["spec"]["ingress"] for p in rule["from"]]
    assert sorted(n for s in sources for n in selects(s)) == ["omni-router", "omni-worker"]
    redis_port = pod_spec(find(docs, "StatefulSet", "omni-redis"))["containers"][0]["ports"][0]
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [redis_port["containerPort"]]


def probe(container: dict[str, Any], kind: str) -> tuple[str, int]:
    get = container[kind]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    return get["path"], ports.get(get["port"], get["port"])


def test_probes_point_at_the_documented_paths_and_ports() -> None:
    containers = dict(daemon_containers(base_docs()))
    router, worker = containers["omni-router"], containers["omni-worker"]
    assert probe(router, "readinessProbe") == ("/ready", 8000)
    assert probe(router, "livenessProbe") == ("/live", 8000)
    assert probe(worker, "readinessProbe") == ("/ready", 8100)
    assert probe(worker, "livenessProbe") == ("/health", 8100)
    assert env_of(router)["OMNI_PORT"]["value"] == "8000"
    # one process per pod, so that every scrape of /metrics reaches the same counters
    assert env_of(router)["OMNI_PROCESSES"]["value"] == "1"
    assert env_of(worker)["OMNI_PORT"]["value"] == "8100"
    assert env_of(worker)["OMNI_ADVERTISE_URL"]["value"] == "http://$(POD_IP):8100"
    assert env_of(worker)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_worker_runs_on_gpu_nodes_and_drains_on_termination() -> None:
    worker = find(base_docs(), "Deployment", "omni-worker")
    spec = pod_spec(worker)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    # one worker per node: it takes all the node's GPUs, and a rolling update never surges
    (term,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == worker["spec"]["selector"]["matchLabels"]
    assert worker["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    assert spec["hostNetwork"] is False
    container = spec["containers"][0]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    pre_stop = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    # one SIGTERM starts the drain; the hook then waits for the exit, because the kubelet's
    # own SIGTERM after the hook would be a second one (stop without waiting)
    assert "kill -TERM 1" in pre_stop and "while kill -0 1" in pre_stop
    drain = float(env_of(container)["OMNI_DRAIN_TIMEOUT"]["value"])
    assert spec["terminationGracePeriodSeconds"] > drain
    # the spec ships with the package (relative paths resolve beside it, as the worker does)
    assert (REPO / env_of(container)["OMNI_SPEC"]["value"]).is_file()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["cache"] == env_of(container)["OMNI_CACHE_DIR"]["value"]
    assert {v["name"] for v in spec["volumes"]} >= set(mounts)


def test_every_pod_has_resources_and_a_node_selector() -> None:
    for doc in base_docs():
        if doc["kind"] not in ("Deployment", "StatefulSet", "DaemonSet"):
            continue
        spec = pod_spec(doc)
        assert spec.get("nodeSelector"), doc["metadata"]["name"]
        for container in spec["containers"]:
            resources = container["resources"]
            assert resources["requests"]["memory"] and resources["limits"]["memory"]
            assert resources["requests"]["cpu"]


def test_secret_references_exist_and_the_redis_url_matches_the_redis_service() -> None:
    docs = base_docs()
    secret = find(docs, "Secret", "omni-secrets")["stringData"]
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet", "DaemonSet"):
            continue
        for container in pod_spec(doc)["containers"]:
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "omni-secrets" and ref["key"] in secret, item

    url = parse_url(secret["redis-url"])
    service = find(docs, "Service", "omni-redis")
    assert url["host"].split(".")[:2] == [service["metadata"]["name"], "omni-fleet"]
    assert url["port"] == service["spec"]["ports"][0]["port"]
    assert url["password"] == secret["redis-password"]

    redis = find(docs, "StatefulSet", "omni-redis")
    args = pod_spec(redis)["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_daemon_env_vars_are_settings_fields_and_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variable of a daemon container is ``OMNI_<field>`` of that daemon's settings, or a
    downward-API helper that an ``OMNI_`` value interpolates; together they load cleanly."""
    docs = base_docs()
    secret = find(docs, "Secret", "omni-secrets")["stringData"]
    downward = {"status.podIP": "10.1.2.3", "spec.nodeName": "gpu-node-7", "metadata.name": "p-0"}
    for daemon, container in daemon_containers(docs):
        settings = settings_class(daemon)
        fields = set(settings.model_fields)
        env = env_of(container)
        values: dict[str, str] = {}
        for name, item in env.items():
            if "value" in item:
                values[name] = item["value"]
            elif "secretKeyRef" in item["valueFrom"]:
                values[name] = secret[item["valueFrom"]["secretKeyRef"]["key"]]
            else:
                values[name] = downward[item["valueFrom"]["fieldRef"]["fieldPath"]]
        for name in env:
            if name.startswith("OMNI_"):
                field = name.removeprefix("OMNI_").lower()
                assert field in fields, f"{daemon}: {name} is not a field of {settings.__name__}"
            else:
                assert "fieldRef" in env[name].get("valueFrom", {}), f"{daemon}: stray {name}"
                assert any(f"$({name})" in v for v in values.values()), f"{name} is unused"
        for name in [n for n in env if not n.startswith("OMNI_")]:
            for key, value in values.items():
                values[key] = value.replace(f"$({name})", values[name])

        for name in [n for n in os.environ if n.startswith("OMNI_")]:
            monkeypatch.delenv(name)
        for name, value in values.items():
            if name.startswith("OMNI_"):
                monkeypatch.setenv(name, value)
        loaded = settings()
        assert loaded.redis_url.get_secret_value() == secret["redis-url"]
        assert container["ports"][0]["containerPort"] == loaded.port
        if daemon == "omni-worker":
            assert loaded.advertise_url == "http://10.1.2.3:8100"
            assert loaded.node == "gpu-node-7"
        else:
            assert [k.get_secret_value() for k in loaded.api_key] == ["change-me-client-key"]


_FAKE_WORKER = """
import signal, sys, time
signals = []
signal.signal(signal.SIGTERM, lambda *_: signals.append(1))
print("up", flush=True)
while not signals:
    time.sleep(0.01)
time.sleep(1.5)  # in-flight work finishing
sys.exit(10 + len(signals))  # 11: drained after exactly one SIGTERM
"""


def test_worker_pre_stop_hook_sends_one_sigterm_and_returns_after_the_exit() -> None:
    """The hook's shell command, run for real against a process that drains like the worker
    (PID 1 in the pod is replaced by this process's PID)."""
    container = pod_spec(find(base_docs(), "Deployment", "omni-worker"))["containers"][0]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    worker = subprocess.Popen([sys.executable, "-c", _FAKE_WORKER], stdout=subprocess.PIPE)
    reaper = threading.Thread(target=worker.wait)  # reaped at once, so `kill -0` sees it gone
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"up\n"
        reaper.start()
        script = re.sub(r"kill (-TERM|-0) 1\b", rf"kill \1 {worker.pid}", command[2])
        assert str(worker.pid) in script
        subprocess.run(["/bin/sh", "-c", script], timeout=20, check=True)
        reaper.join(timeout=0.2)  # the worker had exited before the hook returned
        assert not reaper.is_alive() and worker.returncode == 11
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=5)


def test_keda_scales_the_worker_deployment_on_the_signal() -> None:
    """overlays/autoscaled: the ScaledObject targets the worker Deployment, and its query is
    PromQL over the series the routers export (router/scaling.py), for the base worker's model;
    an AverageValue target of 1 makes the replicas equal the signal."""
    from tests.test_deploy_grafana import parse_promql, router_series

    overlay = KUBE / "overlays" / "autoscaled"
    docs = [doc for path in resource_files(overlay) for doc in load_all(path)]
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    target = scaled["spec"]["scaleTargetRef"]
    worker = find(base_docs(), target["kind"], target["name"])
    assert worker["kind"] == "Deployment" and target["apiVersion"] == worker["apiVersion"]
    assert 0 < scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "1"
    query = trigger["metadata"]["query"]
    parsed = parse_promql(query)
    exported = router_series()
    assert parsed.metrics == {"omni_router_scale_desired_replicas"}
    assert parsed.labels <= exported["omni_router_scale_desired_replicas"] == {"model"}
    spec_path = REPO / env_of(pod_spec(worker)["containers"][0])["OMNI_SPEC"]["value"]
    model = yaml.safe_load(spec_path.read_text())["name"]
    assert f'model="{model}"' in query
