"""HierRL: a two-level scheduler on the same simulator environment.

A high level assigns each job to a node group (a rack, or ``any``), a low level picks
which assigned job starts at a decision point; both levels and a critic are trained as an
advantage actor-critic with multi-step TD targets, per (job, group) pair, so one model
runs on any cluster size. Details: docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from rlsched.core.das_agent import JOB_FEATURES
from rlsched.core.placement import worker_slots
from rlsched.sim.envs import SchedulingCore

from .base import seed_everything
from .ppo import n_step_returns
from .runs import new_run
from .scheduling import (
    common_arguments,
    env_dict,
    episode_summary,
    evaluate_against_seed_baselines,
    export_model,
    load_for_eval,
    load_state,
    make_core,
    numpy_state,
    run_iterations,
)

__all__ = ["HierNet", "make_net", "HierScheduler", "GROUP_FEATURES", "add_arguments", "train", "evaluate"]

#: per-group features for one job
GROUP_FEATURES = ("is_any", "free_frac", "size_frac", "fits_now", "queue_frac")
F_JOB = len(JOB_FEATURES)
F_GROUP = len(GROUP_FEATURES)


class HierNet(nn.Module):
    def __init__(self, hidden: int = 64, state_dim: int = 0) -> None:
        super().__init__()
        self.state_dim = state_dim
        self.high = nn.Sequential(nn.Linear(F_JOB + F_GROUP, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.low = nn.Sequential(nn.Linear(F_JOB + F_GROUP, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.critic = nn.Sequential(nn.Linear(max(state_dim, 1), hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def high_logits(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.high(x).squeeze(-1).masked_fill(~mask, float("-inf"))

    def low_logits(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.low(x).squeeze(-1).masked_fill(~mask, float("-inf"))

    def value(self, s: torch.Tensor) -> torch.Tensor:
        return self.critic(s).squeeze(-1)


def make_net(spec: dict) -> HierNet:
    """The network of an exported or training ``spec`` (its architecture metadata)."""
    return HierNet(spec.get("hidden", 64), spec.get("state_dim", 0))


def _np_mlp(x: np.ndarray, seq: nn.Sequential) -> np.ndarray:
    with torch.no_grad():
        return seq(torch.as_tensor(x, dtype=torch.float32)).squeeze(-1).numpy()


def _sample(logits: np.ndarray, rng: np.random.Generator | None) -> int:
    if rng is None:
        return int(np.argmax(logits))
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p))


class HierScheduler:
    """Runs the two levels on a :class:`SchedulingCore` episode (sampling with ``rng``,
    greedy when ``rng`` is None) and records what the learner needs."""

    def __init__(self, net: HierNet, core: SchedulingCore, rng: np.random.Generator | None) -> None:
        self.net, self.core, self.rng = net, core, rng
        topo = core.topology
        self.racks = topo.racks
        rack_of = np.array([topo.racks.index(r) for r in topo.rack_of])
        self.members = [np.flatnonzero(rack_of == g) for g in range(len(self.racks))]
        self.assigned: dict[str, int] = {}
        self.log: list[dict] = []

    @property
    def n_groups(self) -> int:
        return len(self.racks) + 1  # + any

    def _slots_in(self, job, g: int, total: bool = False) -> int:
        st = self.core.sim.state
        if total:
            slots = st.total // job.gpus_per_worker
            if job.gpu_models is not None:
                allowed = np.zeros(len(slots), dtype=bool)
                allowed[st.candidates_total(job.gpus_per_worker, job.gpu_models)] = True
                slots = np.where(allowed, slots, 0)
        else:
            slots = worker_slots(job, st)
        return int(slots.sum() if g == len(self.racks) else slots[self.members[g]].sum())

    def group_features(self, job) -> tuple[np.ndarray, np.ndarray]:
        st = self.core.sim.state
        G = self.n_groups
        feats = np.zeros((G, F_GROUP), dtype=np.float32)
        mask = np.zeros(G, dtype=bool)
        queue = np.bincount(list(self.assigned.values()), minlength=G) if self.assigned else np.zeros(G)
        w = self.core.config.window
        for g in range(G):
            nodes = np.arange(len(st.total)) if g == len(self.racks) else self.members[g]
            tot = max(int(st.total[nodes].sum()), 1)
            feats[g] = (
                float(g == len(self.racks)),
                st.free[nodes].sum() / tot,
                tot / max(st.total_gpus, 1),
                float(self._slots_in(job, g) >= job.workers),
                queue[g] / w,
            )
            mask[g] = self._slots_in(job, g, total=True) >= job.workers
        return feats, mask

    def step(self) -> float:
        """One decision point: assign new window jobs, then start one or wait."""
        core = self.core
        st = core.sim.state
        rec: dict = {"state": core.state_vector(0), "high": [], "low": None}
        window = core.window_jobs()
        for job in window:
            if job.id in self.assigned:
                continue
            gf, gm = self.group_features(job)
            x = np.concatenate([np.repeat(_job_row(job, st)[None], len(gf), 0), gf], 1)
            logits = np.where(gm, _np_mlp(x, self.net.high), -np.inf)
            g = _sample(logits, self.rng)
            self.assigned[job.id] = g
            rec["high"].append((x, gm, g))
        cands, xs = [], []
        for k, job in enumerate(window):
            g = self.assigned[job.id]
            if self._slots_in(job, g) >= job.workers:
                gf, _ = self.group_features(job)
                cands.append(k)
                xs.append(np.concatenate([_job_row(job, st), gf[g]]))
        if cands:
            x = np.stack(xs)
            c = _sample(_np_mlp(x, self.net.low), self.rng)
            rec["low"] = (x, c)
            slot = cands[c]
            job = window[slot]
            g = self.assigned.pop(job.id)
            n = len(st.total)
            inside = np.ones(n, dtype=bool) if g == len(self.racks) else np.isin(np.arange(n), self.members[g])
            nodes = core.place_by_scores(job, np.where(inside, 1e6, 0.0) - np.arange(n))
            r = core.start(slot, nodes)
        else:
            r = core.wait()
        rec["reward"] = r
        rec["done"] = core.done
        self.log.append(rec)
        return r


def _job_row(job, st) -> np.ndarray:
    from rlsched.core.das_agent import job_features

    return np.clip(job_features(job, st), -1.0, 10.0)


def collect_hierrl(task: dict) -> dict:
    torch.set_num_threads(1)
    net = load_state(make_net(task["spec"]), task["state"])
    core = make_core(task["env"])
    rng = np.random.default_rng(task["seed"])
    out: dict[str, list] = {k: [] for k in ("records", "reward", "episode_return", "episode_jct", "episode_fee")}
    for _ in range(task["episodes"]):
        core.reset(int(rng.integers(0, 2**30)))
        sched = HierScheduler(net, core, rng)
        while not core.done:
            sched.step()
        out["records"].extend(sched.log)
        out["reward"].extend(r["reward"] for r in sched.log)
        for k, v in zip(("episode_return", "episode_jct", "episode_fee"), episode_summary(core)):
            out[k].append(v)
    return out


def _pad(xs: list[np.ndarray], masks: list[np.ndarray] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    m = max(len(x) for x in xs)
    out = np.zeros((len(xs), m, xs[0].shape[1]), dtype=np.float32)
    mask = np.zeros((len(xs), m), dtype=bool)
    for i, x in enumerate(xs):
        out[i, : len(x)] = x
        mask[i, : len(x)] = True if masks is None else masks[i]
    return torch.as_tensor(out), torch.as_tensor(mask)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_arguments(parser, "hierrl", 40)
    parser.add_argument("--n-step", type=int, default=5)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)


def train(args) -> int:
    torch.set_num_threads(1)
    seed_everything(args.seed)
    env = env_dict(args)
    spec = {"hidden": 64, "state_dim": make_core(env).state_size(), "window": args.window, "group_features": list(GROUP_FEATURES)}
    net = make_net(spec)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    run = new_run(args, "hierrl")
    t0 = time.time()

    def make_task(seed: int, episodes: int) -> dict:
        return {"spec": spec, "state": numpy_state(net), "env": env, "seed": seed, "episodes": episodes}

    def update(data: dict) -> dict:
        recs = data["records"]
        states = torch.as_tensor(np.stack([r["state"] for r in recs]))
        with torch.no_grad():
            values = net.value(states).numpy()
        tgt = torch.as_tensor(
            n_step_returns(np.array([r["reward"] for r in recs]) * args.reward_scale, values, np.array([r["done"] for r in recs]), args.n_step, args.gamma),
            dtype=torch.float32,
        )
        v = net.value(states)
        adv = (tgt - v).detach()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        lv = 0.5 * ((tgt - v) ** 2).mean()
        loss = args.vf_coef * lv
        ents = []
        hi = [(t, h) for t, r in enumerate(recs) for h in r["high"]]
        if hi:
            x, m = _pad([h[0] for _, h in hi], [h[1] for _, h in hi])
            logp = torch.log_softmax(net.high_logits(x, m), -1)
            a = torch.as_tensor([h[2] for _, h in hi])
            idx = torch.as_tensor([t for t, _ in hi])
            loss = loss - (logp.gather(1, a[:, None]).squeeze(1) * adv[idx]).sum() / len(recs)
            ents.append(-(logp.exp() * torch.where(m, logp, torch.zeros_like(logp))).sum(-1).mean())
        lo = [(t, r["low"]) for t, r in enumerate(recs) if r["low"] is not None]
        if lo:
            x, m = _pad([l[0] for _, l in lo])
            logp = torch.log_softmax(net.low_logits(x, m), -1)
            a = torch.as_tensor([l[1] for _, l in lo])
            idx = torch.as_tensor([t for t, _ in lo])
            loss = loss - (logp.gather(1, a[:, None]).squeeze(1) * adv[idx]).sum() / len(recs)
            ents.append(-(logp.exp() * torch.where(m, logp, torch.zeros_like(logp))).sum(-1).mean())
        ent = sum(ents) if ents else torch.zeros(())
        loss = loss - args.ent_coef * ent
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        opt.step()
        return {"loss": float(loss.detach()), "loss_value": float(lv.detach()), "entropy": float(ent.detach()), "waits": sum(r["low"] is None for r in recs)}

    run_iterations(args, run, collect_hierrl, make_task, update, f"HierRL on {args.trace}")
    model = export_model(args, run, net, "hierrl", spec, time.time() - t0, {"group_features": list(GROUP_FEATURES)})
    print(f"wrote {model}")
    return 0


def evaluate(args) -> int:
    net, target = load_for_eval(args, "hierrl", make_net)

    def factory(core):
        sched = HierScheduler(net, core, None)
        return lambda c: sched.step()

    return evaluate_against_seed_baselines(args, target, "HierRL", factory)
