"""Port 0 on a node without peers: the supervisor binds every shard's ports itself
(``docs/sharding.md``, "Port 0"). Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket

from futureq.config_loader import load_config
from futureq.shards.supervisor import bind_ports, fix_os_chosen_ports


def test_bind_ports_holds_a_run_one_stride_apart_and_skips_a_taken_one() -> None:
    run = bind_ports("127.0.0.1:0", 3, 7, 16)
    try:
        ports = [sock.getsockname()[1] for sock in run]
        assert ports == [ports[0], ports[0] + 7, ports[0] + 14]
        for port in ports:  # listening already: a client connects before any shard runs
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        # Another run while this one is held never reuses its ports.
        other = bind_ports("127.0.0.1:0", 3, 7, 16)
        try:
            assert not {s.getsockname()[1] for s in other} & set(ports)
        finally:
            for sock in other:
                sock.close()
    finally:
        for sock in run:
            sock.close()


def test_fix_os_chosen_ports_fixes_the_config_and_the_shards_command() -> None:
    config = load_config(
        None,
        env={},
        overrides={
            "server": {"listen": "127.0.0.1:0", "http": "127.0.0.1:0"},
            "node": {"shards": 2, "shard_port_stride": 5},
        },
    )
    fixed, command, sockets = fix_os_chosen_ports(config, ["futureq", "start", "--listen", ":0"])
    try:
        client = sockets[0]["client"].getsockname()[1]
        http = sockets[0]["http"].getsockname()[1]
        assert fixed.server.listen == f"127.0.0.1:{client}"
        assert fixed.server.http == f"127.0.0.1:{http}"
        assert sockets[1]["client"].getsockname()[1] == client + 5
        assert sockets[1]["http"].getsockname()[1] == http + 5
        # The last flag wins in every shard's command line: the fixed ports.
        assert command[-4:] == ["--listen", f"127.0.0.1:{client}", "--http", f"127.0.0.1:{http}"]
    finally:
        for held in sockets.values():
            for sock in held.values():
                sock.close()
    # Fixed ports: nothing bound, nothing changed.
    given = load_config(
        None, env={}, overrides={"server": {"listen": "127.0.0.1:17450"}, "node": {"shards": 2}}
    )
    assert fix_os_chosen_ports(given, ["x"]) == (given, ["x"], {})
