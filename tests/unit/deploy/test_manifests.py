"""The Helm chart in deploy/helm/mmgate, rendered offline by Helm's own template engine
(helm-python-sdk binds Helm v4's Go SDK; no helm binary, no cluster) and checked two ways:

- Every rendered object validates against the Kubernetes schemas of the chart's oldest
  supported version (1.30) and of the newest kubernetes-validate carries, strictly (an
  unknown field is an error, as with `kubectl apply`'s server-side field validation). The
  llm-d kinds Kubernetes does not know are validated against schemas written by hand from
  their documented APIs, as strictly (tests/unit/deploy/schemas/README.md).
- The manifests agree with the code: the rendered command lines parse with `mmgate serve`'s
  and `mmgate engine`'s own argument parsers; ports in containers, probes, Services and the
  InferencePool are the ports passed; the gateway built from the rendered args answers the
  probe paths as the probes expect; grace periods outlast the engine's drain.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import socket
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "mmgate"
EXAMPLES = ROOT / "deploy" / "examples"
SCHEMAS = Path(__file__).parent / "schemas"
# The chart's floor (Chart.yaml kubeVersion) and the newest schemas kubernetes-validate has.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
MODEL = "Qwen/Qwen2-VL-7B-Instruct"
NAMESPACE = "llm"


def example(name: str) -> dict:
    return yaml.safe_load((EXAMPLES / name).read_text())


# (release name, values): the defaults, each example file, and the switches they leave out.
VARIANTS = {
    "defaults": ("mmgate", {"model": MODEL}),
    "api-key": ("demo", {"model": MODEL, "gateway": {"apiKey": {"value": "sk-test-key"}}}),
    "admin-key": (
        "ops",
        {
            "model": MODEL,
            "gateway": {
                "apiKey": {"existingSecret": "app-keys"},
                "adminApiKey": {"value": "sk-test-admin-key"},
            },
        },
    ),
    "tls": (
        "tls",
        {
            "model": MODEL,
            "gateway": {"tls": {"secretName": "gateway-https"}},
            "workerTls": {
                "enabled": True,
                "engineSecret": "engine-grpc-tls",
                "gatewaySecret": "gateway-grpc-tls",
            },
        },
    ),
    "tls-client-certs": (
        "mtls",
        {
            "model": MODEL,
            "gateway": {"tls": {"secretName": "gateway-https", "requireClientCert": True}},
            "workerTls": {
                "enabled": True,
                "mutual": False,
                "engineSecret": "engine-grpc-tls",
                "gatewaySecret": "gateway-grpc-tls",
            },
        },
    ),
    "llm-d": ("llm", example("values-llmd.yaml")),
    "production": ("prod", example("values-production.yaml")),
    "llm-d-ha": (
        "ha",
        {
            "model": MODEL,
            "servedModelName": "qwen-vl",
            "llmd": {"enabled": True, "epp": {"replicas": 2}},
            "engine": {"mmProcessor": "inprocess", "terminationGracePeriodSeconds": 300},
        },
    ),
}


# ---- rendering -------------------------------------------------------------------------


@functools.cache
def render(variant: str) -> tuple[dict, ...]:
    release, values = VARIANTS[variant]
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=release, namespace=NAMESPACE)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return tuple(objects)


def objects(variant: str, kind: str) -> list[dict]:
    return [copy.deepcopy(o) for o in render(variant) if o["kind"] == kind]


def one(variant: str, kind: str, component: str | None = None) -> dict:
    found = [
        o
        for o in objects(variant, kind)
        if component is None or o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert len(found) == 1, f"{len(found)} {kind} ({component}) in {variant}"
    return found[0]


def container(workload: dict) -> dict:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def gateway(variant: str) -> dict:
    return one(variant, "Deployment", "gateway")


def engine(variant: str) -> dict:
    return one(variant, "StatefulSet")


def values(variant: str) -> dict:
    """The values the chart rendered with: its defaults under the variant's."""
    with helm.Chart.load(str(CHART)) as chart:
        return chart.merge_values(VARIANTS[variant][1])


def port_number(c: dict, port) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return number


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


TLS_SECRETS = {"enabled": True, "engineSecret": "e", "gatewaySecret": "g"}
ALL = list(VARIANTS)
WITH_LLMD = [v for v in VARIANTS if values(v)["llmd"]["enabled"]]


# ---- the chart itself ------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_helm_lint_finds_nothing(variant):
    report = helm.lint(
        str(CHART), VARIANTS[variant][1], strict=True, namespace=NAMESPACE, kube_version="v1.30.0"
    )
    assert report["errors"] == []
    # severity 2 is a warning, 3 an error; the only info is "icon is recommended"
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_values_are_checked_against_the_values_schema():
    with (
        helm.Chart.load(str(CHART)) as chart,
        pytest.raises(helm.HelmValuesError, match="replicsa"),
    ):
        chart.render({"model": MODEL, "gateway": {"replicsa": 3}}, name="x", namespace="y")


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ({}, "set `model`"),
        ({"model": MODEL, "engine": {"terminationGracePeriodSeconds": 45}}, "must exceed"),
        ({"model": MODEL, "engine": {"preStopSleepSeconds": 5}}, "at least gateway.dnsInterval"),
        ({"model": MODEL, "engine": {"enabled": False}}, "list the gateways' engines"),
        (
            {"model": MODEL, "llmd": {"enabled": True}, "workerTls": TLS_SECRETS},
            "the InferencePool and its endpoint picker speak h2c",
        ),
        ({"model": MODEL, "workerTls": {"enabled": True}}, "needs workerTls.engineSecret"),
        (
            {"model": MODEL, "gateway": {"tls": {"requireClientCert": True}}},
            "requireClientCert needs gateway.tls.secretName",
        ),
    ],
)
def test_a_broken_combination_fails_the_render_naming_it(override, says):
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmRenderError, match=says):
        chart.render(override, name="x", namespace="y")


# ---- schema validation ------------------------------------------------------------------


# The kinds kubernetes-validate does not know: (apiVersion, the schema written for it).
CRDS = {
    "InferencePool": ("inference.networking.k8s.io/v1", "inferencepool-v1.schema.json"),
    "HTTPRoute": ("gateway.networking.k8s.io/v1", "httproute-v1.schema.json"),
}
HAND_WRITTEN = [file for _, file in CRDS.values()] + ["endpointpickerconfig-v1alpha1.json"]


@functools.cache
def schema_validator(file: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / file).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def crd_validator(kind: str) -> jsonschema.Draft202012Validator:
    return schema_validator(CRDS[kind][1])


def epp_config_validator() -> jsonschema.Draft202012Validator:
    return schema_validator("endpointpickerconfig-v1alpha1.json")


def validate(obj: dict, version: str) -> None:
    if obj["kind"] in CRDS:
        assert obj["apiVersion"] == CRDS[obj["kind"]][0]
        crd_validator(obj["kind"]).validate(obj)
        # The schema says only `metadata: object`: hold it to ObjectMeta's schema.
        meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}
        kubernetes_validate.validate(meta, version, strict=True)
    else:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", ALL)
def test_every_object_validates(variant, version):
    kinds = set()
    for obj in render(variant):
        validate(obj, version)
        kinds.add(obj["kind"])
        name = obj["metadata"]["name"]
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63, name
        assert obj["metadata"]["namespace"] == NAMESPACE
    expected = {"Deployment", "Service", "StatefulSet", "PodDisruptionBudget"}
    assert expected <= kinds
    if values(variant)["llmd"]["enabled"]:
        assert {"InferencePool", "ConfigMap", "Role", "RoleBinding", "ServiceAccount"} <= kinds


def _objects_in(node, where="#"):
    """Every schema of an object with listed fields in a schema, with where it is (the
    conditions of if/then, which list fields only to test them, are not field lists)."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            yield from _objects_in(v, f"{where}/{i}")
    elif isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            yield where, node
        for k, v in node.items():
            yield from _objects_in(v, f"{where}/{k}")


@pytest.mark.parametrize("file", HAND_WRITTEN)
def test_the_hand_written_schemas_take_no_unknown_field(file):
    schema = json.loads((SCHEMAS / file).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    found = list(_objects_in(schema))
    assert found
    for where, node in found:
        # An object whose fields are listed takes no other (a map, as matchLabels, has no
        # `properties` and its own additionalProperties schema).
        assert node.get("additionalProperties") is False, f"{file} {where}"


def test_the_validation_is_strict():
    # A misspelled field is an error, in Kubernetes' kinds and in the EPP's config.
    deployment = gateway("defaults")
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[0], strict=True)
    config = epp_config("llm-d")
    config["requestHandlers"] = config.pop("requestHandler")
    with pytest.raises(jsonschema.ValidationError, match="requestHandlers"):
        epp_config_validator().validate(config)


def _set(path: str, value):
    """A change to a rendered object: set the field at a dotted path (list indices as numbers;
    a value of ... deletes it)."""

    def change(obj: dict) -> None:
        *parents, last = [int(k) if k.isdigit() else k for k in path.split(".")]
        node = obj
        for k in parents:
            node = node[k]
        if value is ...:
            del node[last]
        else:
            node[last] = value

    return change


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("InferencePool", "spec.appProtocl", "kubernetes.io/h2c"),
        ("InferencePool", "spec.endpointPickerRef.failuremode", "FailOpen"),
        ("InferencePool", "spec.targetPorts.0.port", 8000),
        ("InferencePool", "spec.selector.matchExpressions", []),
        ("InferencePool", "status", {}),
        ("HTTPRoute", "spec.rules.0.backendRefs.0.nmae", "pool"),
        ("HTTPRoute", "spec.rules.0.backendRef", []),
        ("HTTPRoute", "spec.parentRefs.0.sectionname", "http"),
        ("HTTPRoute", "spec.rules.0.timeouts.requests", "30s"),
        ("HTTPRoute", "spec.rules.0.matches.0.path.kind", "Exact"),
    ],
)
def test_the_llmd_kinds_schemas_refuse_a_misspelled_or_unknown_field(kind, path, value):
    obj = one("llm-d", kind)
    validate(obj, KUBE_VERSIONS[0])
    _set(path, value)(obj)
    field = path.rsplit(".", 1)[-1]
    with pytest.raises(jsonschema.ValidationError, match=f"'{field}' was unexpected"):
        validate(obj, KUBE_VERSIONS[0])


@pytest.mark.parametrize(
    ("kind", "change", "says"),
    [
        ("InferencePool", _set("spec.appProtocol", "grpc"), "grpc"),
        ("InferencePool", _set("spec.endpointPickerRef.failureMode", "FailClosed"), "FailClosed"),
        ("InferencePool", _set("spec.endpointPickerRef.port", ...), "'port' is a required"),
        ("InferencePool", _set("spec.targetPorts.0.number", 0), "minimum"),
        ("InferencePool", _set("spec.targetPorts.0.number", "8000"), "not of type 'integer'"),
        ("InferencePool", _set("spec.targetPorts", []), "should be non-empty"),
        ("InferencePool", _set("spec.targetPorts", [{"number": n} for n in range(1, 10)]), "long"),
        ("InferencePool", _set("spec.targetPorts", [{"number": 1}, {"number": 1}]), "non-unique"),
        ("InferencePool", _set("spec.selector.matchLabels", {}), "should be non-empty"),
        ("InferencePool", _set("spec.endpointPickerRef.name", ...), "'name' is a required"),
        ("HTTPRoute", _set("spec.rules.0.matches.0.path.type", "Prefix"), "Prefix"),
        ("HTTPRoute", _set("spec.rules.0.matches.0.path.value", "v1"), "v1"),
        ("HTTPRoute", _set("spec.rules.0.matches.0.path.value", "/v1//x"), "/v1//x"),
        ("HTTPRoute", _set("spec.rules.0.backendRefs.0", {"name": "svc"}), "'port' is a required"),
        ("HTTPRoute", _set("spec.rules.0.backendRefs.0.weight", -1), "minimum"),
        ("HTTPRoute", _set("spec.rules.0.backendRefs.0.port", 70000), "maximum"),
        ("HTTPRoute", _set("spec.rules.0.timeouts.request", "5 min"), "5 min"),
        ("HTTPRoute", _set("spec.parentRefs.0.namespace", "Infra"), "Infra"),
        ("HTTPRoute", _set("spec.hostnames", ["10.0.0.1:80"]), "10.0.0.1"),
        ("HTTPRoute", _set("spec.rules.0.matches.0.method", "get"), "get"),
    ],
)
def test_the_llmd_kinds_schemas_refuse_what_the_api_refuses(kind, change, says):
    obj = one("llm-d", kind)
    validate(obj, KUBE_VERSIONS[0])
    change(obj)
    with pytest.raises(jsonschema.ValidationError, match=re.escape(says)):
        validate(obj, KUBE_VERSIONS[0])


def test_the_llmd_kinds_schemas_take_what_the_api_documents():
    """Not stricter than the API: the InferencePool of the llm-d EPP gRPC reference, and a
    route using the HTTPRoute fields the schema covers that the chart leaves out."""
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "vllm-grpc-qwen3-32b"},
        "spec": {
            "targetPorts": [{"number": 8000}],
            "appProtocol": "kubernetes.io/h2c",
            "selector": {"matchLabels": {"app": "vllm-grpc-qwen3-32b"}},
            "endpointPickerRef": {"name": "vllm-grpc-qwen3-32b-epp", "port": {"number": 9002}},
        },
    }
    crd_validator("InferencePool").validate(pool)
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "r"},
        "spec": {
            "parentRefs": [
                {"name": "gw", "namespace": "infra", "sectionName": "grpc", "port": 443}
            ],
            "hostnames": ["llm.example.com", "*.example.org"],
            "rules": [
                {
                    "matches": [
                        {
                            "path": {
                                "type": "Exact",
                                "value": "/vllm.grpc.engine.VllmEngine/Generate",
                            },
                            "headers": [{"name": "x-model", "value": "qwen-vl"}],
                            "method": "POST",
                        },
                        {"path": {"type": "RegularExpression", "value": "^/vllm\\..*"}},
                    ],
                    "backendRefs": [
                        {
                            "name": "pool",
                            "group": "inference.networking.k8s.io",
                            "kind": "InferencePool",
                            "weight": 0,
                        },
                        {"name": "svc", "port": 8000, "weight": 3, "namespace": "llm"},
                    ],
                    "timeouts": {"request": "1h30m", "backendRequest": "300s"},
                },
                {},
            ],
        },
    }
    crd_validator("HTTPRoute").validate(route)


# ---- selectors and references -----------------------------------------------------------


def pod_templates(variant: str) -> dict[str, dict]:
    return {
        f"{o['kind']}/{o['metadata']['name']}": o
        for o in render(variant)
        if o["kind"] in ("Deployment", "StatefulSet")
    }


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("variant", ALL)
def test_every_selector_selects_exactly_one_workload(variant):
    workloads = pod_templates(variant)
    for w in workloads.values():
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert selects(w["spec"]["selector"]["matchLabels"], labels)
    selectors = [
        (f"Service/{s['metadata']['name']}", s["spec"]["selector"])
        for s in objects(variant, "Service")
    ]
    selectors += [
        (f"PDB/{p['metadata']['name']}", p["spec"]["selector"]["matchLabels"])
        for p in objects(variant, "PodDisruptionBudget")
    ]
    selectors += [
        (f"InferencePool/{p['metadata']['name']}", p["spec"]["selector"]["matchLabels"])
        for p in objects(variant, "InferencePool")
    ]
    for what, selector in selectors:
        matched = [
            name
            for name, w in workloads.items()
            if selects(selector, w["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(matched) == 1, f"{what} selects {matched}"


@pytest.mark.parametrize("variant", ALL)
def test_autoscaling_and_disruption_budgets(variant):
    v = values(variant)
    deployment = gateway(variant)
    hpas = objects(variant, "HorizontalPodAutoscaler")
    if v["gateway"]["autoscaling"]["enabled"]:
        (hpa,) = hpas
        assert hpa["apiVersion"] == "autoscaling/v2"
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        # HPA-ready: the HPA owns the count, and utilization needs a CPU request.
        assert "replicas" not in deployment["spec"]
        assert container(deployment)["resources"]["requests"]["cpu"]
    else:
        assert hpas == []
        assert deployment["spec"]["replicas"] == v["gateway"]["replicas"]
    budgets = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]
        for p in objects(variant, "PodDisruptionBudget")
    }
    assert budgets == {"gateway", "engine"}


# ---- the gateway and `mmgate serve` ----------------------------------------------------


def serve_args(variant: str) -> list[str]:
    c = container(gateway(variant))
    assert c["command"] == ["mmgate"] and c["args"][0] == "serve"
    return c["args"][1:]


@pytest.mark.parametrize("variant", ALL)
def test_gateway_args_parse_with_mmgate_serve(variant):
    from gateway.cli.serve import build_parser
    from gateway.workers.worker import parse_address

    args = build_parser().parse_args(serve_args(variant))
    v = values(variant)
    c = container(gateway(variant))
    assert args.host == "0.0.0.0"
    (http,) = c["ports"]
    assert http["containerPort"] == args.port == v["gateway"]["port"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        check = c[probe].get("httpGet") or c[probe]["tcpSocket"]
        assert port_number(c, check["port"]) == args.port
    service = one(variant, "Service", "gateway")
    (service_port,) = service["spec"]["ports"]
    assert port_number(c, service_port["targetPort"]) == args.port
    # The model the gateway requires is the one the engines serve.
    engine_args = container(engine(variant))["args"]
    served = (
        flag(engine_args, "--served-model-name")
        if "--served-model-name" in engine_args
        else flag(engine_args, "--model")
    )
    assert str(args.model) == served
    if v["gateway"]["workers"]:
        assert args.worker == v["gateway"]["workers"] and args.worker_dns == []
    else:
        # --worker-dns names the engines' headless Service on the engines' port.
        (dns,) = args.worker_dns
        host, port = parse_address(dns).rsplit(":", 1)
        headless = one(variant, "Service", "engine")
        assert headless["spec"]["clusterIP"] == "None"
        assert not headless["spec"].get("publishNotReadyAddresses")
        name = headless["metadata"]["name"]
        assert host == f"{name}.{NAMESPACE}.svc.cluster.local."
        assert engine(variant)["spec"]["serviceName"] == name
        assert int(port) == headless["spec"]["ports"][0]["port"] == engine_port(variant)
    # Every gateway drops a terminating engine (DNS) before that engine stops taking calls.
    assert args.dns_interval <= preStop_sleep(engine(variant))
    # Its processes (--api-server-count) each keep a core busy: the pod asks for them.
    assert args.api_server_count == v["gateway"]["apiServerCount"]
    assert cpu_cores(c["resources"]["requests"]["cpu"]) >= args.api_server_count


def cpu_cores(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def preStop_sleep(workload: dict) -> int:
    return container(workload)["lifecycle"]["preStop"]["sleep"]["seconds"]


@pytest.mark.parametrize("variant", ["defaults", "api-key", "admin-key", "production"])
def test_the_gateway_built_from_the_rendered_args_answers_the_probes(variant, monkeypatch):
    """`mmgate serve` run on the rendered args and environment, with no engine up yet (the
    engines' name does not resolve, as before any engine is ready): liveness 200, readiness
    503, both without the API key the kubelet does not send; the API itself wants it. /admin,
    on the pod's 0.0.0.0, answers 404 unless the chart was given an admin key."""
    from starlette.testclient import TestClient

    from gateway.cli import serve
    from gateway.observability import request_log
    from gateway.server import tls
    from gateway.server.app import create_app
    from gateway.server.processes.supervisor import Supervisor

    c = container(gateway(variant))
    keys: dict[str, str] = {}
    for name in ("VLLM_API_KEY", "MMGATE_API_KEYS", "MMGATE_ADMIN_API_KEYS"):
        monkeypatch.delenv(name, raising=False)
    for env in c["env"]:
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
        elif env["name"] in ("VLLM_API_KEY", "MMGATE_ADMIN_API_KEYS"):
            ref = env["valueFrom"]["secretKeyRef"]
            secrets = {s["metadata"]["name"]: s for s in objects(variant, "Secret")}
            # the chart's own Secret (gateway.apiKey.value), or one that exists beforehand
            made = secrets.get(ref["name"])
            keys[env["name"]] = made["stringData"][ref["key"]] if made else f"sk-{ref['name']}"
            monkeypatch.setenv(env["name"], keys[env["name"]])
    key, admin_key = keys.get("VLLM_API_KEY"), keys.get("MMGATE_ADMIN_API_KEYS")

    real_getaddrinfo = socket.getaddrinfo

    def no_cluster_dns(host, *rest, **kwargs):
        if isinstance(host, str) and (host.endswith(".") or "." not in host):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_getaddrinfo(host, *rest, **kwargs)

    apps = []
    monkeypatch.setattr(socket, "getaddrinfo", no_cluster_dns)

    def serve_one(server: tls.Server) -> None:
        # one process: serve.main runs uvicorn's Server on the config it built
        apps.append((server.config.app, {"host": server.config.host, "port": server.config.port}))
        server.started = True

    monkeypatch.setattr(tls.Server, "run", serve_one)

    def supervise(supervisor: Supervisor) -> int:
        # --api-server-count > 1: each child serves this app, sharing admission and the rest
        # (tests/e2e/gateway/test_processes.py runs them)
        assert supervisor.count == values(variant)["gateway"]["apiServerCount"] > 1
        options = {"host": supervisor.host, "port": supervisor.port}
        apps.append((create_app(supervisor.config), options))
        return 0

    monkeypatch.setattr(Supervisor, "run", supervise)
    monkeypatch.setattr(request_log, "configure_logging", lambda *a, **k: None)
    assert serve.main(serve_args(variant)) == 0
    ((app, options),) = apps
    assert (options["host"], options["port"]) == ("0.0.0.0", c["ports"][0]["containerPort"])
    with TestClient(app) as client:
        assert client.get(c["livenessProbe"]["httpGet"]["path"]).status_code == 200
        assert client.get(c["startupProbe"]["httpGet"]["path"]).status_code == 200
        ready = client.get(c["readinessProbe"]["httpGet"]["path"])
        assert ready.status_code == 503, ready.text
        assert "no engine worker has answered yet" in ready.json()["error"]["message"]
        assert client.get("/metrics").status_code == 200
        models = client.get("/v1/models")
        if key:
            assert models.status_code == 401
            authorized = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert authorized.status_code != 401
        else:
            assert models.status_code != 401
        admin = client.get("/admin/workers")
        if admin_key:
            assert admin.status_code == 401
            with_key = client.get("/admin/workers", headers={"x-api-key": admin_key})
            assert with_key.status_code == 200
        else:
            assert admin.status_code == 404


@pytest.mark.parametrize("variant", ALL)
def test_gateway_pod_runs_as_the_image_user_read_only(variant):
    pod = gateway(variant)["spec"]["template"]["spec"]
    c = container(gateway(variant))
    # The gateway image's USER (Dockerfile) is nobody: uid 65534 on Debian.
    assert dockerfile_stage("gateway")["USER"] == ["nobody"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65534
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # What it writes (fetched model bundles, temp files) goes to mounted volumes.
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert env["MMGATE_CACHE"] in mounts and "/tmp" in mounts
    assert pod["automountServiceAccountToken"] is False


# ---- the engines and `mmgate engine` ---------------------------------------------------


@functools.cache
def engine_parser():
    from engine_server.cli import build_parser

    return build_parser()  # vLLM's engine arguments: imports vLLM, once


def engine_port(variant: str) -> int:
    return int(flag(container(engine(variant))["args"], "--port"))


@pytest.mark.parametrize("variant", ALL)
def test_engine_args_parse_with_mmgate_engine(variant):
    from engine_server.server import SERVICE_NAME

    c = container(engine(variant))
    v = values(variant)
    assert c["command"] == ["mmgate", "engine"]
    args = engine_parser().parse_args(c["args"])
    assert args.host == "0.0.0.0"
    assert args.model == v["model"]
    assert args.drain_timeout == v["engine"]["drainTimeout"]
    (grpc,) = c["ports"]
    assert grpc["containerPort"] == args.port == v["engine"]["port"]
    if v["workerTls"]["enabled"]:
        # The kubelet's gRPC probe speaks no TLS: the port accepting connections instead.
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert port_number(c, c[probe]["tcpSocket"]["port"]) == args.port
    else:
        # Kubernetes' native gRPC probes on the standard health service, on the serving port.
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert c[probe]["grpc"]["port"] == args.port
        assert c["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
        assert c["livenessProbe"]["grpc"].get("service", "") == ""  # the server's overall status
    startup = c["startupProbe"]
    assert (
        startup["periodSeconds"] * startup["failureThreshold"]
        >= v["engine"]["startupTimeoutSeconds"]
    )
    service = one(variant, "Service", "engine")
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == port_number(c, service_port["targetPort"]) == args.port
    # h2c only in plain text; gRPC over TLS has no Kubernetes-defined appProtocol.
    expected_protocol = None if v["workerTls"]["enabled"] else "kubernetes.io/h2c"
    assert service_port.get("appProtocol") == expected_protocol
    # GPUs, as extended resources: requests equal limits.
    gpus = v["engine"]["gpus"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert c["resources"]["requests"]["nvidia.com/gpu"] == gpus
    if "--tensor-parallel-size" in c["args"]:
        assert args.tensor_parallel_size == gpus
    if v["engine"]["mmProcessor"]:
        assert args.mm_processor == v["engine"]["mmProcessor"]


@pytest.mark.parametrize("variant", ALL)
def test_engine_termination_outlasts_the_drain(variant):
    """preStop sleep (still SERVING, leaving DNS), then SIGTERM: NOT_SERVING and up to
    --drain-timeout s of in-flight requests; the kubelet's SIGKILL must come after both."""
    statefulset = engine(variant)
    args = engine_parser().parse_args(container(statefulset)["args"])
    grace = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > preStop_sleep(statefulset) + args.drain_timeout
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"


def test_chart_defaults_are_the_code_defaults():
    """What the chart passes by default is what the commands would do without it."""
    from gateway.cli.serve import build_parser
    from gateway.workers.pool import PoolOptions

    defaults = values("defaults")
    serve_defaults = build_parser().parse_args(["--model", "m", "--worker", "grpc://h:1"])
    engine_defaults = engine_parser().parse_args([])
    assert defaults["gateway"]["port"] == serve_defaults.port == 8000
    assert defaults["gateway"]["dnsInterval"] == PoolOptions().dns_interval
    assert defaults["gateway"]["apiServerCount"] == serve_defaults.api_server_count == 1
    assert defaults["engine"]["port"] == engine_defaults.port
    assert defaults["engine"]["drainTimeout"] == engine_defaults.drain_timeout
    # The engine image exposes that port, and both images put `mmgate` first.
    assert dockerfile_stage("engine")["EXPOSE"] == [str(engine_defaults.port)]
    assert json.loads(" ".join(dockerfile_stage("engine")["ENTRYPOINT"]))[:2] == [
        "mmgate",
        "engine",
    ]
    assert json.loads(" ".join(dockerfile_stage("gateway")["ENTRYPOINT"])) == ["mmgate"]


@functools.cache
def _dockerfile() -> dict[str, dict[str, list[str]]]:
    stages: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split(maxsplit=1)
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            current = stages.setdefault(words[1].split()[-1], {})
        elif current is not None and words[0].isupper() and len(words) == 2:
            current.setdefault(words[0], []).append(words[1])
    return stages


def dockerfile_stage(name: str) -> dict[str, list[str]]:
    return _dockerfile()[name]


# ---- llm-d -------------------------------------------------------------------------------


def epp_config(variant: str) -> dict:
    configmap = one(variant, "ConfigMap", "epp")
    (text,) = configmap["data"].values()
    return yaml.safe_load(text)


@pytest.mark.parametrize("variant", WITH_LLMD)
def test_inference_pool_selects_the_engines_over_h2c(variant):
    pool = one(variant, "InferencePool")
    spec = pool["spec"]
    assert spec["appProtocol"] == "kubernetes.io/h2c"
    assert [p["number"] for p in spec["targetPorts"]] == [engine_port(variant)]
    labels = engine(variant)["spec"]["template"]["metadata"]["labels"]
    assert selects(spec["selector"]["matchLabels"], labels)
    # The CRD's CEL rules: unique port numbers; a Service reference carries a port.
    numbers = [p["number"] for p in spec["targetPorts"]]
    assert len(set(numbers)) == len(numbers)
    ref = spec["endpointPickerRef"]
    assert ref.get("kind", "Service") == "Service" and "port" in ref
    # The picker is this release's EPP Service, on its ext_proc port.
    epp_service = one(variant, "Service", "epp")
    assert ref["name"] == epp_service["metadata"]["name"]
    ext_proc = {p["name"]: p for p in epp_service["spec"]["ports"]}["grpc-ext-proc"]
    assert ref["port"]["number"] == ext_proc["port"]
    assert ext_proc["appProtocol"] == "kubernetes.io/h2c"
    for route in objects(variant, "HTTPRoute"):
        (rule,) = route["spec"]["rules"]
        (backend,) = rule["backendRefs"]
        assert (backend["group"], backend["kind"], backend["name"]) == (
            "inference.networking.k8s.io",
            "InferencePool",
            pool["metadata"]["name"],
        )


@pytest.mark.parametrize("variant", WITH_LLMD)
def test_endpoint_picker_config_parses_vllm_grpc(variant):
    config = epp_config(variant)
    epp_config_validator().validate(config)
    plugins = {p.get("name") or p["type"]: p["type"] for p in config["plugins"]}
    assert len(plugins) == len(config["plugins"])  # names are unique
    (parser,) = config["requestHandler"]["parsers"]
    assert plugins[parser["pluginRef"]] == "vllmgrpc-parser"
    refs = [p["pluginRef"] for profile in config["schedulingProfiles"] for p in profile["plugins"]]
    assert set(refs) <= set(plugins)
    assert {plugins[r] for r in refs} >= {"prefix-cache-scorer", "max-score-picker"}
    # mmgate engines serve no Prometheus endpoint: nothing is scraped from them.
    assert config["dataLayer"]["injectDefaults"] is False
    assert "metrics-data-source" not in plugins.values()


@pytest.mark.parametrize("variant", WITH_LLMD)
def test_epp_deployment_agrees_with_its_pool_service_and_config(variant):
    v = values(variant)
    deployment = one(variant, "Deployment", "epp")
    c = container(deployment)
    args = c["args"]
    pool = one(variant, "InferencePool")
    assert flag(args, "--pool-name") == pool["metadata"]["name"]
    assert flag(args, "--pool-namespace") == NAMESPACE
    assert flag(args, "--pool-group") == "inference.networking.k8s.io"
    # The config file is the ConfigMap's key, where the ConfigMap is mounted.
    config_file = Path(flag(args, "--config-file"))
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(config_file.parent)]
    (volume,) = [
        vol
        for vol in deployment["spec"]["template"]["spec"]["volumes"]
        if vol["name"] == mount["name"]
    ]
    configmap = one(variant, "ConfigMap", "epp")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert config_file.name in configmap["data"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (
        int(flag(args, "--grpc-port"))
        == ports["grpc"]
        == pool["spec"]["endpointPickerRef"]["port"]["number"]
    )
    assert int(flag(args, "--grpc-health-port")) == ports["grpc-health"]
    assert (
        c["livenessProbe"]["grpc"]["port"]
        == c["readinessProbe"]["grpc"]["port"]
        == ports["grpc-health"]
    )
    ha = v["llmd"]["epp"]["replicas"] > 1
    assert ("--ha-enable-leader-election" in args) == ha
    rules = one(variant, "Role")["rules"]
    granted = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= granted
    assert (("coordination.k8s.io", "leases") in granted) == ha
    binding = one(variant, "RoleBinding")
    (subject,) = binding["subjects"]
    assert subject["name"] == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == one(variant, "Role")["metadata"]["name"]


# ---- TLS: the gateway's HTTPS port and the gateway -> engine hop ------------------------


def mounted_from(workload: dict, path: Path) -> tuple[str, str]:
    """(the Secret, the key in it) a file path in the container comes from."""
    c = container(workload)
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    for mount in c["volumeMounts"]:
        if path.parent == Path(mount["mountPath"]):
            assert mount.get("readOnly") is True
            secret = volumes[mount["name"]]["secret"]
            assert secret["defaultMode"] == 0o440  # a private key: not world-readable
            return secret["secretName"], path.name
    raise AssertionError(f"{path} is on no mounted volume")


@pytest.mark.parametrize("variant", ALL)
def test_gateway_https_flags_come_from_the_secret_and_the_probes_follow(variant):
    from gateway.cli.serve import build_parser
    from gateway.server import tls

    g = values(variant)["gateway"]["tls"]
    deployment = gateway(variant)
    c = container(deployment)
    args = build_parser().parse_args(serve_args(variant))
    notes = chart_notes(variant)
    if not g["secretName"]:
        assert args.ssl_certfile is None and args.ssl_keyfile is None
        assert all(c[p]["httpGet"].get("scheme", "HTTP") == "HTTP" for p in PROBES)
        assert "OpenAI API: http://" in notes
        return
    assert mounted_from(deployment, Path(args.ssl_certfile)) == (g["secretName"], "tls.crt")
    assert mounted_from(deployment, Path(args.ssl_keyfile)) == (g["secretName"], "tls.key")
    assert args.enable_ssl_refresh  # a renewed Secret is served without a restart
    assert "OpenAI API: https://" in notes
    if g["requireClientCert"]:
        assert mounted_from(deployment, Path(args.ssl_ca_certs)) == (g["secretName"], "ca.crt")
        assert args.ssl_cert_reqs == 2 == int(tls.ssl.CERT_REQUIRED)
        # the kubelet sends no client certificate: an HTTP(S) probe would always fail
        assert all(set(c[p]) >= {"tcpSocket"} and "httpGet" not in c[p] for p in PROBES)
    else:
        assert args.ssl_ca_certs is None
        assert all(c[p]["httpGet"]["scheme"] == "HTTPS" for p in PROBES)


PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def chart_notes(variant: str) -> str:
    release, vals = VARIANTS[variant]
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(vals, name=release, namespace=NAMESPACE)["mmgate/templates/NOTES.txt"]


@pytest.mark.parametrize("variant", ALL)
def test_the_worker_hop_is_tls_on_both_ends_or_on_neither(variant):
    from gateway.cli.serve import build_parser
    from gateway.workers.tls import is_tls

    w = values(variant)["workerTls"]
    args = build_parser().parse_args(serve_args(variant))
    engine_args = engine_parser().parse_args(container(engine(variant))["args"])
    if not w["enabled"]:
        assert engine_args.tls_cert_path is None and not args.ca_cert_paths
        assert not any(is_tls(url) for url in args.worker_dns)
        return
    (dns,) = args.worker_dns
    assert is_tls(dns)
    gw, eng = gateway(variant), engine(variant)
    assert mounted_from(eng, engine_args.tls_cert_path) == (w["engineSecret"], "tls.crt")
    assert mounted_from(eng, engine_args.tls_key_path) == (w["engineSecret"], "tls.key")
    (ca,) = args.ca_cert_paths
    assert mounted_from(gw, ca) == (w["gatewaySecret"], "ca.crt")
    if w["mutual"]:
        assert mounted_from(eng, engine_args.tls_ca_cert_path) == (w["engineSecret"], "ca.crt")
        assert mounted_from(gw, args.client_cert_path) == (w["gatewaySecret"], "tls.crt")
        assert mounted_from(gw, args.client_key_path) == (w["gatewaySecret"], "tls.key")
    else:
        assert engine_args.tls_ca_cert_path is None and args.client_cert_path is None
    # the name the gateway checks the engines' certificate against, printed for the operator
    host = dns.removeprefix("grpcs://").rsplit(":", 1)[0].rstrip(".")
    assert f"the engines' certificate must name {host}." in chart_notes(variant)
