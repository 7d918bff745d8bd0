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
    assert (h.grad_sqr, h.grad_var, h.updates) == (g.grad_sqr, g.grad_var, 2)


def test_one_worker_measures_nothing():
    g = GradientNoiseScale()
    g.begin_step((32,), 0)
    assert not g.end_step()


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
    print(json.dumps({"got": [gns.grad_sqr, gns.grad_var], "local": local.item() / c.world_size,
                      "global": full.pow(2).sum().item(), "shares": list(plan.shares)}))
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
