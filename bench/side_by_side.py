#!/usr/bin/env python3
"""FutureQ side by side with Redis and RabbitMQ, on this machine, in one run.

Run from the repository root with the project's venv (``make install``; the ``bench``
extra brings ``redis``, used only by the Redis lateness consumers)::

    .venv/bin/python -m bench.side_by_side --rounds 3 --systems fq1,redis,fq3,rabbit3

``make bench`` runs it once (``bench.run_all``) and prints the ratios. A peer whose
server is not installed (``redis-server``; ``rabbitmq-server`` with ``epmd``) is
skipped with a sentence saying so; install them with
``apt-get install -y redis-server rabbitmq-server``.

Every server is started fresh for every measurement, on free 127.0.0.1 ports, in a
temporary directory, and stopped afterwards by PID (SIGTERM, SIGKILL fallback); the
directory is removed. Only one system runs at a time.

1. Durable publish throughput, 4 client connections, 100-byte payloads, 100 messages
   per request/pipeline, delay 1 h, interleaved rounds (A, B, C, D, E, F) x N:

   * ``fq1``: FutureQ single node, ack after fsync (``bench.publish_throughput._load``:
     pre-encoded PUBLISH frames of 100 items, 200 requests in flight per connection).
   * ``redis``: Redis, ``appendonly yes``, ``appendfsync always`` (reply after the AOF
     write+fsync of the event-loop iteration), ``auto-aof-rewrite-percentage 0``;
     4 processes, each a raw RESP socket pipelining chunks of 100 single-member ZADDs
     (unique 108-byte member = 8-byte id + 100-byte payload, score = now + 1 h), with
     ``--redis-window`` chunks in flight.
   * ``redis_multi`` (optional, E): the same, but one ZADD with 100 score/member pairs
     per request (the closest analogue of one PUBLISH of 100 items).
   * ``rabbit``: RabbitMQ, one node, a durable quorum queue (no delayed-message plugin:
     a plain queue), publisher confirms; 4 processes, each a raw AMQP 0-9-1 connection
     publishing persistent messages in writes of 100 with at most ``--rabbit-window``
     (1000) unconfirmed.
   * ``fq1s2``: FutureQ single node with ``--shards 2`` (``bench.shards.sharded_node``),
     the same load, each connection sent to the shard that owns its topic by the node's
     SLOT_MAP answer (every FutureQ system spreads its 4 connections over the same two
     topics, one per shard of a 2-shard node, so the comparisons are like for like).
   * ``fq3``: FutureQ 3-node local cluster, ack at quorum (same load generator, leader).
   * ``fq3s2``: 3 nodes x 2 shards, measured once each shard is led by its preferred
     node (``bench.shards.when_balanced``; a window in which a leader moves is measured
     again), each connection sent to its topic's shard leader.
   * ``rabbit3`` (F): RabbitMQ 3-node cluster (classic-config peer discovery), the quorum
     queue declared on node 1 (3 members), publishers connected to node 1.

   Before each throughput run, on the same fresh server: synchronous latency, one
   request in flight on one connection, one message per request (FutureQ PUBLISH of 1
   item at quorum, to the shard (leader) owning topic ``sync``; Redis ZADD; RabbitMQ
   publish + wait for its confirm).

2. Due-to-delivery lateness, interleaved: FutureQ (``bench.lateness._run``: 20,000
   messages due evenly over 10 s, first due 5 s after publishing began, 4 consumers with
   prefetch 1000) vs Redis ZSET polling (the same due times as ZSET scores; 4 consumer
   processes, each every 10 ms running a Lua ZRANGEBYSCORE ... LIMIT 100 + ZREM, and
   polling again at once when it got a full batch). The sharded systems are not in it
   (a topic lives on one shard: its lateness is one shard's, which ``fq1`` measures).

3. Optional, once each: ``python -m bench.memory`` and ``python -m bench.restart``.

Results: one JSON line per measurement (with /proc/loadavg at its start and end) to
``--out``, and a markdown summary to ``--md``.

Usage::

    python side_by_side.py [--rounds 3] [--seconds 5] [--warmup 1] [--lat-seconds 4]
        [--systems fq1,fq1s2,redis,rabbit,fq3,fq3s2,redis_multi,rabbit3] [--lateness-rounds 2]
        [--memory] [--restart] [--wait-load 1.0 --wait-max-min 45]
        [--out results/side_by_side.jsonl] [--md results/side_by_side.md]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import trio

from bench import _cluster, _common, lateness, publish_throughput, shards
from futureq.shards.slots import SlotMap
from futureq.wire import codec, frames

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PAYLOAD = 100
DELAY_MS = 3_600_000
BATCH = 100
CONNECTIONS = 4
pc = time.perf_counter
RABBIT_ERL_ARGS = ""
SHARDS = 2
"""Shards per node of the sharded systems (``fq1s2``, ``fq3s2``)."""
SHARDED = ("fq1s2", "fq3s2")
TOPICS = shards.spread_topics(SHARDS)
"""The topics of every FutureQ throughput run: connection ``i`` publishes
``TOPICS[i % 2]``, one topic per shard of a 2-shard node, so both shards of ``fq1s2``
get work; ``fq1`` and ``fq3`` publish the same topics, so the comparison is fair."""
SYNC_TOPIC = "sync"


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


_TCK = os.sysconf("SC_CLK_TCK")


def cpu_snapshot() -> tuple[float, float, float]:
    """(monotonic s, machine busy CPU s, CPU s of this process and every descendant,
    reaped ones included): the difference of two snapshots gives other processes' CPU."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    busy = (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / _TCK
    me = psutil.Process()
    t = me.cpu_times()
    ours = t.user + t.system + t.children_user + t.children_system
    for c in me.children(recursive=True):
        try:
            ct = c.cpu_times()
            ours += ct.user + ct.system + ct.children_user + ct.children_system
        except psutil.NoSuchProcess:
            pass
    return time.monotonic(), busy, ours


def others_cpu_percent(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """CPU % (of one core) used between two snapshots by processes outside this benchmark."""
    wall = max(1e-9, b[0] - a[0])
    return round(((b[1] - a[1]) - (b[2] - a[2])) / wall * 100, 1)


def top_processes(n: int = 8) -> list[str]:
    out = subprocess.run(
        ["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()
    # keep only program names: absolute paths say nothing about the measurement
    return [re.sub(r"/[^\s]*/", "", line)[:110] for line in out[: n + 1]]


def pct(sorted_values: list[float], q: float) -> float:
    return _common.percentile(sorted_values, q)


def stop_pid(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM by PID, SIGKILL by PID after ``timeout_s``; reap."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def kill_pids(pids: dict[int, float]) -> None:
    """SIGKILL by PID whatever of ``pids`` (pid -> create_time) is still alive and is still
    the same process (same create time), e.g. leftover children."""
    for pid, created in pids.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                os.kill(pid, signal.SIGKILL)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass


def record_children(pid: int, into: dict[int, float]) -> None:
    """Add every live descendant of ``pid`` to ``into`` (pid -> create_time)."""
    try:
        for c in psutil.Process(pid).children(recursive=True):
            try:
                into.setdefault(c.pid, c.create_time())
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# ----------------------------------------------------------------------------- Redis


class RedisServer:
    """redis-server, AOF with fsync on every write, in a temp dir, on a free port."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="sbs-redis-"))
        self.port = _cluster.free_ports(1)[0]
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        t0 = time.monotonic()
        args = [
            shutil.which("redis-server") or "redis-server",
            "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.root),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            "--auto-aof-rewrite-percentage", "0", "--daemonize", "no",
            "--logfile", str(self.root / "redis.log"), "--protected-mode", "no",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = t0 + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return time.monotonic() - t0
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis did not start")

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc else []

    def info(self) -> dict[str, str]:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"INFO server\r\n")
            data = b""
            while b"\r\n" not in data:
                data += s.recv(65536)
            size = int(data[1 : data.index(b"\r\n")])
            while len(data) < data.index(b"\r\n") + 2 + size:
                data += s.recv(65536)
        text = data.decode(errors="replace")
        return {
            k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines()) if v
        }

    def stop(self) -> None:
        try:
            if self.proc is not None:
                stop_pid(self.proc)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def resp(*args: bytes) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class RedisZaddGen:
    """Builds pipelined ZADD chunks with unique members, cheaply."""

    def __init__(self, key: bytes, worker: int, multi: bool, pipe: int = BATCH) -> None:
        self.key = key
        self.multi = multi
        self.pipe = pipe
        self.seq = worker << 48
        self.tail = b"p" * PAYLOAD + b"\r\n"

    def chunk(self) -> bytes:
        score = b"%d" % (int(time.time() * 1000) + DELAY_MS)
        key = self.key
        seq = self.seq
        self.seq += self.pipe
        tail = self.tail
        if self.multi:
            parts = [b"*%d\r\n$4\r\nZADD\r\n$%d\r\n%s\r\n" % (2 + 2 * self.pipe, len(key), key)]
            head = b"$%d\r\n%s\r\n$108\r\n" % (len(score), score)
        else:
            parts = []
            head = b"*4\r\n$4\r\nZADD\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$108\r\n" % (
                len(key), key, len(score), score)  # fmt: skip
        for i in range(seq, seq + self.pipe):
            parts.append(head)
            parts.append(i.to_bytes(8, "big"))
            parts.append(tail)
        return b"".join(parts)

    @property
    def replies_per_chunk(self) -> int:
        return 1 if self.multi else self.pipe

    @property
    def msgs_per_reply(self) -> int:
        return self.pipe if self.multi else 1


def redis_worker(port: int, worker: int, multi: bool, window: int, t_go: float,
                 t_start: float, t_end: float, q: Any) -> None:  # fmt: skip
    """One connection; ``window`` chunks of 100 in flight; count replies in the window."""
    try:
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(0.5)
        gen = RedisZaddGen(b"dq", worker, multi)
        rpc = gen.replies_per_chunk
        mpr = gen.msgs_per_reply
        pending = 0
        acked = 0
        errors = 0
        first_error = None
        while time.monotonic() < t_go:
            time.sleep(0.001)
        cpu0 = cpu1 = None
        while True:
            now = time.monotonic()
            if cpu0 is None and now >= t_start:
                cpu0 = time.process_time()
            if now >= t_end:
                cpu1 = time.process_time()
                break
            while pending + rpc <= window * rpc:
                s.sendall(gen.chunk())
                pending += rpc
            try:
                data = s.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                raise ConnectionError("redis closed the connection")
            n = data.count(b"\n")
            if b"-" in data:
                errors += data.count(b"-")
                if first_error is None:
                    first_error = data[data.index(b"-") : data.index(b"-") + 120].decode(
                        errors="replace"
                    )
            pending -= n
            if t_start <= time.monotonic() < t_end:
                acked += n * mpr
        s.close()
        q.put({"worker": worker, "acked": acked, "errors": errors, "first_error": first_error,
               "cpu_s": (cpu1 or 0) - (cpu0 or 0)})  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        q.put({"worker": worker, "exception": repr(exc)})


def redis_sync_latency(port: int, warm_s: float, secs: float) -> list[float]:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"l" * PAYLOAD
    lat = []
    i = 0
    t0 = pc()
    while True:
        t = pc()
        if t - t0 >= warm_s + secs:
            break
        i += 1
        cmd = resp(b"ZADD", b"lat", b"%d" % (int(time.time() * 1000) + DELAY_MS),
                   i.to_bytes(8, "big") + payload)  # fmt: skip
        s.sendall(cmd)
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        if not data.startswith(b":"):
            raise RuntimeError(f"ZADD answered {data!r}")
        if t - t0 >= warm_s:
            lat.append((pc() - t) * 1000)
    s.close()
    return lat


# ----------------------------------------------------------------------------- RabbitMQ


def _shortstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return bytes([len(b)]) + b


def _longstr(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def _table(d: dict[str, bytes]) -> bytes:
    body = b"".join(_shortstr(k) + b"S" + _longstr(v) for k, v in d.items())
    return struct.pack(">I", len(body)) + body


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def _method(channel: int, cls: int, meth: int, args: bytes) -> bytes:
    return _frame(1, channel, struct.pack(">HH", cls, meth) + args)


class Amqp:
    """A minimal AMQP 0-9-1 client: handshake, one channel, confirms, raw publishes."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(0, 10, 10)  # Connection.Start
        self.sock.sendall(_method(0, 10, 11, _table({"product": b"side_by_side"})
                                  + _shortstr("PLAIN") + _longstr(b"\x00guest\x00guest")
                                  + _shortstr("en_US")))  # fmt: skip
        args = self.expect(0, 10, 30)  # Tune
        channel_max, frame_max, _hb = struct.unpack(">HIH", args[:8])
        self.sock.sendall(
            _method(0, 10, 31, struct.pack(">HIH", channel_max or 2047, frame_max, 0))
        )
        self.sock.sendall(_method(0, 10, 40, _shortstr("/") + _shortstr("") + b"\x00"))
        self.expect(0, 10, 41)
        self.sock.sendall(_method(1, 20, 10, _shortstr("")))
        self.expect(1, 20, 11)
        self.published = 0
        self.acked_upto = 0
        self.extra: set[int] = set()
        self.nacked = 0

    # -- frames in
    def _frames(self) -> list[tuple[int, int, bytes]]:
        out = []
        buf = self.buf
        off = 0
        n = len(buf)
        while n - off >= 8:
            kind, channel, size = struct.unpack_from(">BHI", buf, off)
            if n - off < 8 + size:
                break
            if buf[off + 7 + size] != 0xCE:
                raise RuntimeError("bad AMQP frame end")
            out.append((kind, channel, bytes(buf[off + 7 : off + 7 + size])))
            off += 8 + size
        if off:
            del buf[:off]
        return out

    def _read(self) -> list[tuple[int, int, bytes]]:
        while True:
            got = self._frames()
            if got:
                return got
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("AMQP server closed the connection")
            self.buf += data

    def expect(self, channel: int, cls: int, meth: int) -> bytes:
        while True:
            for kind, ch, payload in self._read():
                if kind != 1:
                    continue
                c, m = struct.unpack_from(">HH", payload)
                if (c, m) in ((10, 50), (20, 40)):
                    code = struct.unpack_from(">H", payload, 4)[0]
                    text = payload[7 : 7 + payload[6]].decode(errors="replace")
                    raise RuntimeError(f"AMQP close {code}: {text}")
                if (ch, c, m) == (channel, cls, meth):
                    return payload[4:]
                self._handle(c, m, payload)

    def _handle(self, c: int, m: int, payload: bytes) -> int:
        """Basic.Ack / Basic.Nack: update the confirm bookkeeping; return newly confirmed."""
        if (c, m) not in ((60, 80), (60, 120)):
            if (c, m) in ((10, 50), (20, 40)):
                raise RuntimeError(f"AMQP close: {payload[7 : 7 + payload[6]]!r}")
            return 0
        tag, bits = struct.unpack_from(">QB", payload, 4)
        new = 0
        if bits & 1:
            if tag > self.acked_upto:
                new = tag - self.acked_upto - sum(1 for t in self.extra if t <= tag)
                self.extra = {t for t in self.extra if t > tag}
                self.acked_upto = tag
        elif tag > self.acked_upto and tag not in self.extra:
            self.extra.add(tag)
            new = 1
            while self.acked_upto + 1 in self.extra:
                self.extra.discard(self.acked_upto + 1)
                self.acked_upto += 1
        if m == 120:
            self.nacked += new
            return 0
        return new

    def poll_confirms(self) -> int:
        """Read once (blocking, socket timeout applies); return newly acked messages."""
        new = 0
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("AMQP server closed the connection")
        self.buf += data
        for kind, _ch, payload in self._frames():
            if kind == 1:
                c, m = struct.unpack_from(">HH", payload)
                new += self._handle(c, m, payload)
        return new

    @property
    def unconfirmed(self) -> int:
        return self.published - self.acked_upto - len(self.extra)

    # -- commands
    def declare_quorum(self, queue: str) -> None:
        args = (
            struct.pack(">H", 0) + _shortstr(queue) + b"\x02" + _table({"x-queue-type": b"quorum"})
        )
        self.sock.sendall(_method(1, 50, 10, args))
        self.expect(1, 50, 11)

    def confirm_select(self) -> None:
        self.sock.sendall(_method(1, 85, 10, b"\x00"))
        self.expect(1, 85, 11)

    @staticmethod
    def publish_bytes(queue: str, body: bytes, count: int) -> bytes:
        one = (_method(1, 60, 40, struct.pack(">H", 0) + _shortstr("") + _shortstr(queue) + b"\x00")
               + _frame(2, 1, struct.pack(">HHQH", 60, 0, len(body), 0x1000) + b"\x02")
               + _frame(3, 1, body))  # fmt: skip
        return one * count

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def rabbit_worker(port: int, queue: str, worker: int, window: int, t_go: float,
                  t_start: float, t_end: float, q: Any) -> None:  # fmt: skip
    try:
        conn = Amqp(port)
        conn.confirm_select()
        chunk = Amqp.publish_bytes(queue, b"r" * PAYLOAD, BATCH)
        conn.sock.settimeout(0.5)
        acked = 0
        while time.monotonic() < t_go:
            time.sleep(0.001)
        cpu0 = cpu1 = None
        while True:
            now = time.monotonic()
            if cpu0 is None and now >= t_start:
                cpu0 = time.process_time()
            if now >= t_end:
                cpu1 = time.process_time()
                break
            while conn.unconfirmed + BATCH <= window:
                conn.sock.sendall(chunk)
                conn.published += BATCH
            try:
                new = conn.poll_confirms()
            except TimeoutError:
                continue
            if t_start <= time.monotonic() < t_end:
                acked += new
        conn.close()
        q.put({"worker": worker, "acked": acked, "nacked": conn.nacked,
               "cpu_s": (cpu1 or 0) - (cpu0 or 0)})  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        q.put({"worker": worker, "exception": repr(exc)})


def rabbit_sync_latency(port: int, queue: str, warm_s: float, secs: float) -> list[float]:
    conn = Amqp(port)
    conn.confirm_select()
    one = Amqp.publish_bytes(queue, b"l" * PAYLOAD, 1)
    lat = []
    t0 = pc()
    while True:
        t = pc()
        if t - t0 >= warm_s + secs:
            break
        conn.sock.sendall(one)
        conn.published += 1
        while conn.unconfirmed:
            conn.poll_confirms()
        if conn.nacked:
            raise RuntimeError("nack")
        if t - t0 >= warm_s:
            lat.append((pc() - t) * 1000)
    conn.close()
    return lat


class RabbitServer:
    """``size`` RabbitMQ nodes (no plugins) with their own epmd, in a temp dir, on free
    ports. With size > 1 the nodes form a cluster by classic-config peer discovery: node 1
    starts first, then the others boot and join it."""

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self.root = Path(tempfile.mkdtemp(prefix="sbs-rabbit-"))
        ports = _cluster.free_ports(1 + 2 * size)
        self.epmd_port = ports[0]
        self.node_ports = [(ports[1 + 2 * i], ports[2 + 2 * i]) for i in range(size)]
        self.names = [
            f"sbs{os.getpid()}n{i + 1}x{self.node_ports[i][0]}@localhost" for i in range(size)
        ]
        self.procs: list[subprocess.Popen] = []
        self.epmd: subprocess.Popen | None = None
        self.children: dict[int, float] = {}
        self.env: dict[str, str] = {}

    @property
    def port(self) -> int:
        """AMQP port of node 1 (where queues are declared, so it leads them)."""
        return self.node_ports[0][0]

    def _node_env(self, i: int) -> dict[str, str]:
        r = self.root / f"node{i + 1}"
        for sub in ("mnesia", "log"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        (r / "enabled_plugins").write_text("[].\n")
        (r / "rabbitmq-env.conf").write_text("")
        conf = (f"listeners.tcp.default = 127.0.0.1:{self.node_ports[i][0]}\n"
                "log.console = false\nlog.file.level = warning\n")  # fmt: skip
        if self.size > 1:
            conf += "cluster_formation.peer_discovery_backend = classic_config\n"
            conf += "".join(f"cluster_formation.classic_config.nodes.{k + 1} = {n}\n"
                            for k, n in enumerate(self.names))  # fmt: skip
        (r / "rabbitmq.conf").write_text(conf)
        env = dict(self.env)
        if RABBIT_ERL_ARGS:
            env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] = RABBIT_ERL_ARGS
        env.update({
            "RABBITMQ_NODENAME": self.names[i],
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.node_ports[i][0]),
            "RABBITMQ_DIST_PORT": str(self.node_ports[i][1]),
            "RABBITMQ_CONFIG_FILE": str(r / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(r / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(r / "rabbitmq-env.conf"),
            "RABBITMQ_MNESIA_BASE": str(r / "mnesia"),
            "RABBITMQ_LOG_BASE": str(r / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(r / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(r / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(r / "rabbit.pid"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(r / "feature_flags"),
        })  # fmt: skip
        return env

    def _spawn(self, i: int) -> None:
        r = self.root / f"node{i + 1}"
        env = self._node_env(i)
        out = open(r / "stdout.log", "w")  # noqa: SIM115
        self.procs.append(subprocess.Popen(
            ["/usr/lib/rabbitmq/bin/rabbitmq-server"], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env, cwd=str(r),
        ))  # fmt: skip
        out.close()

    def _wait_amqp(self, i: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"rabbitmq node {i + 1} exited: " + self._log(i))
            self._record_children()
            try:
                Amqp(self.node_ports[i][0], timeout=2).close()
                self._record_children()
                return
            except (OSError, RuntimeError, struct.error):
                time.sleep(0.25)
        raise RuntimeError(f"rabbitmq node {i + 1} did not start: " + self._log(i))

    def _log(self, i: int) -> str:
        path = self.root / f"node{i + 1}" / "stdout.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def ctl(self, *argv: str, timeout_s: float = 60) -> str:
        """``rabbitmqctl -n NODE1 ARGV`` with this group's cookie and epmd."""
        env = self._node_env(0)
        out = subprocess.run(["/usr/lib/rabbitmq/bin/rabbitmqctl", "-n", self.names[0], *argv],
                             capture_output=True, text=True, env=env, timeout=timeout_s)  # fmt: skip
        return out.stdout + out.stderr

    def start(self, timeout_s: float = 240.0) -> float:
        t0 = time.monotonic()
        home = self.root / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex().upper())
        cookie.chmod(0o400)
        self.env = dict(os.environ)
        self.env.update({"HOME": str(home), "ERL_EPMD_PORT": str(self.epmd_port),
                         "ERL_EPMD_ADDRESS": "127.0.0.1"})  # fmt: skip
        self.epmd = subprocess.Popen(
            [shutil.which("epmd") or "epmd", "-address", "127.0.0.1", "-port", str(self.epmd_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.epmd_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        deadline = time.monotonic() + timeout_s
        self._spawn(0)
        self._wait_amqp(0, deadline)
        for i in range(1, self.size):
            self._spawn(i)
        for i in range(1, self.size):
            self._wait_amqp(i, deadline)
        if self.size > 1:
            while time.monotonic() < deadline:
                text = self.ctl("cluster_status", "--formatter", "json")
                try:
                    running = json.loads(text[text.index("{") :]).get("running_nodes", [])
                except ValueError:
                    running = []
                if len(running) == self.size:
                    break
                time.sleep(1)
            else:
                raise RuntimeError(f"rabbitmq cluster did not form: {text[-1000:]}")
        return time.monotonic() - t0

    def _record_children(self) -> None:
        for p in self.procs:
            record_children(p.pid, self.children)

    @property
    def pids(self) -> list[int]:
        return [*(p.pid for p in self.procs), *self.children]

    def stop(self) -> None:
        try:
            self._record_children()
            for p in reversed(self.procs):
                stop_pid(p, 60.0)
            time.sleep(0.2)
            kill_pids(self.children)
            if self.epmd is not None:
                stop_pid(self.epmd, 10.0)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RabbitServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ----------------------------------------------------------------------------- FutureQ


class FqSync:
    """Blocking raw-frame FutureQ connection for one-in-flight publishes."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.dec = codec.FrameDecoder(64 << 20, parse=False)
        self.rid = 1
        self.sock.sendall(_common.frame_bytes([frames.FrameType.HELLO, 1, [1], "sbs", None]))
        answer = self.recv()
        if answer[0] != frames.FrameType.HELLO_OK:
            raise RuntimeError(f"HELLO refused: {answer}")

    def recv(self) -> list[Any]:
        while True:
            ev = self.dec.next_frame()
            if ev is codec.CLOSED:
                raise ConnectionError("closed")
            if ev is not codec.NEED_DATA:
                return ev  # type: ignore[return-value]
            self.dec.receive_data(self.sock.recv(1 << 20))

    def latency(self, warm_s: float, secs: float) -> list[float]:
        """Publish one message of ``SYNC_TOPIC`` at a time; ms of each after ``warm_s``.

        Raises:
            LeaderMoved: answered NOT_LEADER (a shard's leader moved).
        """
        items = _common.publish_items_bytes(1, topic=SYNC_TOPIC, payload=b"s" * PAYLOAD,
                                            delay_ms=DELAY_MS)  # fmt: skip
        lat = []
        t0 = pc()
        while True:
            t = pc()
            if t - t0 >= warm_s + secs:
                break
            self.rid += 1
            self.sock.sendall(_common.publish_frame(self.rid, frames.AckLevel.QUORUM, items))
            answer = self.recv()
            if answer[0] == frames.FrameType.ERROR and answer[2] in _common.LEADER_MOVED_CODES:
                raise _common.LeaderMoved(answer[3])
            if answer[0] != frames.FrameType.PUBLISH_OK or answer[1] != self.rid:
                raise RuntimeError(f"PUBLISH answered {answer}")
            if t - t0 >= warm_s:
                lat.append((pc() - t) * 1000)
        self.sock.close()
        return lat


# ----------------------------------------------------------------------------- runs


def lat_stats(lat: list[float]) -> dict[str, Any]:
    s = sorted(lat)
    return {
        "n": len(s),
        "p50_ms": round(pct(s, 50), 3),
        "p90_ms": round(pct(s, 90), 3),
        "p99_ms": round(pct(s, 99), 3),
        "max_ms": round(s[-1], 3) if s else None,
        "mean_ms": round(statistics.fmean(s), 3) if s else None,
    }


def run_workers(target: Any, args_for: Any, warmup: float, seconds: float,
                server_pids: list[int]) -> dict[str, Any]:  # fmt: skip
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    t_go = time.monotonic() + 0.5
    t_start = t_go + warmup
    t_end = t_start + seconds
    procs = [ctx.Process(target=target, args=(*args_for(w), t_go, t_start, t_end, q), daemon=True)
             for w in range(CONNECTIONS)]  # fmt: skip
    for p in procs:
        p.start()
    while time.monotonic() < t_start:
        time.sleep(0.005)
    cpu0 = cpu_seconds(server_pids)
    while time.monotonic() < t_end:
        time.sleep(0.005)
    cpu1 = cpu_seconds(server_pids)
    results = [q.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)
    bad = [r for r in results if "exception" in r]
    if bad:
        raise RuntimeError(f"worker failed: {bad}")
    acked = sum(r["acked"] for r in results)
    return {
        "msgs_per_s": round(acked / seconds, 1),
        "messages": acked,
        "seconds": seconds,
        "server_cpu_percent": round((cpu1 - cpu0) / seconds * 100, 1),
        "loadgen_cpu_percent": round(sum(r["cpu_s"] for r in results) / seconds * 100, 1),
        "errors": sum(r.get("errors", 0) + r.get("nacked", 0) for r in results),
        "first_error": next((r.get("first_error") for r in results if r.get("first_error")), None),
    }


def routed(slot_map: SlotMap, shard_addresses: list[str] | None = None) -> list[tuple[str, str]]:
    """``(address, topic)`` per topic of ``TOPICS``: the address of the shard that owns
    it by ``slot_map`` (as a client routes), ``shard_addresses[shard]`` when given (the
    shards' leaders in a cluster), else the map's own address of that shard."""
    addresses = shard_addresses or list(slot_map.addresses)
    return [(addresses[slot_map.shard_of(topic)], topic) for topic in TOPICS]


def _fq_throughput(server: _common.Server, args: argparse.Namespace,
                   targets: list[tuple[str, str]],
                   processes: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """``publish_throughput._load`` of ``TOPICS`` over ``targets`` (/metrics: ``server``;
    CPU: ``processes``, else ``server``'s process)."""
    return trio.run(publish_throughput._load, server, BATCH, CONNECTIONS, args.warmup,
                    args.seconds, args.fq_window, targets, processes)  # fmt: skip


def _fq_config(tp: dict[str, Any], shard_count: int = 1) -> dict[str, Any]:
    return {"connections": CONNECTIONS, "batch": BATCH, "topics": TOPICS,
            "shards_per_node": shard_count,
            "requests_in_flight_per_conn": tp["window_per_connection"]}  # fmt: skip


def _fq_balanced(cluster: _cluster.LocalCluster, slot_map: SlotMap, args: argparse.Namespace,
                 leaders: dict[int, int], addresses: list[str],
                 processes: dict[str, int]) -> tuple[list[float], dict[str, Any]]:  # fmt: skip
    """Sync latency, then throughput of a sharded cluster whose shards' leaders are
    ``leaders`` (client ``addresses`` by shard, ``processes`` every shard process):
    ``shards.when_balanced``'s load."""
    sync = FqSync(addresses[slot_map.shard_of(SYNC_TOPIC)])
    lat = sync.latency(args.lat_warmup, args.lat_seconds)
    node = cluster.nodes[leaders[0]]
    return lat, _fq_throughput(node, args, routed(slot_map, addresses), processes)


def measure(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One fresh server of ``system``: sync latency, then throughput. Returns a record."""
    rec: dict[str, Any] = {"system": system}
    t_start_s = time.monotonic()
    if system == "fq1":
        with _common.Server() as server:
            rec["start_s"] = round(server.start(), 2)
            slot_map = trio.run(_common.ask_slot_map, server.client_address)
            lat = FqSync(slot_map.address_of(SYNC_TOPIC)).latency(args.lat_warmup,
                                                                  args.lat_seconds)  # fmt: skip
            tp = _fq_throughput(server, args, routed(slot_map))
            rec["config"] = _fq_config(tp)
    elif system == "fq1s2":
        with shards.sharded_node(SHARDS) as (node, _):
            rec["start_s"] = round(time.monotonic() - node.started_s, 2)
            slot_map = trio.run(_common.ask_slot_map, node.client_address)
            lat = FqSync(slot_map.address_of(SYNC_TOPIC)).latency(args.lat_warmup,
                                                                  args.lat_seconds)  # fmt: skip
            processes = shards.node_processes(node.pid, SHARDS)
            tp = _fq_throughput(node, args, routed(slot_map), processes)
            rec["config"] = _fq_config(tp, SHARDS)
    elif system == "fq3":
        with _cluster.LocalCluster(3) as cluster:
            rec["start_s"] = round(cluster.start(), 2)
            leader = cluster.leader()
            meter = _cluster.CpuMeter({f"node{n.node_id}" + ("_leader" if n is leader else ""): n.pid
                                       for n in cluster.nodes.values()})  # fmt: skip
            slot_map = trio.run(_common.ask_slot_map, leader.client_address)
            lat = FqSync(leader.client_address).latency(args.lat_warmup, args.lat_seconds)
            meter.start()
            tp = _fq_throughput(leader, args, routed(slot_map))
            tp["node_cpu_percent"] = meter.stop()
            tp["server_cpu_percent"] = round(sum(tp["node_cpu_percent"].values()), 1)
            rec["config"] = _fq_config(tp)
    elif system == "fq3s2":
        with _cluster.LocalCluster(3, shards=SHARDS) as cluster:
            rec["start_s"] = round(cluster.start(), 2)
            slot_map = trio.run(_common.ask_slot_map, cluster.nodes[1].client_address)
            load = functools.partial(_fq_balanced, cluster, slot_map, args)
            (lat, tp), how = shards.when_balanced(cluster, SHARDS, load)
            tp["process_role"] = how["roles"]
            rec["leaders"] = {str(k): v for k, v in how["leaders"].items()}
            for key in ("leaders_changed", "balance_wait_s", "windows_voided_by_leader_moves"):
                rec[key] = how[key]
            rec["config"] = _fq_config(tp, SHARDS)
    elif system in ("redis", "redis_multi"):
        multi = system == "redis_multi"
        window = args.redis_multi_window if multi else args.redis_window
        with RedisServer() as server:
            rec["start_s"] = round(server.start(), 2)
            lat = (
                redis_sync_latency(server.port, args.lat_warmup, args.lat_seconds)
                if not multi
                else []
            )
            tp = run_workers(
                redis_worker, lambda w: (server.port, w, multi, window),
                args.warmup, args.seconds, server.pids,
            )  # fmt: skip
            info = server.info()
            rec["server_version"] = info.get("redis_version", "").strip()
            rec["config"] = {"connections": CONNECTIONS, "per_request": "1 ZADD x 100 pairs" if multi
                             else "100 pipelined ZADDs", "chunks_in_flight_per_conn": window,
                             "appendfsync": "always", "auto_aof_rewrite": "off"}  # fmt: skip
    elif system in ("rabbit", "rabbit3"):
        size = 3 if system == "rabbit3" else 1
        with RabbitServer(size) as server:
            rec["start_s"] = round(server.start(), 2)
            queue = "qq_sbs"
            c = Amqp(server.port)
            c.declare_quorum(queue)
            c.close()
            if size > 1:
                text = server.ctl("list_queues", "name", "type", "leader", "members", "online",
                                  "--formatter", "json")  # fmt: skip
                try:
                    rec["queue_members"] = json.loads(text[text.index("[") :])
                except ValueError:
                    rec["queue_members"] = text[-500:]
            lat = rabbit_sync_latency(server.port, queue, args.lat_warmup, args.lat_seconds)
            tp = run_workers(
                rabbit_worker, lambda w: (server.port, queue, w, args.rabbit_window),
                args.warmup, args.seconds, server.pids,
            )  # fmt: skip
            rec["config"] = {"connections": CONNECTIONS, "unconfirmed_window_per_conn": args.rabbit_window,
                             "write_chunk": BATCH, "queue": f"quorum, durable, {size} node(s)",
                             "delivery_mode": 2}  # fmt: skip
    else:
        raise ValueError(system)
    rec["throughput"] = tp
    rec["msgs_per_s"] = tp["msgs_per_s"]
    if lat:
        rec["sync_latency"] = lat_stats(lat)
        rec["_lat_samples"] = lat
    rec["wall_s"] = round(time.monotonic() - t_start_s, 1)
    return rec


# ----------------------------------------------------------------------------- lateness


REDIS_CLAIM_LUA = """
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
if #items > 0 then
  local members = {}
  for i = 1, #items, 2 do members[#members + 1] = items[i] end
  redis.call('ZREM', KEYS[1], unpack(members))
end
return items
"""


def redis_lateness_consumer(port: int, poll_s: float, limit: int, stop_ms: float,
                            first_poll_ms: float, q: Any) -> None:  # fmt: skip
    import redis

    try:
        r = redis.Redis(host="127.0.0.1", port=port)
        claim = r.register_script(REDIS_CLAIM_LUA)
        claim(keys=["delayed"], args=[0, limit])  # load the script
        late: list[float] = []
        while time.time() * 1000 < first_poll_ms:
            time.sleep(0.0005)
        while True:
            now = time.time() * 1000
            if now > stop_ms:
                break
            items = claim(keys=["delayed"], args=[int(now), limit])
            got = time.time() * 1000
            for i in range(1, len(items), 2):
                late.append(got - float(items[i]))
            if len(items) < 2 * limit:
                time.sleep(poll_s)
        q.put({"late": late})
    except Exception as exc:  # noqa: BLE001
        q.put({"exception": repr(exc)})


def redis_lateness(args: argparse.Namespace) -> dict[str, Any]:
    import redis

    total, spread_s, lead_s = args.late_messages, args.late_spread_s, args.late_lead_s
    with RedisServer() as server:
        server.start()
        r = redis.Redis(host="127.0.0.1", port=server.port)
        start_ms = _common.now_ms()
        first_due = int(start_ms + lead_s * 1000)
        spread = int(spread_s * 1000)
        payload = b"d" * PAYLOAD
        t0 = pc()
        for base in range(0, total, 1000):
            r.zadd("delayed", {i.to_bytes(8, "big") + payload: first_due + i * spread // total
                               for i in range(base, min(total, base + 1000))})  # fmt: skip
        publish_s = pc() - t0
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        stop_ms = first_due + spread + 3000
        # consumers start polling 1 s before the first due time, phases staggered by
        # poll/consumers, then each sleeps poll_ms after any poll that was not a full batch
        n = args.late_consumers
        procs = [ctx.Process(target=redis_lateness_consumer,
                             args=(server.port, args.poll_ms / 1000, 100, stop_ms,
                                   first_due - 1000 + i * args.poll_ms / n, q), daemon=True)
                 for i in range(n)]  # fmt: skip
        cpu0 = None
        for p in procs:
            p.start()
        while _common.now_ms() < first_due:
            time.sleep(0.01)
        cpu0 = cpu_seconds(server.pids)
        outs = [q.get(timeout=spread_s + 60) for _ in procs]
        cpu1 = cpu_seconds(server.pids)
        for p in procs:
            p.join(10)
        bad = [o for o in outs if "exception" in o]
        if bad:
            raise RuntimeError(bad)
        late = sorted(v for o in outs for v in o["late"])
        left = r.zcard("delayed")
        r.close()
    st = {
        "p50_ms": round(pct(late, 50), 2), "p90_ms": round(pct(late, 90), 2),
        "p99_ms": round(pct(late, 99), 2), "p999_ms": round(pct(late, 99.9), 2),
        "max_ms": round(late[-1], 2) if late else None, "min_ms": round(late[0], 2) if late else None,
        "early": sum(1 for v in late if v < 0),
    }  # fmt: skip
    return {
        "system": "redis_poll", "messages": total, "received": len(late), "left_in_zset": left,
        "consumer": st, "publish_s": round(publish_s, 3), "poll_ms": args.poll_ms,
        "consumers": args.late_consumers,
        "server_cpu_percent": round((cpu1 - cpu0) / (spread_s + 3) * 100, 1),
    }  # fmt: skip


def fq_lateness(args: argparse.Namespace) -> dict[str, Any]:
    ns = argparse.Namespace(
        messages=args.late_messages, spread_s=args.late_spread_s, lead_s=args.late_lead_s,
        gap_s=3.0, consumers=args.late_consumers, prefetch=1000, timeout_s=30.0, profile=False,
    )  # fmt: skip
    with _common.Server() as server:
        server.start()
        res = trio.run(lateness._run, ns, server)
    res["system"] = "fq1"
    return res


# ----------------------------------------------------------------------------- once-off


def run_bench_module(name: str, argv: list[str], timeout_s: float) -> dict[str, Any]:
    """``python -m bench.<name> ARGV`` in the repo; SIGTERM (its own cleanup) on timeout."""
    t0 = time.monotonic()
    la0 = loadavg()
    proc = subprocess.Popen([sys.executable, "-m", f"bench.{name}", *argv], cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    children: dict[int, float] = {}
    lines: list[str] = []
    timed_out = False
    import threading

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            print(f"  [{name}] {line.rstrip()}", flush=True)

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    while proc.poll() is None:
        record_children(proc.pid, children)
        if time.monotonic() - t0 > timeout_s:
            timed_out = True
            stop_pid(proc, 60)
            break
        time.sleep(0.5)
    proc.wait()
    th.join(10)
    time.sleep(0.5)
    kill_pids(children)
    result_file = REPO / "bench" / "results" / f"{name}.json"
    data = None
    if not timed_out and proc.returncode == 0 and result_file.exists():
        data = json.loads(result_file.read_text())
    return {"kind": name, "argv": argv, "rc": proc.returncode, "timed_out": timed_out,
            "wall_s": round(time.monotonic() - t0, 1), "load_start": la0, "load_end": loadavg(),
            "stdout_tail": lines[-80:], "results": data}  # fmt: skip


def run_profiles() -> dict[str, Any]:
    """py-spy profiles (FutureQ's own ``--profile`` flags) of the single node and of the
    3-node leader at batch 100, summarised with ``bench.profile_stacks`` (main thread)."""
    from bench import profile_stacks

    out: dict[str, Any] = {"kind": "profile", "load_start": loadavg()}
    jobs = [
        ("fq1", ["--batches", "100", "--profile", "--no-save"], "publish_throughput",
         "profile_publish_batch100.txt"),
        ("fq3_leader", ["--batches", "100", "--no-single", "--profile", "--no-save"],
         "cluster_throughput", "profile_cluster_leader_batch100.txt"),
    ]  # fmt: skip
    for label, argv, module, fname in jobs:
        e = run_bench_module(module, argv, 240)
        path = REPO / "bench" / "results" / fname
        text = profile_stacks.summarize(path, 12, "_run_module_as_main") if path.exists() else ""
        own, incl, which = [], [], None
        for line in text.splitlines():
            if line.startswith("Top") and "own" in line:
                which = own
            elif line.startswith("Top") and "inclusive" in line:
                which = incl
            elif which is not None and line.strip().endswith(")") and "%" in line:
                pct_text, _, name = line.strip().partition("%")
                which.append([float(pct_text), name.strip()])
        rate = next((ln for ln in e["stdout_tail"] if re.match(r"\s*(3 nodes\s+)?100\s", ln)), "")
        f = rate.replace("3 nodes", "").split()
        if len(f) >= 10 and label == "fq1":
            rate = f"{float(f[1]):,.0f} msgs/s, server CPU {f[8]} %"
        elif len(f) >= 10:
            rate = f"{float(f[1]):,.0f} msgs/s, CPU leader {f[7]} %, followers {f[8]} %"
        out[label] = {"rc": e["rc"], "result_line": rate.strip(), "samples": text.split(":")[1].split()[0]
                      if ": " in text.splitlines()[0] else None, "own": own, "inclusive": incl}  # fmt: skip
    out["load_end"] = loadavg()
    return out


def parse_memory_rows(lines: list[str]) -> list[dict[str, float]]:
    rows = []
    for line in lines:
        m = re.match(r"\s*(\d+)\s+([0-9.]+)\s+(-?[0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$", line)
        if m:
            rows.append({"pending": int(m[1]), "rss_mb": float(m[2]), "growth_mb": float(m[3]),
                         "publish_msgs_per_s": float(m[4]), "data_dir_mb": float(m[5])})  # fmt: skip
    return rows


# ----------------------------------------------------------------------------- summary


def spread(values: list[float]) -> dict[str, Any]:
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(v), 3), "min": round(min(v), 3),
            "max": round(max(v), 3), "n": len(v)}  # fmt: skip


RATIOS = [
    ("FutureQ-1 / Redis (pipelined ZADD)", "fq1", "redis"),
    ("FutureQ-1 2 shards / FutureQ-1", "fq1s2", "fq1"),
    ("FutureQ-1 2 shards / Redis (pipelined ZADD)", "fq1s2", "redis"),
    ("FutureQ-3 2 shards / FutureQ-3", "fq3s2", "fq3"),
    ("FutureQ-1 / Redis (multi-member ZADD)", "fq1", "redis_multi"),
    ("FutureQ-1 / RabbitMQ QQ", "fq1", "rabbit"),
    ("FutureQ-3 / RabbitMQ QQ", "fq3", "rabbit"),
    ("FutureQ-3 / RabbitMQ QQ 3 nodes", "fq3", "rabbit3"),
    ("RabbitMQ QQ 3 nodes / RabbitMQ QQ 1 node", "rabbit3", "rabbit"),
    ("FutureQ-3 / FutureQ-1", "fq3", "fq1"),
    ("FutureQ-3 / Redis (pipelined ZADD)", "fq3", "redis"),
]


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    tput = [r for r in records if r.get("kind") == "round"]
    by_sys: dict[str, dict[int, float]] = {}
    lat_by_sys: dict[str, list[float]] = {}
    lat_round: dict[str, list[dict[str, Any]]] = {}
    cpu: dict[str, list[float]] = {}
    gen: dict[str, list[float]] = {}
    for r in tput:
        by_sys.setdefault(r["system"], {})[f"{r['run_id']}/{r['round']}"] = r["msgs_per_s"]
        cpu.setdefault(r["system"], []).append(r["throughput"]["server_cpu_percent"])
        gen.setdefault(r["system"], []).append(r["throughput"]["loadgen_cpu_percent"])
        if "sync_latency" in r:
            lat_by_sys.setdefault(r["system"], []).extend(r.get("_lat_samples", []))
            lat_round.setdefault(r["system"], []).append(r["sync_latency"])
    out: dict[str, Any] = {"throughput": {}, "ratios": {}, "latency": {}}
    for s, rounds in by_sys.items():
        out["throughput"][s] = {**spread(list(rounds.values())), "rounds": rounds,
                                "server_cpu_percent": spread(cpu[s]),
                                "loadgen_cpu_percent": spread(gen[s])}  # fmt: skip
    for label, a, b in RATIOS:
        if a in by_sys and b in by_sys:
            common = sorted(set(by_sys[a]) & set(by_sys[b]))
            per_round = [by_sys[a][k] / by_sys[b][k] for k in common if by_sys[b][k]]
            med_a = statistics.median(by_sys[a].values())
            med_b = statistics.median(by_sys[b].values())
            out["ratios"][label] = {
                "ratio_of_medians": round(med_a / med_b, 3) if med_b else None,
                "per_round": [round(x, 3) for x in per_round],
                "per_round_spread": spread(per_round),
            }
    for s, rounds in lat_round.items():
        out["latency"][s] = {
            "per_round_p50": spread([x["p50_ms"] for x in rounds]),
            "per_round_p99": spread([x["p99_ms"] for x in rounds]),
            "samples": sum(x["n"] for x in rounds),
        }
        if lat_by_sys.get(s):
            out["latency"][s]["pooled_this_process"] = lat_stats(lat_by_sys[s])
    out["fq_internals"] = {}
    for s in ("fq1", "fq1s2", "fq3"):  # fq3s2: no one node's /metrics covers its leaders
        rs = [r["throughput"] for r in tput if r["system"] == s]
        if rs:
            out["fq_internals"][s] = {
                k: spread([x.get(k) for x in rs])
                for k in ("fsyncs_per_s", "fsync_ms_mean", "requests_per_fsync", "msgs_per_fsync",
                          "ack_latency_ms_p50", "ack_latency_ms_p99", "server_cpu_percent")
            }  # fmt: skip
            if s == "fq3":
                nodes: dict[str, list[float]] = {}
                for x in rs:
                    for name, v in sorted(x.get("node_cpu_percent", {}).items(),
                                          key=lambda kv: not kv[0].endswith("_leader")):  # fmt: skip
                        role = "leader" if name.endswith("_leader") else "follower"
                        nodes.setdefault(role, []).append(v)
                out["fq_internals"][s]["node_cpu_percent"] = {
                    k: spread(v) for k, v in nodes.items()
                }
    late = [r for r in records if r.get("kind") == "lateness"]
    out["lateness"] = {}
    for s in sorted({r["system"] for r in late}):
        rs = [r for r in late if r["system"] == s]
        out["lateness"][s] = {
            "consumer_p50": spread([r["consumer"]["p50_ms"] for r in rs]),
            "consumer_p99": spread([r["consumer"]["p99_ms"] for r in rs]),
            "consumer_max": spread([r["consumer"]["max_ms"] for r in rs]),
            "consumer_early": [r["consumer"]["early"] for r in rs],
            "server_p99": spread([r["server"]["p99_ms"] for r in rs])
            if "server" in rs[0]
            else None,
            "server_early": [r["server"]["early"] for r in rs] if "server" in rs[0] else None,
            "received": [r["received"] for r in rs],
        }
    loads = [x for r in records if r.get("kind") in ("round", "lateness")
             for x in (r["load_start"][0], r["load_end"][0])]  # fmt: skip
    out["load_1m"] = spread(loads)
    out["others_cpu_percent"] = spread([r["others_cpu_percent"] for r in records
                                        if r.get("kind") in ("round", "lateness")
                                        and "others_cpu_percent" in r])  # fmt: skip
    return out


NAMES = {
    "fq1": "FutureQ, 1 node (ack after fsync)",
    "fq1s2": "FutureQ, 1 node x 2 shards (ack after fsync)",
    "fq3": "FutureQ, 3 nodes (ack at quorum on disk)",
    "fq3s2": "FutureQ, 3 nodes x 2 shards, leaders balanced (ack at quorum on disk)",
    "redis": "Redis 7, AOF fsync always, 100 pipelined ZADDs",
    "redis_multi": "Redis 7, AOF fsync always, ZADD of 100 pairs",
    "rabbit": "RabbitMQ 3.10 quorum queue (1 node), confirms",
    "rabbit3": "RabbitMQ 3.10 quorum queue (3-node cluster), confirms",
    "redis_poll": "Redis ZSET, 10 ms Lua poll (4 consumers)",
}


def fmt(x: Any, nd: int = 0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{nd}f}"


def write_md(path: Path, headers: list[dict[str, Any]], summary: dict[str, Any],
             extras: list[dict[str, Any]]) -> None:  # fmt: skip
    header = headers[0]
    systems: list[str] = []
    for h in headers:
        systems += [x for x in h["systems"] if x not in systems]
    L: list[str] = []
    L.append("# FutureQ side by side (same machine, interleaved rounds)\n")
    L.append(
        f"{len(headers)} run(s) pooled, {header['cpus']} CPUs, FutureQ commit {header.get('futureq_commit', '?')}; "
        "raw records in `side_by_side.jsonl` (by run_id). Every measurement on a fresh, empty server; "
        "rounds interleaved system by system:\n"
    )
    for h in headers:
        argv = " ".join(os.path.basename(a) if a.startswith("/") else a for a in h["argv"])
        what = (
            f"{' → '.join(h['systems'])} × {h['rounds']} rounds, {h['warmup']} s warm-up + "
            f"{h['seconds']} s measured"
            if h["rounds"]
            else "no rounds (once-off extras only)"
        )
        L.append(
            f"* run {h['run_id']} ({h['when']}): `python side_by_side.py {argv}`; {what}; "
            f"1-min load before it {h['load_before'][0]} (waited {h['waited_s']} s for < 1.0)"
        )
    L.append("")
    ld = summary["load_1m"]
    L.append(
        f"1-minute load average at the start/end of every measurement: median "
        f"{fmt(ld['median'], 2)}, range {fmt(ld['min'], 2)}–{fmt(ld['max'], 2)}. It counts this "
        "benchmark's own server(s) and load generator too (a saturated run adds ~2)."
    )
    oc = summary.get("others_cpu_percent") or {}
    if oc.get("n"):
        L.append(
            f"CPU used outside this benchmark's processes during each measurement (machine busy "
            f"time minus ours, % of one core; {oc['n']} measurements that recorded it; includes kernel "
            f"threads doing our disk I/O): median {fmt(oc['median'], 1)}, max {fmt(oc['max'], 1)}."
        )
    L.append("")
    L.append(
        "## Durable publish throughput (4 connections, 100 msgs per request, 100-byte payloads)\n"
    )
    L.append(
        "| system | median msgs/s | min–max | rounds | server CPU % (median) | load-gen CPU % |"
    )
    L.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for s in systems:
        t = summary["throughput"].get(s)
        if not t:
            continue
        L.append(
            f"| {NAMES.get(s, s)} | {fmt(t['median'])} | {fmt(t['min'])}–{fmt(t['max'])} | {t['n']} | "
            f"{fmt(t['server_cpu_percent']['median'])} | {fmt(t['loadgen_cpu_percent']['median'])} |"
        )
    L.append("")
    L.append(
        "| ratio | of medians | median of same-round ratios (min–max) | same-round ratios, in run order |"
    )
    L.append("| --- | ---: | ---: | --- |")
    for label, r in summary["ratios"].items():
        pr = r["per_round_spread"]
        L.append(
            f"| {label} | **{fmt(r['ratio_of_medians'], 2)}** | {fmt(pr['median'], 2)} "
            f"({fmt(pr['min'], 2)}–{fmt(pr['max'], 2)}) | {', '.join(f'{x:.2f}' for x in r['per_round'])} |"
        )
    L.append("")
    if summary.get("fq_internals"):
        L.append(
            "FutureQ during those runs (medians; leader's /metrics for 3 nodes, the node's "
            "merged /metrics of both shards for fq1s2):\n"
        )
        L.append(
            "| | fsyncs/s | fsync ms (mean) | requests / fsync | PUBLISH_OK p50 / p99 ms | CPU % |"
        )
        L.append("| --- | ---: | ---: | ---: | ---: | --- |")
        for s, t in summary["fq_internals"].items():
            cpu = f"{fmt(t['server_cpu_percent']['median'])}"
            if "node_cpu_percent" in t:
                cpu += (
                    " (leader "
                    + fmt(t["node_cpu_percent"].get("leader", {}).get("median"))
                    + ", each follower "
                    + fmt(t["node_cpu_percent"].get("follower", {}).get("median"))
                    + ")"
                )
            L.append(
                f"| {s} | {fmt(t['fsyncs_per_s']['median'])} | {fmt(t['fsync_ms_mean']['median'], 1)} | "
                f"{fmt(t['requests_per_fsync']['median'], 1)} | {fmt(t['ack_latency_ms_p50']['median'])} / "
                f"{fmt(t['ack_latency_ms_p99']['median'])} | {cpu} |"
            )
        L.append("")
    L.append("## Synchronous publish latency (one request in flight, 1 message, durable ack)\n")
    L.append(
        "| system | p50 ms: median of rounds (min–max) | p99 ms: median of rounds (min–max) | samples |"
    )
    L.append("| --- | ---: | ---: | ---: |")
    for s in systems:
        t = summary["latency"].get(s)
        if not t:
            continue
        a, b = t["per_round_p50"], t["per_round_p99"]
        L.append(
            f"| {NAMES.get(s, s)} | {fmt(a['median'], 2)} ({fmt(a['min'], 2)}–{fmt(a['max'], 2)}) | "
            f"{fmt(b['median'], 2)} ({fmt(b['min'], 2)}–{fmt(b['max'], 2)}) | {t['samples']:,} |"
        )
    L.append("")
    if summary["lateness"]:
        L.append(
            f"## Due-to-delivery lateness ({header['late_messages']:,} messages due over "
            f"{header['late_spread_s']:g} s, {header['late_consumers']} consumers)\n"
        )
        L.append(
            "| system | consumer p50 ms | consumer p99 ms | max ms | early (consumer) | server p99 ms | early (server) | received |"
        )
        L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for s, t in summary["lateness"].items():
            sp = t["server_p99"]
            L.append(
                f"| {NAMES.get(s, s)} | {fmt(t['consumer_p50']['median'], 2)} "
                f"({fmt(t['consumer_p50']['min'], 2)}–{fmt(t['consumer_p50']['max'], 2)}) | "
                f"{fmt(t['consumer_p99']['median'], 2)} ({fmt(t['consumer_p99']['min'], 2)}–"
                f"{fmt(t['consumer_p99']['max'], 2)}) | {fmt(t['consumer_max']['median'], 1)} | "
                f"{t['consumer_early']} | {fmt(sp['median'], 2) if sp else '-'} | "
                f"{t['server_early'] if t['server_early'] is not None else '-'} | {t['received']} |"
            )
        L.append("")
    for e in extras:
        if e["kind"] == "memory":
            L.append("## Memory (`python -m bench.memory " + " ".join(e["argv"]) + "`, run once)\n")
            L.append(
                f"rc {e['rc']}, timed out: {e['timed_out']}, wall {e['wall_s']} s, load "
                f"{e['load_start'][0]} → {e['load_end'][0]}.\n"
            )
            L.append("| pending | RSS MB | growth MB | publish msgs/s | data dir MB |")
            L.append("| ---: | ---: | ---: | ---: | ---: |")
            for row in e.get("rows", []):
                L.append(
                    f"| {row['pending']:,} | {row['rss_mb']} | {row['growth_mb']} | "
                    f"{fmt(row['publish_msgs_per_s'])} | {row['data_dir_mb']} |"
                )
            L.append("")
        if e["kind"] == "restart":
            L.append(
                "## Restart (`python -m bench.restart " + " ".join(e["argv"]) + "`, run once)\n"
            )
            L.append(
                f"rc {e['rc']}, wall {e['wall_s']} s, load {e['load_start'][0]} → {e['load_end'][0]}.\n"
            )
            for line in e.get("stdout_tail", [])[-12:]:
                if line.strip() and "results written" not in line:
                    L.append("    " + line)
            L.append("")
    for e in extras:
        if e["kind"] == "profile":
            L.append(
                "## Where FutureQ spends its time (py-spy, main thread, batch 100; separate, profiled runs)\n"
            )
            for label, title in (("fq1", "1 node"), ("fq3_leader", "3-node leader")):
                p = e.get(label)
                if not p:
                    continue
                L.append(
                    f"{title}: `{p['result_line']}` ({p['samples']} samples). Own time: "
                    + "; ".join(f"{v:.0f} % {n.split(' (')[0]}" for v, n in p["own"][:8])
                    + ". Inclusive: "
                    + "; ".join(f"{v:.0f} % {n.split(' (')[0]}" for v, n in p["inclusive"][3:9])
                    + ".\n"
                )
    L.append("## Notes\n")
    for n in headers[-1]["notes"]:
        n = n.replace(
            "p50/p99 pooled over all rounds.",
            "p50 and p99 per round, then the median (min–max) of the rounds.",
        )
        L.append(f"* {n}")
    path.write_text("\n".join(L) + "\n")


# ----------------------------------------------------------------------------- main


def wait_for_load(
    limit: float, max_min: float, poll_s: float
) -> tuple[float, list[dict[str, Any]]]:
    t0 = time.monotonic()
    log = []
    while True:
        la = loadavg()
        log.append({"t_s": round(time.monotonic() - t0), "load": la})
        print(f"load {la} (waiting for 1-min < {limit})", flush=True)
        if la[0] < limit or time.monotonic() - t0 >= max_min * 60:
            return time.monotonic() - t0, log
        print("  " + "\n  ".join(top_processes(5)), flush=True)
        time.sleep(poll_s)


PEER_SERVERS = {
    "redis": ("redis-server",),
    "redis_multi": ("redis-server",),
    "rabbit": ("rabbitmq-server", "epmd"),
    "rabbit3": ("rabbitmq-server", "epmd"),
}
"""The executables each peer system needs (looked up on PATH and in /usr/sbin)."""


def _installed(executable: str) -> bool:
    return shutil.which(executable) is not None or Path("/usr/sbin", executable).exists()


def available_systems(systems: list[str]) -> tuple[list[str], list[str]]:
    """``(runnable, sentences)``: the systems whose servers are installed, and one
    sentence per skipped peer saying what to install."""
    runnable: list[str] = []
    notes: list[str] = []
    for system in systems:
        missing = [exe for exe in PEER_SERVERS.get(system, ()) if not _installed(exe)]
        if missing:
            notes.append(
                f"{system} skipped: {', '.join(missing)} is not installed "
                "(apt-get install -y redis-server rabbitmq-server)"
            )
        else:
            runnable.append(system)
    return runnable, notes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, write ``--out``/``--md``, print the ratios; returns the summary."""

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--lat-seconds", type=float, default=4.0)
    ap.add_argument("--lat-warmup", type=float, default=0.5)
    ap.add_argument("--systems", default="fq1,redis,rabbit,fq3,redis_multi,rabbit3")
    ap.add_argument(
        "--fq-window", type=int, default=None, help="FutureQ requests in flight per conn"
    )
    ap.add_argument(
        "--redis-window", type=int, default=32, help="100-ZADD chunks in flight per conn"
    )
    ap.add_argument(
        "--redis-multi-window",
        type=int,
        default=8,
        help="100-pair ZADDs in flight per conn (redis_multi)",
    )
    ap.add_argument("--rabbit-window", type=int, default=1000)
    ap.add_argument(
        "--rabbit-erl-args",
        default="",
        help="RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS, e.g. '+sbwt none' (default: none)",
    )
    ap.add_argument("--lateness-rounds", type=int, default=2)
    ap.add_argument("--late-messages", type=int, default=20_000)
    ap.add_argument("--late-spread-s", type=float, default=10.0)
    ap.add_argument("--late-lead-s", type=float, default=5.0)
    ap.add_argument("--late-consumers", type=int, default=4)
    ap.add_argument("--poll-ms", type=float, default=10.0)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument(
        "--memory-args", default="--levels 0,1000000,5000000,10000000 --max-messages 10000000"
    )
    ap.add_argument("--memory-timeout-s", type=float, default=420)
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--restart-args", default="")
    ap.add_argument("--restart-timeout-s", type=float, default=300)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="py-spy profile FutureQ 1 node and the 3-node leader at batch 100 (not measured)",
    )
    ap.add_argument("--wait-load", type=float, default=None)
    ap.add_argument("--wait-max-min", type=float, default=45)
    ap.add_argument("--wait-poll-s", type=float, default=120)
    ap.add_argument("--out", default=str(HERE / "results" / "side_by_side.jsonl"))
    ap.add_argument("--md", default=str(HERE / "results" / "side_by_side.md"))
    ap.add_argument(
        "--report-only",
        default=None,
        metavar="RUN_ID[,RUN_ID...]",
        help="measure nothing: write --md from these runs' records in --out (pooled)",
    )
    args = ap.parse_args(argv)
    if args.report_only:
        wanted = args.report_only.split(",")
        recs = [
            json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()
        ]
        recs = [r for r in recs if r.get("run_id") in wanted and r.get("kind") != "summary"]
        headers = sorted((r for r in recs if r["kind"] == "header"), key=lambda r: r["run_id"])
        extras = [r for r in recs if r["kind"] in ("memory", "restart", "profile")]
        write_md(Path(args.md), headers, summarize(recs), extras)
        print(f"wrote {args.md} from {len(recs)} records of {len(headers)} run(s)")
        return summarize(recs)
    systems, skipped = available_systems([s for s in args.systems.split(",") if s])
    if args.lateness_rounds and any(s in SHARDED for s in systems):
        skipped.append(
            "lateness runs fq1 (one shard) against Redis polling only: a topic lives on one "
            "shard, so a sharded node's lateness is one shard's, which fq1 measures"
        )
    for sentence in skipped:
        print(sentence, flush=True)
    if args.lateness_rounds and not (_installed("redis-server") and _redis_client_installed()):
        print(
            "Redis lateness skipped: redis-server or the redis Python package is not installed",
            flush=True,
        )
        args.lateness_rounds = 0
    global RABBIT_ERL_ARGS
    RABBIT_ERL_ARGS = args.rabbit_erl_args
    run_id = time.strftime("%Y%m%dT%H%M%S")
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    extras: list[dict[str, Any]] = []

    def emit(rec: dict[str, Any]) -> None:
        rec = {"run_id": run_id, **rec}
        records.append(rec)
        clean = {k: v for k, v in rec.items() if not k.startswith("_")}
        with out_path.open("a") as f:
            f.write(json.dumps(clean) + "\n")

    waited_s, wait_log = 0.0, []
    if args.wait_load is not None:
        waited_s, wait_log = wait_for_load(args.wait_load, args.wait_max_min, args.wait_poll_s)
    header = {
        "kind": "header",
        "run_id": run_id,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "argv": sys.argv[1:],
        "systems": systems,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "lat_seconds": args.lat_seconds,
        "load_before": loadavg(),
        "waited_s": round(waited_s),
        "wait_log": wait_log,
        "top_before": top_processes(6),
        "late_messages": args.late_messages,
        "late_spread_s": args.late_spread_s,
        "late_consumers": args.late_consumers,
        "python": sys.version.split()[0],
        "futureq_commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "notes": [
            "Each system runs alone (previous one stopped) and is started fresh, empty, per measurement; "
            "load generator, server(s) and disk are shared on the same 2-core machine.",
            "FutureQ load: bench.publish_throughput._load (one trio process, 4 connections, pre-encoded "
            "PUBLISH frames of 100 items, 200 requests in flight per connection unless --fq-window); "
            f"connection i publishes topic {TOPICS[0]} or {TOPICS[1]} (i % 2; one per shard of a "
            "2-shard node), sent where the node's SLOT_MAP answer routes it: the node (fq1), the "
            "leader (fq3), the owning shard (fq1s2) or that shard's leader (fq3s2, measured once "
            "every shard is led by its preferred node: bench.shards.wait_balanced). Server CPU of "
            "a sharded node: its supervisor and shard processes.",
            f"Redis: 4 processes, raw RESP, {args.redis_window} chunks of 100 ZADDs (redis) or "
            f"{args.redis_multi_window} 100-pair ZADDs (redis_multi) in flight per connection (the best of "
            "2/8/32 in a scan just before the run); "
            "appendfsync always replies after the AOF write+fsync of each event-loop iteration "
            "(group commit across clients); AOF rewrite disabled so no fork during the 5 s.",
            f"RabbitMQ: 4 processes, raw AMQP 0-9-1 (publishes pre-encoded, written 100 at a time, "
            f"≤ {args.rabbit_window} unconfirmed per connection), persistent messages to one durable quorum "
            "queue on ONE node (a 1-member Raft group: fsync on one node only); x-delayed-message is not "
            "available and would not be a quorum queue anyway, so this is a plain queue, no delay.",
            "FutureQ 3 nodes share the same disk and 2 cores as their load generator. 'RabbitMQ QQ' (rabbit) is "
            "ONE node, so FutureQ-3 / RabbitMQ QQ compares 3 durable copies with 1; rabbit3 is a 3-node RabbitMQ "
            "cluster (classic-config peer discovery, queue declared on node 1, which leads it; 3 members checked "
            "with rabbitmqctl list_queues; clients connect to node 1), the like-for-like peer of FutureQ-3. "
            "Erlang VMs run with their default scheduler busy-waiting"
            + (f" except: {args.rabbit_erl_args}" if args.rabbit_erl_args else "")
            + ".",
            "Sync latency: one connection, one request in flight, 1 message each, measured on the fresh server "
            "before its throughput run; p50 and p99 per round, then the median (min–max) of the rounds.",
            "Redis lateness: the ZSET score is the due ms; 4 consumer processes each run a Lua "
            "ZRANGEBYSCORE(-inf, now) LIMIT 100 + ZREM (claim = removal, at-most-once; no separate ack; the ZREM "
            "is fsynced: appendfsync always) and sleep 10 ms when they got less than a full batch; their start "
            f"phases are staggered by poll/consumers = {args.poll_ms / args.late_consumers:g} ms, but they fall "
            "into step through Redis's shared event-loop fsync (checked separately: polls bunched within ~0.4 ms, "
            "each consumer every ~12.5 ms, claim ~2 ms), so in effect the set polls every ~12.5 ms and lateness "
            "is about uniform over the poll period plus the claim; lateness = client wall time after the reply "
            "- due. FutureQ: bench.lateness (push, prefetch 1000, acks every 200).",
            *skipped,
        ],
    }
    emit(header)
    print(f"run {run_id}; load {header['load_before']}", flush=True)
    try:
        for rnd in range(1, args.rounds + 1):
            for system in systems:
                la0 = loadavg()
                snap = cpu_snapshot()
                rec = measure(system, args)
                rec.update(
                    {
                        "kind": "round",
                        "round": rnd,
                        "load_start": la0,
                        "load_end": loadavg(),
                        "others_cpu_percent": others_cpu_percent(snap, cpu_snapshot()),
                    }
                )
                emit(rec)
                lat = rec.get("sync_latency") or {}
                print(f"round {rnd} {system:<12} {rec['msgs_per_s']:>10,.0f} msgs/s  start "
                      f"{rec['start_s']} s  srv cpu "
                      f"{rec['throughput']['server_cpu_percent']:>5}%  gen cpu "
                      f"{rec['throughput']['loadgen_cpu_percent']:>5}%  sync p50/p99 "
                      f"{lat.get('p50_ms', '-')}/{lat.get('p99_ms', '-')} ms  load "
                      f"{la0[0]}→{rec['load_end'][0]}  others cpu {rec['others_cpu_percent']}%  err "
                      f"{rec['throughput'].get('errors', 0)}",
                      flush=True)  # fmt: skip
        for rnd in range(1, args.lateness_rounds + 1):
            for which in ("fq1", "redis_poll"):
                la0 = loadavg()
                snap = cpu_snapshot()
                res = fq_lateness(args) if which == "fq1" else redis_lateness(args)
                res.update(
                    {
                        "kind": "lateness",
                        "round": rnd,
                        "load_start": la0,
                        "load_end": loadavg(),
                        "others_cpu_percent": others_cpu_percent(snap, cpu_snapshot()),
                    }
                )
                emit(res)
                c = res["consumer"]
                print(f"lateness {rnd} {which:<10} consumer p50 {c['p50_ms']} p99 {c['p99_ms']} max "
                      f"{c['max_ms']} early {c['early']}; received {res['received']}; load "
                      f"{la0[0]}→{res['load_end'][0]}", flush=True)  # fmt: skip
        if args.memory:
            e = run_bench_module("memory", args.memory_args.split(), args.memory_timeout_s)
            e["rows"] = parse_memory_rows(e["stdout_tail"])
            if e["results"]:
                e["rows"] = sorted(({k: v for k, v in row.items() if k != "readings_mb"}
                                    for row in e["results"]["levels"].values()),
                                   key=lambda row: row["pending"])  # fmt: skip
            extras.append(e)
            emit(e)
        if args.restart:
            e = run_bench_module("restart", args.restart_args.split(), args.restart_timeout_s)
            extras.append(e)
            emit(e)
        if args.profile:
            e = run_profiles()
            extras.append(e)
            emit(e)
    finally:
        summary = summarize(records)
        emit({"kind": "summary", **summary})
        write_md(Path(args.md), [header], summary, extras)
        print(json.dumps(summary["ratios"], indent=1))
        for line in ratio_lines(summary):
            print(line, flush=True)
    summary["skipped"] = skipped
    return summary


BENCH_SYSTEMS = "fq1,fq1s2,redis,fq3,fq3s2,rabbit3"


def bench_main(argv: list[str] | None = None) -> dict[str, Any]:
    """``make bench``'s entry (``bench.run_all``): ``--quick`` runs one short round
    without lateness; otherwise two rounds and one lateness round. Other options are
    those of :func:`main`."""
    rest = [a for a in (argv or []) if a not in ("--quick", "--compare")]
    if "--quick" in (argv or []):
        preset = ["--rounds", "1", "--seconds", "3", "--lat-seconds", "2", "--lateness-rounds", "0"]
    else:
        preset = ["--rounds", "2", "--lateness-rounds", "1"]
    return main(["--systems", BENCH_SYSTEMS, *preset, *rest])


TARGETS = {
    "FutureQ-1 / Redis (pipelined ZADD)": ">= 1",
    "FutureQ-3 / FutureQ-1": ">= 0.7",
    "FutureQ-1 2 shards / FutureQ-1": ">= 1.7",  # issue 15
    "FutureQ-1 2 shards / Redis (pipelined ZADD)": "> 1",  # issue 15
    "FutureQ-3 2 shards / FutureQ-3": ">= 1.3",  # issue 15
}
"""Target of each throughput ratio that has one (ratio of the medians)."""


def ratio_lines(summary: dict[str, Any]) -> list[str]:
    """One line per throughput ratio: of the medians, the same-round ratios, the target."""
    return [
        f"ratio {label}: {fmt(r['ratio_of_medians'], 3)} (same rounds: "
        f"{', '.join(f'{x:.3f}' for x in r['per_round'])})"
        + (f"; target {TARGETS[label]}" if label in TARGETS else "")
        for label, r in summary.get("ratios", {}).items()
    ]


def summary_rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(benchmark, figure, value, target)`` rows for ``bench.run_all``."""
    name = "side_by_side"
    rows: list[tuple[str, str, str, str]] = [
        (name, sentence, "", "") for sentence in r.get("skipped", [])
    ]
    for label, ratio in r.get("ratios", {}).items():
        rows.append(
            (
                name,
                f"msgs/s, batch 100: {label}",
                fmt(ratio["ratio_of_medians"], 2),
                TARGETS.get(label, ""),
            )
        )
    latency = r.get("latency", {})
    for system in sorted(latency):
        lat = latency[system]
        rows.append(
            (
                name,
                f"{system}: one publish in flight p50 / p99 ms",
                f"{fmt(lat['per_round_p50']['median'], 2)} / {fmt(lat['per_round_p99']['median'], 2)}",
                "",
            )
        )
    for a, b, target in (("fq3", "rabbit3", "<= 1"), ("fq1", "rabbit", "<= 1")):
        if a in latency and b in latency:
            pa, pb = latency[a]["per_round_p50"]["median"], latency[b]["per_round_p50"]["median"]
            if pa and pb:
                rows.append((name, f"one in flight p50: {a} / {b}", fmt(pa / pb, 2), target))
    for system, late in sorted(r.get("lateness", {}).items()):
        rows.append(
            (name, f"{system}: lateness p99 ms", fmt(late["consumer_p99"]["median"], 1), "")
        )
    return rows


def _redis_client_installed() -> bool:
    try:
        import redis  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
