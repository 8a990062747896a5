"""``futureq-cli``: publish, consume and inspect a FutureQ cluster from the shell.

::

    futureq-cli [--server HOST:PORT[,...]] [--tls-ca FILE] [--token T]
                [--request-timeout D] COMMAND

    publish TOPIC PAYLOAD [--delay D | --at TIME] [--ttl D]     print the message id
    publish TOPIC - [...]                                        payload bytes from stdin
    publish TOPIC --payload-file F [...]                         binary payload
    publish --file batch.jsonl [--batch-size N]                  JSON lines, with a summary
    consume TOPIC --group G [--count N] [--json] [--no-ack | --nack [--requeue-delay D]]
                  [--prefetch N] [--idle-timeout D]
    status [--json] [--local]   the cluster's topics and groups (asked of the leader)
    group create TOPIC GROUP [--visibility-timeout D] [--max-deliveries N]
    group delete TOPIC GROUP
    group list [--json]
    topic list [--json]
    cluster status [--json] [--local]
    cluster add-node NODE_ID RAFT_HOST:PORT CLIENT_HOST:PORT
    cluster remove-node NODE_ID
    cluster transfer-leader [NODE_ID]
    completion bash|zsh|tcsh

Durations are ``250ms``, ``5s``, ``10m``, ``2h``, ``3d``, ``1h30m`` or bare milliseconds
(:mod:`futureq.cli.durations`); JSON lines and ``consume --json`` in
:mod:`futureq.cli.jsonl`. Exit status: 0 success (also when ``consume`` stops
at ``--count`` or ``--idle-timeout``, unless its connection was lost), 1 any error or
any failed line, 2 usage error,
130 interrupted. Errors are one line on stderr: ``error: [CODE_NAME] sentence``.
Every command and flag is described in ``docs/cli.md``.

This module is the entry point (:func:`main`, :func:`run_command`); the parser is in
:mod:`futureq.cli.client_parser`, the commands in :mod:`futureq.cli.publish_commands`,
:mod:`futureq.cli.consume_command`, :mod:`futureq.cli.admin_commands` and
:mod:`futureq.cli.manage_commands`.
"""

from __future__ import annotations

import argparse
import binascii
import os
import ssl
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any

import shtab
import trio

from futureq.cli import manage_commands
from futureq.cli.admin_commands import run_cluster, run_group, run_status, run_topic
from futureq.cli.argv_text import not_text
from futureq.cli.client_arguments import MAX_BATCH_SIZE, check_servers
from futureq.cli.client_parser import (
    DEFAULT_SERVER,
    SERVER_ENV,
    TOKEN_ENV,
    build_parser,
    check_publish_args,
    deprecation_warnings,
)
from futureq.cli.consume_command import run_consume
from futureq.cli.output import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Output, error_line
from futureq.cli.publish_commands import run_publish_file, run_publish_one
from futureq.client import Client, open_client
from futureq.errors import FutureQError


def _ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context of ``--tls-ca`` / ``--tls``, or None for plaintext.

    Raises:
        ValueError: the ``--tls-ca`` file cannot be read or holds no PEM certificate;
            the message names the flag, the file and what to give instead.
    """
    if (args.tls_cert is not None or args.tls_key is not None) and not (
        args.tls or args.tls_ca is not None
    ):
        raise ValueError(
            "--tls-cert/--tls-key present a client certificate over TLS; add --tls-ca FILE "
            "(or --tls) to use TLS"
        )
    if args.tls_key is not None and args.tls_cert is None:
        raise ValueError("--tls-key is the key of --tls-cert; give --tls-cert FILE too")
    context = _trusting_context(args)
    if context is not None and args.tls_cert is not None:
        try:
            context.load_cert_chain(args.tls_cert, args.tls_key)
        except ssl.SSLError as exc:
            raise ValueError(
                f"--tls-cert {args.tls_cert!r}"
                + (f" / --tls-key {args.tls_key!r}" if args.tls_key else "")
                + ": not a PEM certificate and its matching private key"
                + (f" ({exc.reason})" if exc.reason else "")
                + "; give the certificate (and its key, in the file or with --tls-key)"
            ) from None
        except OSError as exc:
            raise ValueError(
                f"--tls-cert/--tls-key: {exc.filename or args.tls_cert!r} cannot be read: "
                f"{(exc.strerror or str(exc)).lower()}"
            ) from None
    return context


def _trusting_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if args.tls_ca is not None:
        try:
            return ssl.create_default_context(cafile=args.tls_ca)
        except ssl.SSLError as exc:
            raise ValueError(
                f"--tls-ca {args.tls_ca!r}: holds no CA certificate OpenSSL can read "
                f"({exc.reason or exc}); give a PEM file of CA certificates "
                "(-----BEGIN CERTIFICATE-----)"
            ) from None
        except OSError as exc:
            raise ValueError(
                f"--tls-ca {args.tls_ca!r}: cannot be read: "
                f"{(exc.strerror or str(exc)).lower()}; give a PEM file of CA certificates"
            ) from None
    if args.tls:
        return ssl.create_default_context()
    return None


async def run_command(args: argparse.Namespace, io: Output) -> int:
    """Connect and run the parsed command.

    Returns:
        The exit status.

    Raises:
        FutureQError, OSError: reported by :func:`main` as one ``error:`` line.
    """
    handlers: dict[str, Callable[[Client, argparse.Namespace, Output], Any]] = {
        "publish": run_publish_file if args.command == "publish" and args.file else run_publish_one,
        "consume": run_consume,
        "status": run_status,
        "group": run_group,
        "topic": run_topic,
        "cluster": run_cluster,
        "cancel": manage_commands.run_cancel,
        "browse": manage_commands.run_browse,
        "reschedule": manage_commands.run_reschedule,
        "purge": manage_commands.run_purge,
        "dlq": manage_commands.run_dlq,
    }
    timeout_s = args.request_timeout_ms / 1000
    async with open_client(
        args.server,
        ssl_context=args.ssl_context,
        token=args.token,
        connect_timeout_s=min(5.0, timeout_s),
        request_timeout_s=timeout_s,
        max_batch_items=MAX_BATCH_SIZE,
        # Below the deadline, which the client requires: `--request-timeout 1ms` (a
        # deadline the parser takes) ended in a ValueError traceback, the library's
        # default linger being 1 ms too.
        linger_ms=min(LINGER_MS, args.request_timeout_ms / 2),
    ) as client:
        result: int = await handlers[args.command](client, args, io)
        return result


LINGER_MS = 1.0
"""How long a publish waits for more to send with it (ms; the client's default), or half
the request deadline if that is shorter."""


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    stdin: IO[bytes] | None = None,
) -> int:
    """Entry point of ``futureq-cli``.

    Args:
        argv: Arguments without the program name (default ``sys.argv[1:]``).
        stdout: Where results go (default ``sys.stdout``).
        stderr: Where errors go (default ``sys.stderr``).
        stdin: Where ``publish TOPIC -`` reads (default ``sys.stdin.buffer``).

    Returns:
        The exit status (also used by ``sys.exit`` when run as a script): 0 ok,
        1 error, 2 usage error, 130 interrupted.
    """
    stderr_closed = stderr is None and sys.stderr is None
    if sys.stderr is None:
        # Started with stderr closed (`2>&-`): what goes there is dropped, and the exit
        # status still tells. Without a stream argparse printed its usage on stdout,
        # among the results; and descriptor 2, free, could be taken by the broker's
        # socket, where a stray write to "stderr" would land. /dev/null takes it.
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the process's stderr till exit
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if args.command == "publish":
            check_publish_args(parser, args)
        if args.command == "consume" and args.requeue_delay is not None and not args.nack:
            parser.error(
                "argument --requeue-delay: only with --nack (it says when a nacked "
                "message comes back); add --nack or drop --requeue-delay"
            )
        if args.command != "completion":
            try:
                check_servers(args.server)
            except ValueError as exc:
                source = (
                    "--server"
                    if getattr(args, "server_from_flag", False) or not os.environ.get(SERVER_ENV)
                    else f"${SERVER_ENV}"
                )
                parser.error(
                    f"{source}: {exc}; give HOST:PORT[,HOST:PORT...], e.g. {DEFAULT_SERVER}"
                )
            try:
                args.ssl_context = _ssl_context(args)
            except ValueError as exc:
                parser.error(str(exc))
            problem = None if args.token is None else not_text(args.token)
            if problem is not None:
                source = "--token" if getattr(args, "token_from_flag", False) else f"${TOKEN_ENV}"
                parser.error(f"{source}: the token {problem}; a token is text (docs/security.md)")
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    out = stdout or sys.stdout
    if out is None:  # started with stdout closed (`>&-`): an AttributeError traceback
        if sys.stderr is not None:
            sys.stderr.write(
                "error: [OS_ERROR] standard output is closed: results would be lost; "
                "redirect it (> /dev/null drops them)\n"
            )
        return EXIT_ERROR
    io = Output(out, None if stderr_closed else stderr or sys.stderr, stdin)
    for warning in deprecation_warnings(args):
        io.err(warning)
    try:
        if args.command == "completion":
            io.out(shtab.complete(parser, shell=args.shell).removesuffix("\n"))
            return EXIT_OK
        if args.command == "purge":
            # Its prompt waits on the terminal: a Ctrl-C there is an answer too (it
            # printed a KeyboardInterrupt traceback, found by a tester).
            refused = manage_commands.confirm_purge(args, sys.stdin, io)
            if refused is not None:
                return refused
        return trio.run(run_command, args, io)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`| head -1`): a quiet end, as docs/cli.md says. What
        # the stream still buffers can never be written: without this, Python's own
        # flush at exit printed "Exception ignored ... BrokenPipeError".
        _drop_unwritten(io.stdout)
        return EXIT_OK
    except (FutureQError, OSError, ssl.SSLError, binascii.Error) as exc:
        io.err(error_line(exc, args.server))
        return EXIT_ERROR


def _drop_unwritten(stream: IO[str]) -> None:
    """Point ``stream``'s descriptor at /dev/null, so that the text it still buffers
    goes nowhere at exit instead of failing to write (only the process's own stdout:
    a stream without a descriptor, a test's, is left alone)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
