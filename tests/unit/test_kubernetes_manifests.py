"""``deploy/kubernetes``: the kustomize manifests of a run (the base: master, peers, run
secret; the ``cross-cluster`` overlay: peers on their node's network). Every object they render
is valid against the newest Kubernetes schema ``kubernetes_validate`` ships (strict: no
unknown field), and they hold together: the master's probes, scrape annotations and Service
ports are the ports of its own command line (which the real CLI parser accepts), the run
secret is a read-only file where ``--secret-file`` and ``$PCCL_AIO_SECRET_FILE`` look, and the
peers name the master Service. kustomize itself is not needed: its resources and strategic
merge patches are applied here, as far as these manifests use them."""

from __future__ import annotations

import copy
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pccl_aio._errors import InvalidUsageError
from pccl_aio._master import cli
from pccl_aio._net.credentials import run_key
from pccl_aio._peer.core.environment import from_environ

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
BASE = DEPLOY / "base"
OVERLAY = DEPLOY / "cross-cluster"
VERSION = kubernetes_validate.latest_version()  # the newest schema the package ships

Doc = dict[str, Any]


# ---- a small kustomize: resources, then strategic merge patches ------------------------------
def load(path: Path) -> list[Doc]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomization(folder: Path) -> Doc:
    (k,) = load(folder / "kustomization.yaml")
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    unhandled = set(k) - {"apiVersion", "kind", "resources", "patches"}
    assert not unhandled, f"{folder}: fields this test does not render: {unhandled}"
    return k


def build(folder: Path) -> list[Doc]:
    """The objects kustomize renders for ``folder``."""
    k = kustomization(folder)
    docs: list[Doc] = []
    for entry in k.get("resources", []):
        path = (folder / entry).resolve()
        assert path.exists(), f"{folder}: resource {entry} is missing"
        docs += build(path) if path.is_dir() else load(path)
    for patch in k.get("patches", []):
        assert set(patch) == {"path"}, f"{folder}: only patch files are rendered here: {patch}"
        for doc in load(folder / patch["path"]):
            docs = patched(docs, doc)
    return docs


def ident(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]


def patched(docs: list[Doc], patch: Doc) -> list[Doc]:
    """``docs`` with the strategic merge ``patch`` applied (``$patch: delete`` removes)."""
    patch = copy.deepcopy(patch)
    delete = patch.pop("$patch", None) == "delete"
    at = [i for i, d in enumerate(docs) if ident(d) == ident(patch)]
    assert len(at) == 1, f"the patch of {ident(patch)} matches {len(at)} objects"
    i = at[0]
    return docs[:i] + ([] if delete else [merge(docs[i], patch)]) + docs[i + 1:]


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge as the Kubernetes types these manifests patch do it: maps merged key
    by key, lists of named items (containers, env, volumes, mounts) merged by name, anything
    else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if (isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        out = list(base)
        for item in patch:
            names = [x["name"] for x in out]
            if item["name"] in names:
                out[names.index(item["name"])] = merge(out[names.index(item["name"])], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def container(deployment: Doc) -> Doc:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def env(c: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in c.get("env", [])}


def container_port(c: Doc, port: int | str) -> int:
    """The container port a probe's or Service's ``port`` (a number or a port name) is."""
    if isinstance(port, int):
        assert port in [p["containerPort"] for p in c["ports"]], f"no container port {port}"
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


def master_args(master: Doc) -> Any:
    """The master container's command line, parsed by the master's own CLI parser."""
    c = container(master)
    assert c["command"] == ["python", "-m", "pccl_aio.master"]
    parser = cli.parser()
    flags = {str(a).split("=", 1)[0] for a in c["args"] if str(a).startswith("-")}
    assert flags <= set(parser._option_string_actions), "a flag spelt other than in full"
    try:
        return parser.parse_args([str(a) for a in c["args"]])
    except SystemExit as exc:
        raise AssertionError(f"python -m pccl_aio.master refuses {c['args']}") from exc


BASE_DOCS = build(BASE)
TOP_DOCS = build(DEPLOY)
OVERLAY_DOCS = build(OVERLAY)
MASTER = find(BASE_DOCS, "Deployment", "pccl-aio-master")
SERVICE = find(BASE_DOCS, "Service", "pccl-aio-master")
PEERS = find(BASE_DOCS, "Deployment", "pccl-aio-peers")
SECRET = find(BASE_DOCS, "Secret", "pccl-aio-run-secret")
REMOTE_PEERS = find(OVERLAY_DOCS, "Deployment", "pccl-aio-peers")


# ---- the schema ------------------------------------------------------------------------------
def test_every_yaml_file_is_a_kustomization_a_resource_or_a_patch():
    used = {DEPLOY / "kustomization.yaml"}
    for folder in (BASE, OVERLAY):
        k = kustomization(folder)
        used |= {folder / "kustomization.yaml"}
        used |= {(folder / r).resolve() for r in k.get("resources", []) if r.endswith(".yaml")}
        used |= {folder / p["path"] for p in k.get("patches", [])}
    files = {p.resolve() for p in DEPLOY.rglob("*.y*ml")}
    assert files == {p.resolve() for p in used}, "a YAML file kustomize does not read"
    for path in files:
        load(path)  # every one parses


def test_the_top_level_is_the_base_and_the_overlay_drops_the_master():
    assert TOP_DOCS == BASE_DOCS
    assert sorted((d["kind"], d["metadata"]["name"]) for d in BASE_DOCS) == [
        ("Deployment", "pccl-aio-master"), ("Deployment", "pccl-aio-peers"),
        ("Namespace", "pccl-aio"), ("Secret", "pccl-aio-run-secret"),
        ("Service", "pccl-aio-master")]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in OVERLAY_DOCS) == [
        ("Deployment", "pccl-aio-peers"), ("Namespace", "pccl-aio"),
        ("Secret", "pccl-aio-run-secret")]
    for doc in BASE_DOCS + OVERLAY_DOCS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "pccl-aio", ident(doc)


@pytest.mark.parametrize("doc", [
    pytest.param(doc, id=f"{where}-{doc['kind']}-{doc['metadata']['name']}")
    for where, docs in (("base", BASE_DOCS), ("cross-cluster", OVERLAY_DOCS)) for doc in docs])
def test_each_object_is_valid_against_the_kubernetes_schema(doc):
    assert tuple(int(x) for x in VERSION.split(".")[:2]) >= (1, 28)
    try:
        kubernetes_validate.validate(doc, VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{ident(doc)} is not valid Kubernetes {VERSION}: "
                             f"{exc.message} at {exc.json_path}") from None


def test_the_schema_check_refuses_a_misspelt_field():
    """(The validation above can fail: strict refuses a field the schema does not have.)"""
    broken = copy.deepcopy(MASTER)
    container(broken)["readinesProbe"] = container(broken).pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)
    broken = copy.deepcopy(SERVICE)
    broken["spec"]["ports"][0]["port"] = "48148"  # (a string, not a port)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSION, strict=True)


# ---- the master ------------------------------------------------------------------------------
def test_the_master_command_line_is_accepted_by_the_real_cli():
    args = master_args(MASTER)
    assert args.host in ("0.0.0.0", "::")
    assert args.http_host in ("0.0.0.0", "::")  # (probes and Prometheus come from outside)
    assert None not in (args.status_port, args.metrics_port, args.secret_file)
    assert len({args.port, args.status_port, args.metrics_port}) == 3
    assert MASTER["spec"]["replicas"] == 1  # one master serves one run
    assert MASTER["spec"]["strategy"]["type"] == "Recreate"  # never two at once


def test_the_master_probes_its_status_page_and_is_scraped_at_its_metrics_port():
    args, c = master_args(MASTER), container(MASTER)
    ready = c["readinessProbe"]["httpGet"]
    assert ready["path"] == "/status.json"
    assert container_port(c, ready["port"]) == args.status_port
    live = c["livenessProbe"]["httpGet"]
    assert live["path"] == "/status.json"
    assert container_port(c, live["port"]) == args.status_port
    notes = MASTER["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(args.metrics_port)
    assert notes["prometheus.io/path"] == "/metrics"
    assert container_port(c, "metrics") == args.metrics_port


def test_the_master_service_serves_the_master_status_and_metrics_ports():
    args, c = master_args(MASTER), container(MASTER)
    assert SERVICE["spec"]["type"] == "ClusterIP"
    labels = MASTER["spec"]["template"]["metadata"]["labels"]
    assert SERVICE["spec"]["selector"].items() <= labels.items()
    assert MASTER["spec"]["selector"]["matchLabels"].items() <= labels.items()
    peer_labels = PEERS["spec"]["template"]["metadata"]["labels"]
    assert not SERVICE["spec"]["selector"].items() <= peer_labels.items()  # (the master only)
    ports = {p["name"]: p for p in SERVICE["spec"]["ports"]}
    assert set(ports) == {"master", "status", "metrics"}
    for name, flag in (("master", args.port), ("status", args.status_port),
                       ("metrics", args.metrics_port)):
        assert ports[name]["port"] == flag
        assert container_port(c, ports[name]["targetPort"]) == flag


# ---- the run secret --------------------------------------------------------------------------
def secret_file(deployment: Doc) -> tuple[str, Doc]:
    """(the directory the run secret is mounted at, its volume)."""
    pod = deployment["spec"]["template"]["spec"]
    volumes = [v for v in pod["volumes"]
               if v.get("secret", {}).get("secretName") == SECRET["metadata"]["name"]]
    assert len(volumes) == 1, "the run secret is not mounted"
    (mount,) = [m for m in container(deployment)["volumeMounts"]
                if m["name"] == volumes[0]["name"]]
    assert mount["readOnly"] is True
    assert volumes[0]["secret"]["defaultMode"] == 0o400
    assert pod["securityContext"]["fsGroup"]  # (a non-root user reads the 0400 file)
    return mount["mountPath"].rstrip("/"), volumes[0]


def test_the_run_secret_is_a_read_only_file_where_the_master_and_peers_look():
    keys = set(SECRET["stringData"])
    where, _ = secret_file(MASTER)
    path = master_args(MASTER).secret_file
    assert path.rsplit("/", 1)[0] == where and path.rsplit("/", 1)[1] in keys
    for peers in (PEERS, REMOTE_PEERS):
        where, _ = secret_file(peers)
        path = env(container(peers))["PCCL_AIO_SECRET_FILE"]["value"]
        assert path.rsplit("/", 1)[0] == where and path.rsplit("/", 1)[1] in keys


def test_the_placeholder_secret_is_refused_by_the_master_and_peers():
    """An unreplaced secret.yaml cannot guard a run: its value is too weak to be used."""
    for value in SECRET["stringData"].values():
        with pytest.raises(InvalidUsageError, match="too weak"):
            run_key(value)


# ---- the peers -------------------------------------------------------------------------------
def test_the_peers_name_the_master_service():
    args = master_args(MASTER)
    variables = env(container(PEERS))
    meta = SERVICE["metadata"]
    address = f"{meta['name']}.{meta['namespace']}.svc:{args.port}"
    assert variables["PCCL_AIO_MASTER"]["value"] == address
    masters, _ = from_environ({"PCCL_AIO_MASTER": address})
    assert masters == [address]
    advertise = variables["ADVERTISE_HOST"]["valueFrom"]["fieldRef"]
    assert advertise["fieldPath"] == "status.podIP"
    assert isinstance(PEERS["spec"]["replicas"], int) and PEERS["spec"]["replicas"] >= 2


def kubelet_expand(text: str, variables: dict[str, str]) -> str:
    """``$(NAME)`` of a defined variable replaced, ``$$`` made ``$`` (Kubernetes' rule)."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return variables.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


@pytest.mark.parametrize("peers", [PEERS, REMOTE_PEERS], ids=["in-cluster", "cross-cluster"])
def test_the_peer_command_is_accepted_by_the_example(peers, monkeypatch):
    c = container(peers)
    variables = {k: e["value"] for k, e in env(c).items() if "value" in e}
    assert c["command"] == ["/bin/sh", "-c"]
    (script,) = c["args"]
    script = kubelet_expand(script, variables)
    seeds = re.findall(r'"\$\((.*?)\)"', script)
    assert seeds == ["od -An -N4 -tu4 /dev/urandom | tr -d ' '"]  # a seed of its own per peer
    script = re.sub(r'"\$\((.*?)\)"', "12345", script)
    script = script.replace('"$PCCL_AIO_MASTER"', shlex.quote(variables["PCCL_AIO_MASTER"]))
    assert "$" not in script
    words = shlex.split(script)
    assert words[:3] == ["exec", "python", "examples/diloco.py"]
    assert (ROOT / words[2]).is_file()
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location("k8s_diloco", ROOT / words[2])
    assert spec is not None and spec.loader is not None
    diloco = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "k8s_diloco", diloco)
    spec.loader.exec_module(diloco)
    try:
        parsed = diloco.parse(words[3:])
    except SystemExit as exc:
        raise AssertionError(f"examples/diloco.py refuses {words[3:]}") from exc
    assert parsed.master == variables["PCCL_AIO_MASTER"] and parsed.seed == 12345
    assert parsed.tiny and parsed.inner_steps >= 100_000 and parsed.min_peers == 2


def test_the_cross_cluster_peers_use_the_node_network_and_an_external_master():
    pod = REMOTE_PEERS["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    variables = env(container(REMOTE_PEERS))
    assert variables["ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert set(variables["ADVERTISE_HOST"]) == {"name", "valueFrom"}
    master = variables["PCCL_AIO_MASTER"]["value"]
    assert master != env(container(PEERS))["PCCL_AIO_MASTER"]["value"]
    assert ".svc:" not in master  # (not a name of this cluster)
    assert from_environ({"PCCL_AIO_MASTER": master})[0] == [master]
    # the rest is the base's peers
    same = copy.deepcopy(REMOTE_PEERS)
    for key in ("hostNetwork", "dnsPolicy"):
        del same["spec"]["template"]["spec"][key]
    same_env = env(container(same))
    same_env["PCCL_AIO_MASTER"]["value"] = env(container(PEERS))["PCCL_AIO_MASTER"]["value"]
    same_env["ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] = "status.podIP"
    container(same)["env"] = sorted(container(same)["env"], key=lambda e: e["name"])
    base = copy.deepcopy(PEERS)
    container(base)["env"] = sorted(container(base)["env"], key=lambda e: e["name"])
    assert same == base


# ---- both ------------------------------------------------------------------------------------
def quantity(text: str | int) -> float:
    """A Kubernetes quantity (``500m``, ``2``, ``256Mi``, ``1Gi``) as a number."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
             "k": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert m and (m.group(2) in units or not m.group(2)), f"not a quantity: {text!r}"
    return float(m.group(1)) * units.get(m.group(2), 1)


@pytest.mark.parametrize("deployment", [MASTER, PEERS, REMOTE_PEERS],
                         ids=["master", "peers", "cross-cluster-peers"])
def test_the_containers_are_locked_down_and_sized(deployment):
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod.get("automountServiceAccountToken") is False
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert "privileged" not in sc
    res = c["resources"]
    for what in ("cpu", "memory"):
        assert quantity(res["requests"][what]) <= quantity(res["limits"][what]), what
    assert c["image"] == container(MASTER)["image"]  # one image for the run
