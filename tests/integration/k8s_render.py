"""Render what a pod of ``k8s/statefulset.yaml`` runs, and run it on this machine.

No Kubernetes cluster is reachable from the tests, so this module does the kubelet's
part for one StatefulSet, reading everything from the manifests themselves:

* the pod's name (``futureq-N``), hostname and ordinal;
* its environment: ``value`` with Kubernetes' ``$(VAR)`` expansion, ``fieldRef``
  (name, namespace, pod index label, pod IP), ``configMapKeyRef`` and ``secretKeyRef``,
  and the service links Kubernetes injects unless ``enableServiceLinks: false``; the
  image's ``ENV`` (from the ``Dockerfile``) underneath;
* its command and arguments with ``$(VAR)`` expansion (``/bin/sh -c`` scripts then run
  in a real shell);
* its volumes: ConfigMap and Secret volumes become directories holding their keys, the
  volume claim a directory kept across restarts of the same pod, ``emptyDir`` a fresh
  directory per start; every mount path in arguments, environment and mounted files is
  rewritten to the directory standing in for it;
* its probes (``httpGet``, named ports resolved), which :class:`PodProcess` polls as
  the kubelet would.

The cluster network is emulated on loopback: pod N gets the IP ``127.0.0.{N+1}``
(Linux routes all of 127/8 to loopback with no setup), the DNS names of the headless
service (``futureq-N.futureq-headless.NS.svc.cluster.local`` and its shorter forms)
resolve to those IPs, a ClusterIP service's name to the IP of the pod the test chooses,
and a wildcard ``0.0.0.0`` to the pod's own IP. Every pod uses the same ports, as in
Kubernetes, so the distinct IPs are what keeps them apart; the container ports are
mapped to free ports because this machine is shared (and 7450-7482 are in use by
others). The rewriting is applied to ``HOST:PORT`` text only, the way a resolver and a
pod network would make them reachable.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S_DIR = REPO / "k8s"
CLUSTER_DOMAIN = "cluster.local"
WILDCARDS = ("0.0.0.0", "[::]", "::")


def load_manifests(directory: Path = K8S_DIR) -> dict[tuple[str, str], dict[str, Any]]:
    """Every object of every ``*.yaml`` in ``directory``, by ``(kind, name)``."""
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(directory.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                objects[(document["kind"], document["metadata"]["name"])] = document
    return objects


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``third_party/forked/golang/expansion``):
    ``$(NAME)`` becomes its value when NAME is defined, else stays as written; ``$$``
    becomes ``$``; any other ``$`` is kept."""
    out: list[str] = []
    cursor = 0
    while cursor < len(text):
        char = text[cursor]
        if char != "$" or cursor + 1 >= len(text):
            out.append(char)
            cursor += 1
            continue
        following = text[cursor + 1]
        if following == "$":
            out.append("$")
            cursor += 2
        elif following == "(":
            end = text.find(")", cursor + 2)
            if end == -1:
                out.append("$(")
                cursor += 2
                continue
            name = text[cursor + 2 : end]
            out.append(variables.get(name, f"$({name})"))
            cursor = end + 1
        else:
            out.append("$" + following)
            cursor += 2
    return "".join(out)


def image_environment(dockerfile: Path = REPO / "Dockerfile") -> dict[str, str]:
    """The ``ENV`` of the Dockerfile's last stage (what the image gives every container);
    ``PATH`` is left to the caller, since the image's interpreter is this machine's."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.upper().startswith("FROM "):
            env = {}
        elif line.upper().startswith("ENV "):
            for word in shlex.split(line[4:]):
                key, _, value = word.partition("=")
                if key != "PATH":
                    env[key] = value
    return env


def free_port_on_all(ips: list[str], count: int) -> list[int]:
    """``count`` ports free on every one of ``ips`` a moment ago."""
    ports: list[int] = []
    while len(ports) < count:
        probe = socket.socket()
        probe.bind((ips[0], 0))
        port = probe.getsockname()[1]
        probe.close()
        if port in ports:
            continue
        try:
            for ip in ips:
                with socket.socket() as other:
                    other.bind((ip, port))
        except OSError:
            continue
        ports.append(port)
    return ports


@attrs.define
class PodNetwork:
    """The emulated cluster network: pod IPs, DNS names, ports.

    Attributes:
        namespace: The StatefulSet's namespace.
        statefulset: Its name (pods are ``<statefulset>-<ordinal>``).
        headless_service: ``spec.serviceName``.
        services: ClusterIP service names of the namespace.
        ports: Container port -> the free port standing in for it (on every pod IP).
        service_backend: Ordinal of the pod a ClusterIP service name resolves to.
    """

    namespace: str
    statefulset: str
    headless_service: str
    services: list[str]
    ports: dict[int, int]
    service_backend: int = 0

    @staticmethod
    def pod_ip(ordinal: int) -> str:
        return f"127.0.0.{ordinal + 1}"

    def hosts(self, max_ordinal: int = 9) -> dict[str, str]:
        """DNS name -> IP, as cluster DNS would answer."""
        names: dict[str, str] = {}
        suffixes = ["", f".{self.namespace}", f".{self.namespace}.svc",
                    f".{self.namespace}.svc.{CLUSTER_DOMAIN}"]  # fmt: skip
        for ordinal in range(max_ordinal + 1):
            pod = f"{self.statefulset}-{ordinal}.{self.headless_service}"
            for suffix in suffixes:
                names[pod + suffix] = self.pod_ip(ordinal)
        for service in self.services:
            for suffix in suffixes:
                names[service + suffix] = self.pod_ip(self.service_backend)
        return names

    def rewrite(self, text: str, own_ip: str) -> str:
        """Make every ``HOST:PORT`` that names a pod, a service or a wildcard, with a
        container port, point at the IP and port standing in for it."""
        hosts = self.hosts()

        def replace(match: re.Match[str]) -> str:
            host, port = match.group("host"), int(match.group("port"))
            if port not in self.ports:
                return match.group(0)
            if host in WILDCARDS:
                return f"{own_ip}:{self.ports[port]}"
            if host in hosts:
                return f"{hosts[host]}:{self.ports[port]}"
            return match.group(0)

        return re.sub(r"(?P<host>\[::\]|[A-Za-z0-9.\-]+):(?P<port>\d+)\b", replace, text)


@attrs.frozen
class Probe:
    """An ``httpGet`` probe of the container, with its port resolved and mapped."""

    path: str
    port: int
    period_s: float
    timeout_s: float
    failure_threshold: int

    def check(self, ip: str) -> bool:
        try:
            with urllib.request.urlopen(
                f"http://{ip}:{self.port}{self.path}", timeout=self.timeout_s
            ) as response:
                return 200 <= response.status < 400
        except urllib.error.HTTPError as refused:
            refused.close()  # its socket now, not in a gc pass of a later test
            return False
        except (urllib.error.URLError, OSError):
            return False


@attrs.define
class RenderedPod:
    """What the kubelet would run for one pod, mapped onto this machine."""

    ordinal: int
    name: str
    ip: str
    argv: list[str]
    env: dict[str, str]
    workdir: Path
    mounts: dict[str, Path]
    files: dict[Path, bytes]
    fresh_dirs: list[Path]
    probes: dict[str, Probe]
    termination_grace_s: float


class StatefulSetRenderer:
    """Renders pods of a StatefulSet from the manifests (see the module docstring).

    Args:
        root: Directory under which the pods' volumes live.
        secrets: Contents of the Secrets the pods mount or reference,
            ``{secret name: {key: bytes}}``.
        bin_dir: Directory of the ``futureq`` executable (the image's ``PATH``).
        manifests: Objects by ``(kind, name)``; :func:`load_manifests` by default.
    """

    def __init__(
        self,
        root: Path,
        secrets: Mapping[str, Mapping[str, bytes]],
        bin_dir: Path,
        manifests: dict[tuple[str, str], dict[str, Any]] | None = None,
        statefulset: str = "futureq",
    ) -> None:
        self.root = root
        self.secrets = secrets
        self.bin_dir = bin_dir
        self.manifests = manifests if manifests is not None else load_manifests()
        self.statefulset = self.manifests[("StatefulSet", statefulset)]
        self.namespace: str = self.statefulset["metadata"]["namespace"]
        self.pod_spec: dict[str, Any] = self.statefulset["spec"]["template"]["spec"]
        (self.container,) = self.pod_spec["containers"]
        services = [
            obj
            for (kind, _), obj in self.manifests.items()
            if kind == "Service" and obj["metadata"].get("namespace") == self.namespace
        ]
        self.services = services
        container_ports = [port["containerPort"] for port in self.container["ports"]]
        ips = [PodNetwork.pod_ip(ordinal) for ordinal in range(6)]
        self.network = PodNetwork(
            namespace=self.namespace,
            statefulset=statefulset,
            headless_service=self.statefulset["spec"]["serviceName"],
            services=[
                s["metadata"]["name"] for s in services if s["spec"].get("clusterIP") != "None"
            ],
            ports=dict(
                zip(container_ports, free_port_on_all(ips, len(container_ports)), strict=True)
            ),
        )

    @property
    def replicas(self) -> int:
        return int(self.statefulset["spec"]["replicas"])

    def _named_port(self, port: int | str) -> int:
        if isinstance(port, int):
            return port
        for spec in self.container["ports"]:
            if spec["name"] == port:
                return int(spec["containerPort"])
        raise KeyError(f"no container port named {port!r}")

    def _service_links(self) -> dict[str, str]:
        """The variables Kubernetes injects for every service of the namespace."""
        env: dict[str, str] = {}
        if self.pod_spec.get("enableServiceLinks", True) is False:
            return env
        for service in self.services:
            if service["spec"].get("clusterIP") == "None":
                continue
            prefix = service["metadata"]["name"].upper().replace("-", "_")
            ip = "10.96.0.10"  # any ClusterIP; only the names matter here
            first = service["spec"]["ports"][0]
            env[f"{prefix}_SERVICE_HOST"] = ip
            env[f"{prefix}_SERVICE_PORT"] = str(first["port"])
            env[f"{prefix}_PORT"] = f"tcp://{ip}:{first['port']}"
            for port in service["spec"]["ports"]:
                if "name" in port:
                    env[f"{prefix}_SERVICE_PORT_{port['name'].upper()}"] = str(port["port"])
                tcp = f"{prefix}_PORT_{port['port']}_TCP"
                env[tcp] = f"tcp://{ip}:{port['port']}"
                env[f"{tcp}_PROTO"] = "tcp"
                env[f"{tcp}_PORT"] = str(port["port"])
                env[f"{tcp}_ADDR"] = ip
        return env

    def _value_from(self, source: dict[str, Any], pod_name: str, ordinal: int, ip: str) -> str:
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            fields = {
                "metadata.name": pod_name,
                "metadata.namespace": self.namespace,
                "metadata.labels['apps.kubernetes.io/pod-index']": str(ordinal),
                "metadata.labels['statefulset.kubernetes.io/pod-name']": pod_name,
                "status.podIP": ip,
                "spec.serviceAccountName": self.pod_spec.get("serviceAccountName", "default"),
            }
            return fields[path]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return str(self.manifests[("ConfigMap", ref["name"])]["data"][ref["key"]])
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self.secrets[ref["name"]][ref["key"]].decode()
        raise KeyError(f"valueFrom {source} is not rendered by this test")

    def render(self, ordinal: int) -> RenderedPod:
        """The pod with this ordinal, its volumes laid out under ``root``."""
        name = f"{self.network.statefulset}-{ordinal}"
        ip = self.network.pod_ip(ordinal)
        pod_dir = self.root / name
        mounts: dict[str, Path] = {}
        files: dict[Path, bytes] = {}
        fresh: list[Path] = []
        volumes = {volume["name"]: volume for volume in self.pod_spec.get("volumes", [])}
        claims = {
            claim["metadata"]["name"]
            for claim in self.statefulset["spec"].get("volumeClaimTemplates", [])
        }
        for mount in self.container.get("volumeMounts", []):
            volume_name = mount["name"]
            if volume_name in claims:
                # The PersistentVolumeClaim <claim>-<pod>: kept across restarts.
                host = self.root / "pvc" / f"{volume_name}-{name}"
            else:
                host = pod_dir / "volumes" / volume_name
            mounts[mount["mountPath"]] = host
        for mount in self.container.get("volumeMounts", []):
            volume_name = mount["name"]
            host = mounts[mount["mountPath"]]
            volume = volumes.get(volume_name)
            if volume is None:
                continue
            if "configMap" in volume:
                data = self.manifests[("ConfigMap", volume["configMap"]["name"])]["data"]
                for key, value in data.items():
                    files[host / key] = self._map_text(str(value), mounts, ip).encode()
            elif "secret" in volume:
                for key, value in self.secrets[volume["secret"]["secretName"]].items():
                    files[host / key] = value
            elif "emptyDir" in volume:
                fresh.append(host)
            else:
                raise KeyError(f"volume {volume} is not rendered by this test")

        # $(VAR) sees the service links and the variables declared before it; the
        # image's ENV is underneath everything but invisible to $(VAR).
        declared: dict[str, str] = self._service_links()
        for item in self.container.get("env", []):
            if "value" in item:
                value = expand(str(item["value"]), declared)
            else:
                value = self._value_from(item["valueFrom"], name, ordinal, ip)
            declared[item["name"]] = value
        argv = [
            self._map_text(expand(str(part), declared), mounts, ip)
            for part in [*self.container.get("command", []), *self.container.get("args", [])]
        ]
        env: dict[str, str] = dict(image_environment())
        env["HOSTNAME"] = name
        env["PATH"] = f"{self.bin_dir}:/usr/local/bin:/usr/bin:/bin"
        for key, value in declared.items():
            env[key] = self._map_text(value, mounts, ip)
        assert argv, "the manifest names the command (the image's ENTRYPOINT is futureq)"
        probes = {}
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            spec = self.container.get(kind)
            if spec is None:
                continue
            http = spec["httpGet"]
            probes[kind] = Probe(
                path=http["path"],
                port=self.network.ports[self._named_port(http["port"])],
                period_s=float(spec.get("periodSeconds", 10)),
                timeout_s=float(spec.get("timeoutSeconds", 1)),
                failure_threshold=int(spec.get("failureThreshold", 3)),
            )
        workdir = mounts.get("/var/lib/futureq", pod_dir)
        return RenderedPod(
            ordinal=ordinal,
            name=name,
            ip=ip,
            argv=argv,
            env=env,
            workdir=workdir,
            mounts=mounts,
            files=files,
            fresh_dirs=fresh,
            probes=probes,
            termination_grace_s=float(self.pod_spec.get("terminationGracePeriodSeconds", 30)),
        )

    def _map_text(self, text: str, mounts: Mapping[str, Path], ip: str) -> str:
        # One pass, longest mount path first, so a mapped path is never mapped again.
        if mounts:
            pattern = "|".join(re.escape(path) for path in sorted(mounts, key=len, reverse=True))
            text = re.sub(
                rf"(?<![\w/.\-])(?:{pattern})(?=[/\"'\s:,]|$)",
                lambda match: str(mounts[match.group(0)]),
                text,
            )
        return self.network.rewrite(text, ip)


class PodProcess:
    """One pod's container as a process: started, probed, stopped like the kubelet does.

    Args:
        pod: What to run.
        log_dir: Where its stdout and stderr go (``<pod>.log``).
    """

    def __init__(self, pod: RenderedPod, log_dir: Path) -> None:
        self.pod = pod
        self.log_path = log_dir / f"{pod.name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Lay out the volumes (fresh ``emptyDir``, projected ConfigMap and Secret
        files, the claim kept as it is) and exec the container's command."""
        for host in self.pod.mounts.values():
            host.mkdir(parents=True, exist_ok=True)
        for fresh in self.pod.fresh_dirs:
            shutil.rmtree(fresh, ignore_errors=True)
            fresh.mkdir(parents=True)
        for path, content in self.pod.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(0o440)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.pod.argv,
                env=self.pod.env,
                cwd=self.pod.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def probe(self, kind: str) -> bool:
        """One run of the container's ``kind`` probe (``readinessProbe``, ...)."""
        return self.pod.probes[kind].check(self.pod.ip)

    def wait_probe(self, kind: str, timeout_s: float | None = None) -> float:
        """Poll ``kind`` every ``periodSeconds`` until it passes; return the seconds
        waited. A startup probe fails after ``failureThreshold`` periods (the kubelet
        would restart the container); ``timeout_s`` bounds the others.

        Raises:
            AssertionError: the process exited, or the probe did not pass in time.
        """
        probe = self.pod.probes[kind]
        began = time.monotonic()
        limit = timeout_s if timeout_s is not None else probe.period_s * probe.failure_threshold
        while True:
            assert self.alive(), f"{self.pod.name} exited:\n{self.log_tail()}"
            if probe.check(self.pod.ip):
                return time.monotonic() - began
            assert time.monotonic() - began < limit, (
                f"{self.pod.name}: {kind} {probe.path} did not pass within {limit} s:\n"
                f"{self.log_tail()}"
            )
            time.sleep(probe.period_s)

    def terminate(self) -> int | None:
        """SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds`` (pod deletion)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(self.pod.termination_grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill(self) -> None:
        """SIGKILL (the node's machine died)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        time.sleep(0.05)
