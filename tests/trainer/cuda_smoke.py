#!/usr/bin/env python3
"""The nccl/CUDA path of rlsched.trainer on one GPU: AMP, a SIGTERM stop and a resume.

Run on a machine with a GPU and torch (any ``python3`` >= 3.10 that imports torch; no
virtual environment needed: the repository's ``rlsched`` is put on the path from this
checkout)::

    python3 tests/trainer/cuda_smoke.py            # about 30-60 s; exit 0 when every check holds

It runs a small classifier (synthetic, seeded data) as a one-worker job through the
library — ``init_distributed`` over nccl, DDP, float16 autocast with a
``torch.amp.GradScaler``, ``ElasticSampler``, ``Checkpointer`` with the scaler — three
times: uninterrupted (the reference), then generation 0 SIGTERMed mid-epoch (it must
agree to stop, checkpoint and exit 0) and generation 1 resuming from that checkpoint to
the end. It prints one JSON line (the checks and figures) and exits 1 when a check
fails, 2 when there is no torch or no GPU. ``--cpu`` runs the same on the CPU (gloo,
bfloat16 autocast): how the script itself is checked where there is no GPU.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EPOCHS, SAMPLES, FEATURES, CLASSES, GLOBAL_BATCH = 2, 4096, 32, 4, 64
STOP_AFTER = 40  # steps into generation 0
LOSS_TOLERANCE = 0.05  # float16 autocast: the resumed run is the same computation, same order


def _rlsched_path(tmp: Path) -> str:
    """A directory where ``import rlsched.trainer`` and ``rlsched.core`` resolve to this
    checkout (pyproject maps rlsched.core to core/), for a python without the package."""
    farm = tmp / "pkgs" / "rlsched"
    farm.mkdir(parents=True)
    for entry in (ROOT / "rlsched").iterdir():
        if entry.name != "operator":
            (farm / entry.name).symlink_to(entry)
    (farm / "core").symlink_to(ROOT / "core")
    return str(farm.parent)


def worker(args: list[str]) -> int:
    """One generation: ``worker <checkpoint dir> <events file>``."""
    ckpt_dir, events = args
    from rlsched import trainer as rt

    rt.install_stop_handler()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    cpu = os.environ.get("SMOKE_DEVICE") == "cpu"
    contract = rt.init_distributed("gloo" if cpu else "nccl", timeout_s=60)
    device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    amp_dtype = torch.bfloat16 if cpu else torch.float16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = (x[:, :CLASSES] + 0.5 * torch.randn(SAMPLES, CLASSES, generator=g)).argmax(dim=1)
    x, y = x.to(device), y.to(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, CLASSES))
    ddp = DDP(model.to(device), device_ids=None if cpu else [device.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**12, growth_interval=20)
    plan = rt.plan_batch(contract.batch_size or GLOBAL_BATCH, contract.world_size)
    sampler = rt.ElasticSampler(SAMPLES, plan, contract.rank, seed=0)
    ckpt = rt.Checkpointer(ckpt_dir, rank=contract.rank, generation=contract.generation)
    got = ckpt.restore(model=ddp, optimizer=opt, scaler=scaler)
    state = got[0] if got else rt.TrainState()

    def log(kind: str, **fields) -> None:
        with open(events, "a") as fh:
            fh.write(json.dumps({"event": kind, "gen": contract.generation, "epoch": state.epoch,
                                 "consumed": state.consumed, "step": state.step, "scale": scaler.get_scale(),
                                 **fields}) + "\n")

    log("start", resumed=got is not None, backend=dist.get_backend(),
        device="cpu" if cpu else torch.cuda.get_device_name(device))
    while state.epoch < EPOCHS:
        for step in sampler.steps(state.epoch, state.consumed):
            idx = torch.tensor(step.micro_batches[0], dtype=torch.long, device=device)
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = F.cross_entropy(ddp(x[idx]), y[idx], reduction="sum")
            scaler.scale(loss * step.loss_scale).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            state.advance(step)
            log("step", loss=loss.item() / step.global_size, indices=list(step.indices))
            time.sleep(0.005)
            if rt.agree_to_stop():
                ckpt.save(model=ddp, optimizer=opt, scaler=scaler, state=state, world_size=contract.world_size)
                log("stop")
                rt.shutdown_distributed()
                return rt.EXIT_STOPPED
        state.next_epoch()
        ckpt.save(model=ddp, optimizer=opt, scaler=scaler, state=state, world_size=contract.world_size)
    with torch.no_grad():
        acc = (ddp(x).argmax(dim=1) == y).float().mean().item()
    log("done", accuracy=acc)
    rt.shutdown_distributed()
    return 0


def _generation(tmp: Path, name: str, gen: int, pythonpath: str, stop_after: int | None) -> tuple[int, list[dict]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ckpt, events = tmp / name / "ckpt", tmp / name / "events.jsonl"
    ckpt.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLSCHED_", "PET_", "TORCHELASTIC_"))}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(PYTHONPATH=pythonpath, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="1", RANK="0",
               LOCAL_RANK="0", RLSCHED_JOB_NAME=name, RLSCHED_GENERATION=str(gen), CUDA_VISIBLE_DEVICES=
               os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0], PYTHONUNBUFFERED="1")
    with open(tmp / name / f"gen{gen}.log", "w") as out:
        proc = subprocess.Popen([sys.executable, __file__, "worker", str(ckpt), str(events)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    try:
        while stop_after is not None:
            ev = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
            if sum(1 for e in ev if e["gen"] == gen and e["event"] == "step") >= stop_after:
                proc.send_signal(signal.SIGTERM)
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events_all = [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    return code, [e for e in events_all if e["gen"] == gen]


def main(cpu: bool) -> int:
    try:
        import torch
    except ImportError:
        print(json.dumps({"ok": False, "error": f"{sys.executable} cannot import torch"}))
        return 2
    if cpu:
        os.environ["SMOKE_DEVICE"] = "cpu"
    elif not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device", "torch": torch.__version__}))
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rlsched-cuda-smoke-") as d:
        tmp = Path(d)
        try:
            import rlsched.trainer  # noqa: F401
            pythonpath = os.pathsep.join(p for p in sys.path if p)
        except ImportError:
            pythonpath = _rlsched_path(tmp)
        ref_code, ref = _generation(tmp, "reference", 0, pythonpath, None)
        code0, gen0 = _generation(tmp, "elastic", 0, pythonpath, STOP_AFTER)
        code1, gen1 = _generation(tmp, "elastic", 1, pythonpath, None)
        nccl = None if cpu else torch.cuda.nccl.version()
        checks, figures = {}, {"torch": torch.__version__, "cuda": torch.version.cuda,
                               "nccl": nccl if nccl is None or isinstance(nccl, int) else ".".join(map(str, nccl))}
        try:
            steps = lambda evs: {e["step"]: e for e in evs if e["event"] == "step"}  # noqa: E731
            ref_steps, el_steps = steps(ref), {**steps(gen0), **steps(gen1)}
            stop = next((e for e in gen0 if e["event"] == "stop"), None)
            start = next((e for e in gen1 if e["event"] == "start"), None)
            figures.update(device=ref[0].get("device"), backend=ref[0].get("backend"), exits=[ref_code, code0, code1])
            checks["exits_0"] = [ref_code, code0, code1] == [0, 0, 0]
            checks["stopped_mid_epoch"] = stop is not None and 0 < stop["consumed"] < SAMPLES
            checks["resumed_there"] = (start is not None and stop is not None and start["resumed"]
                                       and (start["epoch"], start["consumed"], start["step"])
                                       == (stop["epoch"], stop["consumed"], stop["step"]))
            checks["scaler_restored"] = start is not None and stop is not None and start["scale"] == stop["scale"]
            seen: dict[int, list[int]] = {}
            for e in el_steps.values():
                seen.setdefault(e["epoch"], []).extend(e["indices"])
            checks["every_sample_once"] = (sorted(seen) == list(range(EPOCHS))
                                           and all(sorted(v) == list(range(SAMPLES)) for v in seen.values()))
            checks["all_steps"] = sorted(el_steps) == sorted(ref_steps) and len(ref_steps) > 0
            worst = max((abs(el_steps[s]["loss"] - ref_steps[s]["loss"]) for s in ref_steps if s in el_steps),
                        default=float("inf"))
            figures["largest_step_loss_difference"] = worst
            checks["losses_match_reference"] = worst < LOSS_TOLERANCE
            done, ref_done = gen1[-1], ref[-1]
            figures["accuracy"], figures["reference_accuracy"] = done.get("accuracy"), ref_done.get("accuracy")
            checks["accuracy_matches"] = (done.get("accuracy") is not None and ref_done.get("accuracy") is not None
                                          and abs(done["accuracy"] - ref_done["accuracy"]) <= 0.01)
        except (KeyError, IndexError, TypeError, StopIteration) as exc:
            checks["events_complete"] = False
            figures["error"] = repr(exc)
        ok = bool(checks) and all(checks.values())
        if not ok:
            for log in sorted(tmp.glob("*/gen*.log")):
                print(f"--- {log.relative_to(tmp)}\n{log.read_text()[-2000:]}", file=sys.stderr)
    print(json.dumps({"ok": ok, "seconds": round(time.monotonic() - t0, 1), "checks": checks, **figures}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(worker(sys.argv[2:]) if sys.argv[1:2] == ["worker"] else main(cpu=sys.argv[1:] == ["--cpu"]))
