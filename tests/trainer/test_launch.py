"""rlsched.trainer.launch's parts that need no process group: the pod's exit code from
the agent's failed workers, the signals left to the agent, finding the workers."""

import signal
import subprocess
import sys
from types import SimpleNamespace

from rlsched.trainer.launch import _exit_code, without_sigterm, worker_pids


def _failures(*codes):
    return {rank: SimpleNamespace(exitcode=c, timestamp=rank) for rank, c in enumerate(codes)}


def test_a_failed_worker_gives_the_pod_its_own_exit_code():
    assert _exit_code(_failures(74, -signal.SIGTERM), stopping=False) == 74  # torchrun would say 1
    assert _exit_code(_failures(-signal.SIGKILL), stopping=False) == 128 + signal.SIGKILL
    assert _exit_code(_failures(-signal.SIGTERM, 143), stopping=True) == 143  # killed by the stop: intentional
    assert _exit_code(_failures(-signal.SIGTERM, 74), stopping=True) == 74


def test_the_agent_is_left_every_signal_but_sigterm():
    assert without_sigterm("SIGTERM,SIGINT,SIGHUP,SIGQUIT") == "SIGINT,SIGHUP,SIGQUIT"
    assert without_sigterm("SIGTERM,SIGUSR1") == "SIGUSR1"
    assert without_sigterm("SIGTERM") == "SIGINT,SIGHUP,SIGQUIT"


def test_the_workers_are_this_processs_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert child.pid in worker_pids()
        assert child.pid not in worker_pids(parent=child.pid)
    finally:
        child.kill()
        child.wait()
