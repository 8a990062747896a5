"""A stop signal that comes after the server's signal receiver closed (the graceful
shutdown is done, the process is exiting): a repeat of the first within
``REPEAT_SIGNAL_WINDOW_S`` is ignored, any other acts as Python's default.

Each case runs in a real Python subprocess that signals itself, so the handler under
test is the process's own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from futureq import early_signals
from futureq.early_signals import REPEAT_SIGNAL_WINDOW_S

PRELUDE = """
import logging, os, signal, time
from futureq import early_signals
logging.basicConfig(level=logging.INFO)
early_signals.stand_in_for_stop_signals()
"""


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = PRELUDE + textwrap.dedent(body) + "\nprint('alive', flush=True)\n"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )


def test_a_repeat_within_the_window_after_the_receiver_closed_is_ignored() -> None:
    done = _run(
        """
        early_signals.note_stop_signal()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python runs the handler between bytecodes
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "alive\n"
    assert done.stderr.count("again within 1 s of the first: the same request") == 2, done.stderr


def test_a_sigterm_with_no_stop_before_ends_the_process_as_by_default() -> None:
    done = _run(
        """
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        """
    )
    assert done.returncode == -signal.SIGTERM
    assert done.stdout == ""


def test_a_stop_signal_past_the_window_is_not_a_repeat() -> None:
    done = _run(
        f"""
        early_signals.note_stop_signal()
        time.sleep({REPEAT_SIGNAL_WINDOW_S} + 0.2)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        """
    )
    assert done.returncode == -signal.SIGTERM
    assert done.stdout == ""


def test_sigint_with_no_stop_before_raises_keyboard_interrupt() -> None:
    done = _run(
        """
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            print('interrupted', flush=True)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "interrupted\nalive\n"


def test_repeats_while_the_interpreter_finalizes_are_ignored() -> None:
    """The interpreter puts Python-level handlers back to the default while it exits,
    so a repeat arriving then ended the process with -15 after it had stopped
    gracefully (a sharded node's supervisor, 4 of 6 runs at 0.06-0.12 s between the two
    SIGTERMs). A shell loop signals the process from before it exits until it is gone."""
    done = _run(
        """
        import subprocess
        early_signals.note_stop_signal()
        early_signals.ignore_stop_signals_at_exit()
        loop = f"while kill -TERM {os.getpid()} 2>/dev/null; do :; done"
        quiet = subprocess.DEVNULL  # the test's pipes close when this process ends
        subprocess.Popen(["sh", "-c", loop], stdin=quiet, stdout=quiet, stderr=quiet)
        time.sleep(0.05)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "alive\n"


def test_without_a_stop_signal_the_default_stays_at_exit() -> None:
    done = _run(
        """
        early_signals.ignore_stop_signals_at_exit()
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
        """
    )
    assert done.returncode == 0, done.stderr


def test_a_stop_signal_after_the_node_stopped_for_another_cause_is_ignored() -> None:
    """Found in the Kubernetes test (2 of 9 runs): a node removed from the cluster shut
    down by itself, and the SIGTERM of its pod's deletion, arriving while it finished,
    ended it with -15 (no stop signal had come before, so it was not a repeat)."""
    done = _run(
        """
        early_signals.note_stopped()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        early_signals.ignore_stop_signals_at_exit()
        os.kill(os.getpid(), signal.SIGTERM)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "alive\n"
    assert "received SIGTERM after the node stopped: the process is exiting" in done.stderr


def test_only_futureq_start_remembers_signals_from_its_first_line() -> None:
    starts = early_signals.starts_a_node
    assert starts(True, ["/x/server_main.py", "start", "--shards", "1"])  # python -m
    assert starts(False, ["/opt/futureq/bin/futureq", "start"])  # the console script
    assert not starts(True, ["/x/server_main.py", "check-config"])
    assert not starts(False, ["/opt/futureq/bin/futureq", "health"])
    assert not starts(False, ["/usr/bin/pytest", "start"])  # imported by another program
    assert not starts(True, ["/x/server_main.py"])


def test_a_stop_signal_blocked_at_exec_waits_for_the_handler() -> None:
    """A process started with the stop signals blocked (a sharded node's shards) keeps
    one sent before its handler exists, and takes it once deferred."""
    done = _run(
        """
        early_signals.block_start_signals_in_child()
        os.kill(os.getpid(), signal.SIGTERM)  # pending: blocked
        early_signals.defer_from_the_start()
        time.sleep(0.05)
        print(early_signals.deferred_stop())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "SIGTERM\nalive\n", done.stdout


WATCH_WHILE_A_SIGNAL_LANDS = """
import logging, os, signal, sys
import trio
from futureq import early_signals
from futureq.broker import server
from futureq.shards import supervisor  # noqa: F401 - the same receiver serves a supervisor
logging.basicConfig(level=logging.INFO)
early_signals.defer_from_the_start()
opens = trio.open_signal_receiver

def open_as_a_signal_lands(*signals):
    # The signal lands as the receiver is about to be installed (CI: a SIGINT sent as
    # the node logs its first line met the stand-in there and raised KeyboardInterrupt).
    os.kill(os.getpid(), signal.SIG{name})
    return opens(*signals)

trio.open_signal_receiver = open_as_a_signal_lands

async def main():
    shutdown, forced = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(server._watch_signals, shutdown, nursery.cancel_scope, forced)
        with trio.fail_after(5):
            await shutdown.wait()
        nursery.cancel_scope.cancel()
    print("graceful", forced.is_set(), flush=True)

trio.run(main)
"""


def test_a_stop_signal_landing_as_the_receiver_opens_stops_gracefully() -> None:
    """Before: the stand-in was installed just before the receiver, so a first SIGINT
    landing in between raised KeyboardInterrupt (and a SIGTERM ended the process with
    -15). Now the deferring handler takes it and the watcher starts the graceful stop."""
    for name in ("INT", "TERM"):
        done = subprocess.run(
            [sys.executable, "-c", WATCH_WHILE_A_SIGNAL_LANDS.replace("{name}", name)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (name, done.returncode, done.stderr)
        assert done.stdout == "graceful False\n", (name, done.stderr)
        assert f"received SIG{name} while starting: shutting down gracefully" in done.stderr
