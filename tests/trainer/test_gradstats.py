"""Gradient-noise statistics: the estimator's algebra, its smoothing, and the DDP hook."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from rlsched.trainer import GradientNoiseScale, noise_estimate


def test_estimates_are_unbiased_on_synthetic_gradients():
    """Per-sample gradients G + noise with known |G|^2 and tr(Sigma): the estimates,
    averaged over many steps, recover both (McCandlish et al. 2018, A.2-A.3)."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    d, w, b, trials = 16, 4, 8, 4000
    g_true = rng.normal(size=d) * 0.3
    sigma = rng.uniform(0.5, 2.0, size=d)
    samples = g_true + rng.normal(size=(trials, w, b, d)) * sigma
    local = samples.mean(axis=2)  # per-worker gradients over b samples
    local_sqr = (local**2).sum(axis=-1).mean(axis=1)  # |g_b|^2 averaged over workers
    global_sqr = (local.mean(axis=1) ** 2).sum(axis=-1)  # |g_B|^2, B = w b
    est = np.array([noise_estimate(ls, gs, b, w * b) for ls, gs in zip(local_sqr, global_sqr)])
    assert est[:, 0].mean() == pytest.approx((g_true**2).sum(), rel=0.05)
    assert est[:, 1].mean() == pytest.approx((sigma**2).sum(), rel=0.05)


def test_estimate_by_hand():
    # |G|^2 = 1, tr(Sigma) = 8, b = 2, B = 8: E|g_b|^2 = 1 + 4 = 5, E|g_B|^2 = 1 + 1 = 2
    assert noise_estimate(5.0, 2.0, 2, 8) == pytest.approx((1.0, 8.0))
    with pytest.raises(ValueError):
        noise_estimate(5.0, 2.0, 8, 8)  # one worker: no second batch size


def test_ema_is_bias_corrected_and_checkpointable():
    g = GradientNoiseScale(decay=0.9)
    assert g.grad_sqr is None and g.noise_scale is None
    g.update(5.0, 2.0, 2, 8)
    assert (g.grad_sqr, g.grad_var, g.noise_scale) == pytest.approx((1.0, 8.0, 8.0))  # not 0.1 and 0.8
    g.update(7.0, 3.0, 2, 8)  # (|G|^2, tr) = (5/3, 32/3)
    assert g.grad_sqr == pytest.approx((0.9 * 0.1 * 1.0 + 0.1 * 5 / 3) / (1 - 0.9**2))
    g.update(float("nan"), 1.0, 2, 8)  # skipped
    h = GradientNoiseScale(decay=0.9)
    h.load_state_dict(g.state_dict())
    assert h.estimates() == (g.grad_sqr, g.grad_var) and h.updates == 2
    # restored estimates feed the smoothing, but are not reported until h measures itself
    assert (h.grad_sqr, h.grad_var, h.noise_scale, h.measured) == (None, None, None, False)
    assert h.update(5.0, 2.0, 2, 8) and h.grad_sqr == pytest.approx((0.9 * 0.19 * g.grad_sqr + 0.1) / (1 - 0.9**3))


def test_one_worker_measures_nothing():
    g = GradientNoiseScale()
    g.begin_step((32,), 0)
    assert not g.end_step()


def _linear_problem():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    return torch, x, y, torch.nn.Linear(6, 3)


def _flat_grad(torch, model):
    return torch.cat([p.grad.flatten() for p in model.parameters()]).double()


def _accumulate(torch, model, x, y, cuts, loss_factor=1.0):
    """One step of gradient accumulation as the library prescribes: each micro-batch's
    summed loss times W/B (W = 1)."""
    at = 0
    for n in cuts:
        part = slice(at, at + n)
        at += n
        loss = torch.nn.functional.cross_entropy(model(x[part]), y[part], reduction="sum") / len(x)
        (loss * loss_factor).backward()


def _direct(torch, x, y, model, b):
    """|g_b|^2 of the first b samples' mean gradient and |g_B|^2 of all, computed apart."""
    plain = torch.nn.Linear(6, 3)
    plain.load_state_dict(model.state_dict())
    torch.nn.functional.cross_entropy(plain(x[:b]), y[:b]).backward()
    first = _flat_grad(torch, plain).pow(2).sum().item()
    plain.zero_grad()
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    return first, _flat_grad(torch, plain).pow(2).sum().item()


def test_one_worker_measures_from_micro_batches_and_unscales_amp():
    """One worker, 10 samples in micro-batches of 4, 4, 2: the first micro-batch's mean
    gradient against the accumulated one is the same estimator (b = 4, B = 10); with
    the loss scaled by 1024 (a GradScaler's scale) and amp_scale=1024, the same answer;
    a step with non-finite gradients folds nothing in."""
    torch, x, y, model = _linear_problem()
    want = noise_estimate(*_direct(torch, x, y, model, 4), 4, 10)
    for factor in (1.0, 1024.0):
        g = GradientNoiseScale(decay=0.5).attach(model)
        model.zero_grad(set_to_none=True)
        g.begin_step((10,), 0, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]])  # Step.micro_batches: index lists
        _accumulate(torch, model, x, y, (4, 4, 2), factor)
        assert g.end_step(amp_scale=None if factor == 1.0 else factor)
        assert [g.grad_sqr, g.grad_var] == pytest.approx(list(want), rel=1e-5)
    # overflow under AMP: skipped, the estimates stay
    model.zero_grad(set_to_none=True)
    g.begin_step((10,), 0, (4, 4, 2))
    _accumulate(torch, model, x, y, (4, 4, 2), 1024.0)
    next(model.parameters()).grad[0, 0] = float("inf")
    assert not g.end_step(amp_scale=1024.0) and g.updates == 1
    with pytest.raises(ValueError):
        g.end_step(amp_scale=0.0)


def test_one_worker_without_micro_batches_reports_absent_not_restored():
    torch, x, y, model = _linear_problem()
    g = GradientNoiseScale().attach(model)
    g.load_state_dict({"sqr": 1.0, "var": 8.0, "weight": 1.0, "updates": 7})  # a checkpoint's
    g.begin_step((10,), 0, [list(range(10))])
    _accumulate(torch, model, x, y, (10,))
    assert not g.end_step()
    assert (g.grad_sqr, g.grad_var) == (None, None) and g.estimates() == (1.0, 8.0)


def test_one_ddp_worker_measures_from_micro_batches(tmp_path):
    """The same through DistributedDataParallel at world size 1 (no_sync on all but the
    last micro-batch): the gradient-accumulation hooks see the first micro-batch."""
    torch, x, y, model = _linear_problem()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    want = noise_estimate(*_direct(torch, x, y, model, 4), 4, 10)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = DDP(model)
        g = GradientNoiseScale().attach(ddp)
        g.begin_step((10,), 0, (4, 4, 2))
        for k, part in enumerate((slice(0, 4), slice(4, 8), slice(8, 10))):
            with ddp.no_sync() if k < 2 else torch.enable_grad():
                (torch.nn.functional.cross_entropy(ddp(x[part]), y[part], reduction="sum") / 10).backward()
        assert g.end_step()
        assert [g.grad_sqr, g.grad_var] == pytest.approx(list(want), rel=1e-5)
    finally:
        dist.destroy_process_group()


HOOK_WORKER = """
    import json, os, torch, torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from rlsched.trainer import init_distributed, GradientNoiseScale, plan_batch, loss_scale

    c = init_distributed(timeout_s=60)
    torch.manual_seed(0)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    model = torch.nn.Linear(6, 3)
    plain = torch.nn.Linear(6, 3)
    plain.load_state_dict(model.state_dict())
    ddp = DDP(model)
    gns = GradientNoiseScale(decay=0.5).attach(ddp)
    plan = plan_batch(10, c.world_size, micro_batch_limit=2)  # shares 4, 3, 3 in 2 micro-batches
    start = sum(plan.shares[: c.rank])
    idx = list(range(start, start + plan.share(c.rank)))
    gns.begin_step(plan.shares, c.rank)
    cuts = plan.micro_batches(c.rank)
    at = 0
    for k, n in enumerate(cuts):
        part = idx[at : at + n]
        at += n
        ctx = ddp.no_sync() if k < len(cuts) - 1 else torch.enable_grad()
        with ctx:
            (F.cross_entropy(ddp(x[part]), y[part], reduction="sum") * loss_scale(10, c.world_size)).backward()
    assert gns.end_step()
    # the same quantities directly: this worker's mean gradient over its samples, the global mean
    F.cross_entropy(plain(x[idx]), y[idx]).backward()
    mine = torch.cat([p.grad.flatten() for p in plain.parameters()]).double()
    local = torch.tensor([mine.pow(2).sum().item()], dtype=torch.float64)
    dist.all_reduce(local)
    full = torch.cat([p.grad.flatten() for p in ddp.parameters()]).double()
    out = {"got": [gns.grad_sqr, gns.grad_var], "local": local.item() / c.world_size,
           "global": full.pow(2).sum().item(), "shares": list(plan.shares)}

    # the same step composed with a user's comm hook (fp16 compression) under a loss scale
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    model2 = torch.nn.Linear(6, 3)
    model2.load_state_dict(plain.state_dict())
    ddp2 = DDP(model2)
    gns2 = GradientNoiseScale(decay=0.5).attach(ddp2, comm_hook=fp16_compress_hook)
    gns2.begin_step(plan.shares, c.rank, plan.micro_batches(c.rank))
    with torch.enable_grad():
        (F.cross_entropy(ddp2(x[idx]), y[idx], reduction="sum") * loss_scale(10, c.world_size) * 256.0).backward()
    assert gns2.end_step(amp_scale=256.0)
    full2 = torch.cat([p.grad.flatten() for p in ddp2.parameters()])
    out.update(got2=[gns2.grad_sqr, gns2.grad_var], global2=full2.double().pow(2).sum().item() / 256.0**2,
               fp16=bool(torch.equal(full2, full2.half().float())))
    print(json.dumps(out))
"""


def test_the_ddp_hook_measures_the_per_worker_and_global_norms():
    """Three gloo ranks, uneven shares (10 = 4 + 3 + 3) in two micro-batches each: the
    hook's observation equals the norms computed directly, with b the harmonic mean."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(3):
        env = dict(os.environ, RLSCHED_JOB_NAME="j", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="3",
                   RANK=str(rank), CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOOK_WORKER)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    r = results[0]
    b = 3 / (1 / 4 + 1 / 3 + 1 / 3)
    want = noise_estimate(r["local"], r["global"], b, 10)
    for got in results:  # every rank holds the same statistics
        assert got["got"] == pytest.approx(list(want), rel=1e-5)  # float32 gradients
    # with fp16_compress_hook: the reduced gradient went through fp16 (the user's hook ran),
    # the local norms were read before it, the loss scale 256 is divided out
    want2 = noise_estimate(r["local"], r["global2"], b, 10)
    for got in results:
        assert got["fp16"] and got["got2"] == pytest.approx(list(want2), rel=1e-5)
