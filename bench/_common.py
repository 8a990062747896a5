"""Shared pieces of the benchmarks: a broker subprocess, a raw-frame trio connection,
/metrics scraping, percentiles, and the results files with ``--compare``.

The broker always runs as its own process (``python -m futureq.cli.server_main start``
on ``127.0.0.1:0``); the load generator speaks pipelined raw frames built with
:mod:`futureq.wire.codec` so that the client is not what is measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgpack
import trio

from futureq.shards.slots import SlotMap
from futureq.wire import codec, frames

RESULTS_DIR = Path(__file__).resolve().parent / "results"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PAYLOAD_BYTES = 100

_PACK = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def now_ms() -> float:
    """Wall clock in ms since the Unix epoch (float, same clock as the server's)."""
    return time.time_ns() / 1e6


# --------------------------------------------------------------------------- server


class Server:
    """A broker subprocess with its own temporary data directory.

    Args:
        data_dir: RocksDB directory; a fresh temporary one when None (removed by
            :meth:`cleanup`).
        extra_args: More ``start`` flags.
        env: Extra environment of the process (``FUTUREQ_*`` settings), on top of ours.

    Attributes:
        client_address: ``127.0.0.1:PORT`` of the client listener once started.
        http_address: ``127.0.0.1:PORT`` of the HTTP endpoints once started.
        started_s: ``time.monotonic()`` just before the process was spawned.
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self._own_dir = data_dir is None
        self.env = dict(env or {})
        self.root = Path(tempfile.mkdtemp(prefix="futureq-bench-")) if data_dir is None else None
        self.data_dir = data_dir if data_dir is not None else Path(self.root or ".") / "data"
        self.extra_args = list(extra_args or [])
        self.client_address = ""
        self.http_address = ""
        self.process: subprocess.Popen[str] | None = None
        self.started_s = 0.0
        self.stderr_path = (self.root or self.data_dir.parent) / "server.stderr.log"

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.process is not None
        return self.process.pid

    def spawn(self) -> None:
        """Start the process without waiting for it (see :meth:`wait_ready_line`)."""
        args = [sys.executable, "-m", "futureq.cli.server_main", "start"]
        args += ["--data-dir", str(self.data_dir), "--listen", "127.0.0.1:0"]
        # --shards 1 unless extra_args name a count (the last wins): a benchmark's figures
        # must not follow this machine's cores (futureq start's default, auto).
        args += ["--http", "127.0.0.1:0", "--log-level", "warning", "--shards", "1"]
        args += self.extra_args
        stderr = open(self.stderr_path, "a")  # noqa: SIM115 - handed to the child
        self.started_s = time.monotonic()
        self.process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, **self.env}
        )
        stderr.close()

    def wait_ready_line(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Read the ``READY`` line; return seconds from spawn to it.

        Raises:
            RuntimeError: the process exited or printed nothing within ``timeout_s``.
        """
        assert self.process is not None and self.process.stdout is not None
        line: list[str] = []
        stdout = self.process.stdout

        def read() -> None:
            line.append(stdout.readline())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout_s)
        elapsed = time.monotonic() - self.started_s
        if not line or not line[0].startswith("READY "):
            self.kill()
            tail = self.stderr_path.read_text()[-3000:] if self.stderr_path.exists() else ""
            raise RuntimeError(f"broker did not start within {timeout_s} s; stderr:\n{tail}")
        fields = dict(part.split("=", 1) for part in line[0].split()[1:])
        self.client_address = fields["client"]
        self.http_address = fields["http"]
        return elapsed

    def start(self) -> float:
        """Spawn and wait for ``READY``; return the seconds it took."""
        self.spawn()
        return self.wait_ready_line()

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> float:
        """SIGTERM by PID, SIGKILL if still alive after ``timeout_s``; return seconds to exit."""
        if self.process is None:
            return 0.0
        started = time.monotonic()
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout_s)
        elapsed = time.monotonic() - started
        self._close_pipe()
        return elapsed

    def kill(self) -> None:
        """SIGKILL by PID (a crash) and reap."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()

    def cleanup(self) -> None:
        """Stop the server if running and remove the temporary directory."""
        try:
            self.terminate()
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def http_get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` on the HTTP listener: ``(status, body)``; raises OSError if down."""
        url = f"http://{self.http_address}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return int(response.status), bytes(response.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def metrics(self) -> dict[str, float]:
        """Scrape ``/metrics``: sample name with labels -> value."""
        _, body = self.http_get("/metrics")
        return parse_metrics(body.decode())

    def data_bytes(self) -> int:
        """Bytes on disk under the data directory."""
        total = 0
        for path in self.data_dir.rglob("*"):
            if path.is_file():
                total += path.stat().st_size
        return total


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{"name{labels}": value}`` (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(samples: dict[str, float], name: str) -> float:
    """Sum of every sample of ``name`` (all label sets)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


# --------------------------------------------------------------------------- wire


def publish_items_bytes(
    count: int, *, topic: str, payload: bytes, delay_ms: int | None = None
) -> bytes:
    """msgpack of a PUBLISH ``items`` array of ``count`` identical items."""
    packed: bytes = _PACK([[topic, payload, delay_ms, None, None]] * count)
    return packed


def publish_frame(request_id: int, ack_level: int, items_packed: bytes) -> bytes:
    """A whole PUBLISH frame (length prefix included) around pre-packed items."""
    head: bytes = _PACK(frames.FrameType.PUBLISH) + _PACK(request_id) + _PACK(ack_level)
    body = b"\x94" + head + items_packed
    return len(body).to_bytes(codec.HEADER_BYTES, "big") + body


def frame_bytes(value: list[Any]) -> bytes:
    """Encode one raw frame list."""
    return codec.encode_value(value, 2**31)


class RawConnection:
    """One trio TCP connection speaking raw frame lists (``[type, request_id, ...]``)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = codec.FrameDecoder(64 * 1024 * 1024, parse=False)
        self._next_id = 1

    @classmethod
    async def open(cls, address: str, name: str = "bench") -> RawConnection:
        """Connect and do the HELLO handshake.

        Raises:
            RuntimeError: the server did not answer HELLO_OK.
        """
        host, port = address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        conn = cls(stream)
        await conn.send(frame_bytes([frames.FrameType.HELLO, 1, [1], name, None]))
        answer = await conn.receive()
        if answer[0] != frames.FrameType.HELLO_OK:
            raise RuntimeError(f"HELLO refused: {answer}")
        return conn

    def next_id(self) -> int:
        """A fresh request id."""
        self._next_id += 1
        return self._next_id

    async def send(self, data: bytes) -> None:
        """Write encoded frame bytes."""
        await self.stream.send_all(data)

    async def receive(self) -> list[Any]:
        """The next frame as a list.

        Raises:
            ConnectionError: the server closed the connection.
        """
        while True:
            event = self.decoder.next_frame()
            if event is codec.CLOSED:
                raise ConnectionError("server closed the connection")
            if event is not codec.NEED_DATA:
                assert isinstance(event, list)
                return event
            data = await self.stream.receive_some(1 << 20)
            self.decoder.receive_data(bytes(data))

    async def request(self, value: list[Any]) -> list[Any]:
        """Send a frame and return the next frame (no pushes expected meanwhile)."""
        await self.send(frame_bytes(value))
        return await self.receive()

    async def aclose(self) -> None:
        """Close the stream."""
        await self.stream.aclose()


LEADER_MOVED_CODES = (300, 301)  # NOT_LEADER; leadership being transferred


class LeaderMoved(Exception):
    """A shard's leader changed during a load window (the window is void)."""


def leader_moved(exc: BaseException) -> LeaderMoved | None:
    """The :class:`LeaderMoved` in ``exc`` (or in its exception groups), if any."""
    if isinstance(exc, LeaderMoved):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = leader_moved(inner)
            if found is not None:
                return found
    return None


async def ask_slot_map(address: str) -> SlotMap:
    """The slot map of the node at ``address`` (SLOT_MAP, as a client learns it; a node
    of one shard answers a map of one shard at its own address).

    Raises:
        RuntimeError: the node did not answer SLOT_MAP_OK.
        ValueError: the map is malformed.
    """
    conn = await RawConnection.open(address)
    try:
        answer = await conn.request([frames.FrameType.SLOT_MAP, conn.next_id()])
    finally:
        await conn.aclose()
    if answer[0] != frames.FrameType.SLOT_MAP_OK:
        raise RuntimeError(f"SLOT_MAP answered {answer}")
    return SlotMap.from_wire(answer[2])


async def publish_many(
    address: str,
    total: int,
    *,
    batch: int,
    topic: str,
    due_ms: Any = None,
    connections: int = 4,
    window: int = 8,
    ack_level: int = frames.AckLevel.QUORUM,
    payload: bytes = b"x" * PAYLOAD_BYTES,
    progress: Any = None,
) -> float:
    """Publish ``total`` messages in batches over pipelined connections; return seconds.

    Args:
        address: Client address of the broker.
        total: Messages to publish.
        batch: Items per PUBLISH.
        topic: Topic of every message.
        due_ms: ``f(index) -> deliver_at_ms`` (ms since the epoch) or None for delay 0.
        connections: Parallel connections.
        window: PUBLISH requests in flight per connection.
        ack_level: Ack level of every PUBLISH.
        payload: Payload of every message.
        progress: Called with the number of messages acknowledged so far, now and then.

    Raises:
        RuntimeError: the server refused a PUBLISH.
    """
    next_index = 0
    acked = 0
    started = time.monotonic()

    async def run_connection() -> None:
        nonlocal next_index, acked
        conn = await RawConnection.open(address)
        slots = trio.Semaphore(window)
        outstanding: dict[int, int] = {}
        done_sending = False
        drained = trio.Event()

        async def sender() -> None:
            nonlocal next_index
            while next_index < total:
                await slots.acquire()
                chunks = []
                while next_index < total:
                    count = min(batch, total - next_index)
                    first = next_index
                    next_index += count
                    if due_ms is None:
                        items = [[topic, payload, 0, None, None]] * count
                    else:
                        items = [
                            [topic, payload, None, due_ms(i), None]
                            for i in range(first, first + count)
                        ]
                    rid = conn.next_id()
                    outstanding[rid] = count
                    chunks.append(frame_bytes([frames.FrameType.PUBLISH, rid, ack_level, items]))
                    if len(chunks) >= 16:
                        break
                    try:
                        slots.acquire_nowait()
                    except trio.WouldBlock:
                        break
                if chunks:
                    await conn.send(b"".join(chunks))

        async def receiver() -> None:
            nonlocal acked
            while True:
                answer = await conn.receive()
                if answer[0] != frames.FrameType.PUBLISH_OK:
                    raise RuntimeError(f"PUBLISH refused: {answer}")
                acked += outstanding.pop(answer[1])
                slots.release()
                if progress is not None:
                    progress(acked)
                if done_sending and not outstanding:
                    drained.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            await sender()
            done_sending = True
            if outstanding:
                await drained.wait()
            nursery.cancel_scope.cancel()
        await conn.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(run_connection)
    return time.monotonic() - started


def start_py_spy(pid: int, seconds: float, label: str) -> subprocess.Popen[bytes] | None:
    """Start ``py-spy record`` on ``pid`` for ``seconds``; raw stacks go to
    ``bench/results/profile_<label>.txt`` (summarize with ``python -m bench.profile_stacks``).

    Returns:
        The py-spy process (wait for it), or None when py-spy is not installed.
    """
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        print("py-spy not installed (pip install py-spy); skipping the profile")
        return None
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"profile_{label}.txt"
    return subprocess.Popen(
        [py_spy, "record", "-p", str(pid), "-d", str(max(1, round(seconds))), "-r", "200"]
        + ["-f", "raw", "-o", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# --------------------------------------------------------------------------- stats


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in [0, 100]); nan if empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def median(values: list[float]) -> float:
    """Median (mean of the two middle values for an even count); nan if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# --------------------------------------------------------------------------- results


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so ``finally`` blocks stop the server and remove temp dirs."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def add_load_args(parser: argparse.ArgumentParser, profile_help: str) -> None:
    """The options of a load on fresh nodes: ``--connections`` (4), ``--profile``
    (py-spy; ``profile_help`` says what it records) and ``--no-fsync`` (:func:`fsync_env`)."""
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help=profile_help)
    parser.add_argument(
        "--no-fsync",
        action="store_true",
        help="nodes do not fsync: CPU costs alone, without a disk shared with other work",
    )


def fsync_env(fsync: bool) -> dict[str, str]:
    """The environment of a node that fsyncs (``{}``) or not (``--no-fsync``)."""
    return {} if fsync else {"FUTUREQ_STORAGE_FSYNC": "false"}


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """``--quick``, ``--compare`` and ``--no-save``; also installs :func:`exit_on_sigterm`."""
    exit_on_sigterm()
    parser.add_argument("--quick", action="store_true", help="smaller, faster variant")
    parser.add_argument(
        "--compare", action="store_true", help="print the change against the previous results"
    )
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")


def environment() -> dict[str, Any]:
    """Where the figures were measured."""
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def save_results(name: str, results: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json``, keeping the old one as ``<name>.prev.json``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    if path.exists():
        path.replace(RESULTS_DIR / f"{name}.prev.json")
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return path


def load_previous(name: str) -> dict[str, Any] | None:
    """The previous results of ``name`` (``<name>.prev.json``), or None."""
    path = RESULTS_DIR / f"{name}.prev.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


_SETUP_KEYS = frozenset(
    {"env", "command", "batch", "connections", "window_per_connection", "seconds", "readings_mb"}
)


def _flatten(value: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in _SETUP_KEYS:
                continue
            out.update(_flatten(inner, f"{prefix}{key}."))
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int | float):
        out[prefix.rstrip(".")] = float(value)
    return out


def print_compare(name: str, current: dict[str, Any], previous: dict[str, Any] | None) -> None:
    """Print every numeric figure with its change against ``previous``."""
    if previous is None:
        print(f"[{name}] no previous results to compare with")
        return
    if previous.get("quick") != current.get("quick"):
        print(f"[{name}] note: previous run was quick={previous.get('quick')}")
    before = _flatten(previous)
    after = _flatten(current)
    print(f"[{name}] change against {previous.get('env', {}).get('when', '?')}:")
    for key in sorted(after):
        if key not in before:
            continue
        old, new = before[key], after[key]
        if old == new:
            continue
        change = "" if old == 0 else f"{(new - old) / abs(old) * 100:+.1f}%"
        print(f"  {key:<50} {old:>14.3f} -> {new:>14.3f} {change}")


def finish(
    name: str, results: dict[str, Any], args: argparse.Namespace, argv: list[str] | None
) -> None:
    """Save results (unless ``--no-save``) and print the comparison with ``--compare``.

    Args:
        name: Benchmark name (file ``bench/results/<name>.json``).
        results: The figures; ``env``, ``quick`` and ``command`` are added.
        args: Parsed arguments (``quick``, ``compare``, ``no_save``).
        argv: The arguments the benchmark was run with (for the record).
    """
    results["env"] = environment()
    results["quick"] = bool(args.quick)
    given = sys.argv[1:] if argv is None else argv
    results["command"] = " ".join(["python", "-m", f"bench.{name}", *given])
    if not args.no_save:
        path = save_results(name, results)
        print(f"[{name}] results written to {path}")
    if args.compare:
        print_compare(name, results, load_previous(name) if not args.no_save else None)
