"""``torchrun`` for rlsched worker pods: several processes per pod, and the agreed stop
exits 0.

Runs torchrun's elastic agent with SIGTERM kept out of it and forwards SIGTERM to the
workers itself, so an agreed stop exits 0 (torchrun alone exits 1) and a failing worker's
exit code is the pod's. Usage: ``python -m rlsched.trainer.launch [torchrun options]
script.py [args]``. Linux only. Details: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

from rlsched.core.contract import EXIT_SIGTERM

__all__ = ["main", "worker_pids", "without_sigterm"]

log = logging.getLogger("rlsched.trainer")

#: what the agent handles when the options leave it nothing but SIGTERM
AGENT_SIGNALS = "SIGINT,SIGHUP,SIGQUIT"


def worker_pids(parent: int | None = None) -> list[int]:
    """The processes whose parent is ``parent`` (default: this process): the agent's
    workers, which it starts in sessions of their own (a signal to the pod's process
    group does not reach them)."""
    parent = os.getpid() if parent is None else parent
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
        if int(fields[1]) == parent:
            out.append(int(entry))
    return out


class _Forwarder:
    """SIGTERM -> every worker, now and (for workers the agent starts later, during a
    rendezvous) every ``interval`` seconds until the launcher exits."""

    def __init__(self, interval: float = 0.5) -> None:
        self.stop = threading.Event()
        self.signalled: set[int] = set()
        self.interval = interval
        self._lock = threading.RLock()  # a second SIGTERM may arrive inside the handler

    def on_signal(self, signum: int, frame: object) -> None:
        first = not self.stop.is_set()
        self.stop.set()
        self.forward()
        if first:
            threading.Thread(target=self._keep_forwarding, name="rlsched-sigterm", daemon=True).start()

    def forward(self) -> None:
        with self._lock:
            for pid in worker_pids():
                if pid not in self.signalled:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                    self.signalled.add(pid)

    def _keep_forwarding(self) -> None:
        while True:
            threading.Event().wait(self.interval)
            self.forward()


def _exit_code(failures: dict, stopping: bool) -> int:
    """The pod's exit code from the agent's failed workers: the first's own code (a
    signal as 128 + its number), 143 when every one was killed by the forwarded SIGTERM."""
    codes = [f.exitcode for _, f in sorted(failures.items(), key=lambda kv: kv[1].timestamp)]
    if stopping and all(c in (-signal.SIGTERM, EXIT_SIGTERM) for c in codes):
        return EXIT_SIGTERM
    first = next((c for c in codes if c not in (-signal.SIGTERM, EXIT_SIGTERM)), codes[0] if codes else 1)
    return 128 - first if first < 0 else (first or 1)


def without_sigterm(signals: str) -> str:
    """torchrun's ``--signals-to-handle`` list without SIGTERM."""
    kept = [s.strip() for s in signals.split(",") if s.strip() and s.strip() != "SIGTERM"]
    return ",".join(kept) or AGENT_SIGNALS


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("rlsched.trainer.launch must run in the main thread (it handles SIGTERM)")
    forwarder = _Forwarder()
    signal.signal(signal.SIGTERM, forwarder.on_signal)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.signals_to_handle = without_sigterm(args.signals_to_handle)  # the agent leaves SIGTERM to us
    try:
        run(args)
    except ChildFailedError as exc:
        code = _exit_code(exc.failures, forwarder.stop.is_set())
        log.error("workers failed; exiting %d: %s", code, exc)
        return code
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
