"""The Dockerfile's recipe, performed without a container runtime (issue 12).

No container runtime is reachable where the tests run, so this test reads the
``Dockerfile`` and carries out what it says on a directory standing in for the image's
root filesystem: the build context holds only what ``.dockerignore`` lets through, the
build stage's ``RUN`` steps build the wheels and install FutureQ with its runtime
dependencies (and nothing else) into a fresh virtualenv, the final stage's ``COPY`` and
``ENV`` lay out the image, and then the image's ``ENTRYPOINT`` + ``CMD`` start the
installed ``futureq`` with the image's environment, as the image's user when the test
runs as root. The ``HEALTHCHECK`` command must then pass, and the node must serve.

What differs from a real build, on purpose: absolute paths of the image live under a
temporary directory (``/opt/futureq`` -> ``ROOT/opt/futureq``); the base image's Python
is this machine's Python 3.11; the final stage's ``RUN`` (creating the user and the
volume directory) is done by the test, since it changes the machine's users; and the
listeners' ``0.0.0.0:PORT`` become ``127.0.0.1:FREE_PORT`` (a container has its own
network namespace; this machine is shared).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from cluster_process import free_ports
from wire_client import WireClient

from futureq.wire import frames

REPO = Path(__file__).resolve().parents[2]
IMAGE_UID = 10001
RECIPE_TIMEOUT_S = 600

pytestmark = pytest.mark.timeout(RECIPE_TIMEOUT_S)


@attrs.define
class Stage:
    """One ``FROM`` stage of the Dockerfile: its instructions in order."""

    name: str | None
    instructions: list[tuple[str, str]] = attrs.Factory(list)


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """``(global ARG defaults, stages)`` of a Dockerfile (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = " ".join(rest.split())
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            stages.append(Stage(words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
        else:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def env_pairs(rest: str) -> list[tuple[str, str]]:
    """``ENV A=1 B="two"`` -> ``[("A", "1"), ("B", "two")]``."""
    return [tuple(word.split("=", 1)) for word in shlex.split(rest)]  # type: ignore[misc]


def dockerignore_allows(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes."""
    allowed = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        bare = pattern[1:] if negate else pattern
        bare = bare.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(prefix, bare.replace("**/", "*")) for prefix in prefixes):
            allowed = negate
    return allowed


class ImageRoot:
    """A directory standing in for the image's ``/`` (and the build stage's)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env: dict[str, str] = {}

    def path(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def map_text(self, text: str) -> str:
        """Rewrite the image's absolute paths in ``text`` (not the base image's own
        /usr, /bin, /dev, /proc, /tmp)."""
        return re.sub(
            r"(?<=[\s=:\"'])(/(?!usr/|bin/|dev/|proc/|tmp/|sbin/)[\w.\-/]+)",
            lambda match: str(self.path(match.group(1))),
            f" {text}",
        )[1:]

    def expand(self, value: str) -> str:
        """``$VAR`` and ``${VAR}`` from the stage's environment (Dockerfile ENV rules)."""
        return re.sub(
            r"\$\{?(\w+)\}?",
            lambda match: self.env.get(match.group(1), os.environ.get(match.group(1), "")),
            value,
        )


@pytest.fixture
def image_root() -> Iterator[Path]:
    # Not under pytest's tmp_path: that is mode 0700, and the image's user must get in.
    root = Path(tempfile.mkdtemp(prefix="futureq-image-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build_context(into: Path) -> None:
    """Copy what ``.dockerignore`` lets into the build context."""
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    copied = 0
    for name in tracked:
        if dockerignore_allows(patterns, name) and (REPO / name).is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target)
            copied += 1
    assert copied > 0
    assert not (into / "tests").exists() and not (into / "bench").exists()


def run_build_stage(stage: Stage, image: ImageRoot, context: Path, bin_dir: Path) -> None:
    workdir = "/"
    for keyword, rest in stage.instructions:
        if keyword == "ENV":
            for key, value in env_pairs(rest):
                image.env[key] = image.map_text(image.expand(value))
        elif keyword == "WORKDIR":
            workdir = rest
            image.path(workdir).mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, dest = rest.split()
            target = image.path(dest if dest.startswith("/") else f"{workdir}/{dest}")
            for source in sources:
                origin = context / source
                if origin.is_dir():  # Docker copies a directory's contents
                    shutil.copytree(origin, target, dirs_exist_ok=True)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(origin, target / origin.name)
        elif keyword == "RUN":
            env = {**os.environ, **image.env, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
            done = subprocess.run(
                ["/bin/sh", "-c", image.map_text(rest)],
                cwd=image.path(workdir), env=env, capture_output=True, text=True,
                timeout=RECIPE_TIMEOUT_S,
            )  # fmt: skip
            assert done.returncode == 0, f"RUN {rest}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        else:
            raise AssertionError(
                f"the build stage uses {keyword}, which this test does not perform"
            )


def base_interpreter() -> str:
    """The system's Python when it is 3.11+ with venv (as in the base image: outside any
    home directory, so the image's user can run it), else the one running the tests."""
    system = Path("/usr/bin/python3")
    if system.exists():
        check = subprocess.run(
            [str(system), "-c", "import sys, venv, ensurepip; assert sys.version_info >= (3, 11)"],
            capture_output=True,
        )
        if check.returncode == 0:
            return str(system)
    return str(getattr(sys, "_base_executable", sys.executable))


def readable_by_others(path: Path) -> bool:
    """True when a user other than the owner can run ``path`` (every directory on the
    way is searchable by others)."""
    resolved = path.resolve()
    return all(parent.stat().st_mode & 0o001 for parent in resolved.parents) and bool(
        resolved.stat().st_mode & 0o005
    )


def test_the_image_recipe_installs_only_runtime_dependencies_and_serves(image_root: Path) -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    args, stages = parse_dockerfile(dockerfile)
    assert len(stages) == 2, "a build stage and a runtime stage"
    build, final = stages
    assert "slim" in args["PYTHON_IMAGE"], "a slim Python base image"

    context = image_root / "build-context"
    build_context(context)
    # The base image's `python`: this machine's Python, not the project's venv.
    base_python = base_interpreter()
    bin_dir = image_root / "base-bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(base_python)
    image = ImageRoot(image_root / "rootfs")
    image.root.mkdir()
    run_build_stage(build, image, context, bin_dir)

    # The runtime stage.
    image.env = {}
    user = workdir = None
    entrypoint: list[str] = []
    cmd: list[str] = []
    healthcheck: list[str] = []
    volumes: list[str] = []
    for keyword, rest in final.instructions:
        if keyword == "COPY":
            words = rest.split()
            if words[0].startswith("--from="):
                assert words[0] == f"--from={build.name}"
                assert image.path(words[1]) == image.path(words[2]), "copied in place"
            else:
                source, dest = words
                image.path(dest).parent.mkdir(parents=True, exist_ok=True)
                image.path(dest).write_text(image.map_text((context / source).read_text()))
        elif keyword == "ENV":
            for key, value in env_pairs(rest):
                image.env[key] = image.map_text(image.expand(value))
        elif keyword == "USER":
            user = rest
        elif keyword == "WORKDIR":
            workdir = rest
        elif keyword == "VOLUME":
            volumes = json.loads(rest)
        elif keyword == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif keyword == "CMD":
            cmd = json.loads(rest)
        elif keyword == "HEALTHCHECK":
            healthcheck = json.loads(rest.split(" CMD ", 1)[1])
        elif keyword == "RUN":
            # Creates the image's user and its volume directory: done below instead.
            assert f"--uid {IMAGE_UID}" in rest and "chown futureq:futureq /var/lib/futureq" in rest
        else:
            assert keyword in ("LABEL", "EXPOSE", "STOPSIGNAL"), keyword
    assert entrypoint == ["futureq"] and cmd == ["start"]
    assert user == f"{IMAGE_UID}:{IMAGE_UID}" and volumes == ["/var/lib/futureq"]
    assert not [key for key in image.env if re.match(r"FUTUREQ_[A-Z]+_", key)], (
        "no FUTUREQ_<SECTION>_<KEY> in the image: it would override mounted config files"
    )
    venv = image.path("/opt/futureq")
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    names = {package["name"].lower() for package in json.loads(installed)}
    assert "futureq" in names and "rocksdict" in names and "trio" in names
    dev_only = {"pytest", "hypothesis", "mypy", "ruff", "trustme", "pyinstrument", "psutil"}
    assert not names & dev_only, f"only runtime dependencies in the image: {names & dev_only}"

    # The volume and the image's user; ports as a container would publish them.
    data = image.path(volumes[0])
    data.mkdir(parents=True)
    config_path = Path(image.env["FUTUREQ_CONFIG"])
    client_port, http_port, raft_port = free_ports(3)
    config_text = config_path.read_text()
    for port, mapped in (("7450", client_port), ("7452", http_port), ("7451", raft_port)):
        assert f'"0.0.0.0:{port}"' in config_text
        config_text = config_text.replace(f'"0.0.0.0:{port}"', f'"127.0.0.1:{mapped}"')
    config_path.write_text(config_text)
    run_as: dict[str, int] = {}
    if os.geteuid() == 0 and readable_by_others(Path(base_python)):
        os.chown(data, IMAGE_UID, IMAGE_UID)
        run_as = {"user": IMAGE_UID, "group": IMAGE_UID}
    env = {
        **image.env,
        "PATH": image.env["PATH"],
        "HOME": str(data),
    }
    log_path = image_root / "futureq.stderr.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [*entrypoint, *cmd],
            cwd=image.path(workdir or "/"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            **run_as,  # type: ignore[call-overload]
        )
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()
        assert ready.startswith("READY "), log_path.read_text()[-3000:]
        fields = dict(part.split("=", 1) for part in ready.split()[1:])
        assert fields["client"] == f"127.0.0.1:{client_port}"
        # The image's HEALTHCHECK, run as Docker would: the same environment.
        deadline = time.monotonic() + 10
        while True:
            health = subprocess.run(
                healthcheck, env=env, capture_output=True, text=True, timeout=30, **run_as
            )
            if health.returncode == 0:
                break
            assert time.monotonic() < deadline, health.stderr
            time.sleep(0.2)
        assert "/healthz: 200" in health.stdout
        client = WireClient(fields["client"])
        answer = client.publish([["image", b"hello", 0, None, None]])
        assert isinstance(answer, frames.PublishOk), answer
        client.close()
        stored = list((data / "data").iterdir())
        assert stored, "RocksDB lives on the volume"
        if run_as:
            assert all(path.stat().st_uid == IMAGE_UID for path in stored)
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
    assert process.returncode == 0, log_path.read_text()[-3000:]
    # Unhealthy once stopped: the HEALTHCHECK command reports it.
    stopped = subprocess.run(healthcheck, env=env, capture_output=True, text=True, timeout=30)
    assert stopped.returncode == 1 and "no answer" in stopped.stderr


def test_the_image_config_pins_the_shard_count_and_exposes_every_shards_ports() -> None:
    """``futureq start``'s default shard count (auto) follows the host's cores in a
    container, and shard K listens on every port plus 100 K: the image's config names
    the count, and the Dockerfile EXPOSEs each shard's ports."""
    import tomllib

    config = tomllib.loads((REPO / "docker" / "futureq.toml").read_text())
    node = config.get("node", {})
    shards = node.get("shards")
    assert type(shards) is int and shards >= 1, f"node.shards must be a fixed count: {shards!r}"
    stride = node.get("shard_port_stride", 100)
    _, stages = parse_dockerfile((REPO / "Dockerfile").read_text())
    exposed = {
        int(port.split("/")[0])
        for keyword, rest in stages[-1].instructions
        if keyword == "EXPOSE"
        for port in rest.split()
    }
    for shard in range(shards):
        ports = {port + shard * stride for port in (7450, 7451, 7452)}
        assert ports <= exposed, f"shard {shard}: EXPOSE {sorted(ports - exposed)}"
