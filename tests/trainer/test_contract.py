"""The worker contract inside the training process, torch.distributed from it, SIGTERM."""

import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from rlsched.core.contract import WorkerContract
from rlsched.trainer import (
    ContractError,
    agree_to_stop,
    clear_stop_request,
    install_stop_handler,
    local_rank,
    stop_requested,
    worker_contract,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**over):
    """What the operator puts in worker 1 of 3 of generation 4."""
    c = WorkerContract(job="resnet", namespace="team-a", index=1, workers=3, generation=4, batch_size=96,
                       checkpoint_dir="/ckpt", micro_batch_limit=16, procs_per_worker=2, resume=True)
    env = {**c.env(), "RLSCHED_JOB_NAME": "resnet", "RLSCHED_JOB_NAMESPACE": "team-a"}
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def test_the_operators_environment_parses_back():
    c = worker_contract(_env())
    assert (c.job, c.namespace, c.rank, c.world_size, c.generation) == ("resnet", "team-a", 1, 3, 4)
    assert (c.batch_size, c.checkpoint_dir, c.master_addr, c.master_port) == (96, "/ckpt", "resnet-worker-0.resnet", 29500)
    assert not c.is_chief
    assert (c.micro_batch_limit, c.procs_per_worker) == (16, 2)
    assert c.resume is True


def test_resume_round_trips_and_is_unknown_when_unset():
    """RLSCHED_RESUME: 1/0 both ways; an operator that does not set it gives None."""
    for value, env in ((True, "1"), (False, "0")):
        c = WorkerContract(job="j", namespace="n", index=0, workers=1, generation=2, resume=value)
        assert c.env()["RLSCHED_RESUME"] == env
        assert worker_contract({**c.env(), "RLSCHED_JOB_NAME": "j"}).resume is value
    assert "RLSCHED_RESUME" not in WorkerContract(job="j", namespace="n", index=0, workers=1).env()
    assert worker_contract(_env(RLSCHED_RESUME=None)).resume is None


@pytest.mark.parametrize(
    "over, match",
    [
        ({"MASTER_ADDR": None}, "MASTER_ADDR is not set: not started by the rlsched operator"),
        ({"RLSCHED_JOB_NAME": None}, "RLSCHED_JOB_NAME is not set"),
        ({"RANK": None}, "RANK is not set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a whole number"),
        ({"RANK": "3"}, "RANK: worker index 3 outside 0..2"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
        ({"RLSCHED_GLOBAL_BATCH_SIZE": "0"}, "RLSCHED_GLOBAL_BATCH_SIZE"),
        ({"RLSCHED_MICRO_BATCH_LIMIT": "0"}, "RLSCHED_MICRO_BATCH_LIMIT"),
        ({"PET_NPROC_PER_NODE": "x"}, "PET_NPROC_PER_NODE='x' is not a whole number"),
        ({"RLSCHED_RESUME": "yes"}, "RLSCHED_RESUME='yes' is neither 0 nor 1"),
    ],
)
def test_a_broken_contract_names_the_variable(over, match):
    with pytest.raises(ContractError, match=match):
        worker_contract(_env(**over))


def test_local_rank():
    assert local_rank({}) == 0
    assert local_rank({"LOCAL_RANK": "2"}) == 2
    for bad in ("x", "-1"):
        with pytest.raises(ContractError, match="LOCAL_RANK"):
            local_rank({"LOCAL_RANK": bad})


def test_init_distributed_outside_the_operator_is_a_contract_error():
    from rlsched.trainer import init_distributed

    with pytest.raises(ContractError, match="not started by the rlsched operator"):
        init_distributed(environ={})


def _run(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                          timeout=timeout)


def test_init_distributed_one_worker_uses_gloo_on_cpu():
    env = {"RLSCHED_JOB_NAME": "j", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": "1", "RANK": "0", "CUDA_VISIBLE_DEVICES": ""}
    out = _run("""
        import torch.distributed as dist
        from rlsched.trainer import init_distributed, shutdown_distributed, agree_to_stop
        c = init_distributed(timeout_s=30)
        assert init_distributed() == c  # idempotent
        print(dist.get_backend(), dist.get_rank(), dist.get_world_size(), agree_to_stop())
        shutdown_distributed()
        print(dist.is_initialized())
    """, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gloo", "0", "1", "False", "False"]


def test_a_world_that_does_not_assemble_is_a_rendezvous_error():
    env = {"RLSCHED_JOB_NAME": "j", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "WORLD_SIZE": "2", "RANK": "0", "CUDA_VISIBLE_DEVICES": ""}
    out = _run("""
        from rlsched.trainer import init_distributed, RendezvousError
        try:
            init_distributed(timeout_s=2)
        except RendezvousError as exc:
            print("RendezvousError", exc)
    """, env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("RendezvousError rank 0 of 2 (generation 0) could not join"), out.stdout


@pytest.fixture
def sigterm_restored():
    old = signal.getsignal(signal.SIGTERM)
    clear_stop_request()
    yield
    signal.signal(signal.SIGTERM, old)
    clear_stop_request()


def test_sigterm_sets_the_flag_and_nothing_else(sigterm_restored):
    install_stop_handler()
    assert not stop_requested() and not agree_to_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop_requested()  # the process is alive: the handler only set the flag
    assert agree_to_stop()  # no process group: the local flag
    clear_stop_request()
    assert not stop_requested()


def test_the_handler_is_installed_from_the_main_thread_only(sigterm_restored):
    import threading

    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, install_stop_handler)))
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0].value)


def test_stops_are_agreed_across_ranks():
    """Three gloo ranks; only rank 2 gets SIGTERM: all three agree to stop at once."""
    port = _free_port()
    code = """
        import os, signal
        from rlsched.trainer import init_distributed, install_stop_handler, agree_to_stop, shutdown_distributed
        install_stop_handler()
        c = init_distributed(timeout_s=60)
        seen = [agree_to_stop()]
        if c.rank == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        seen.append(agree_to_stop())
        print(seen)
        shutdown_distributed()
    """
    procs = []
    for rank in range(3):
        env = {k: v for k, v in os.environ.items()}
        env.update(RLSCHED_JOB_NAME="j", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="3",
                   RANK=str(rank), CUDA_VISIBLE_DEVICES="")
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "[False, True]"
