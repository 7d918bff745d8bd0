"""The cycle that strings admission, preemption and scaling together lives once, in
``core/cycle.py`` (``SchedulingCycle``): the gang allocator (which the operator calls
through its one decision call) and the discrete-event engine call it and only translate
its plan. Checked on the source: none
may reach core's ``Admission.plan`` or ``ScalingPlanner.plan`` itself, nor decide a
preemption with admission's ``may_preempt``/``may_evict``/``choose_victims``; the gang
allocator calls ``SchedulingCycle.plan`` once; the operator and the event engine call their
live allocation once and hold no cycle of their own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: the planners only the cycle may drive
PLANNERS = {"Admission", "ScalingPlanner"}
#: where a SchedulingCycle keeps them (``x.cycle.admission.plan(...)`` would go around it)
CYCLE_PARTS = {"admission", "planner"}
#: admission's preemption rules: only the cycle (and admission itself) asks them
PREEMPTION_RULES = {"may_preempt", "may_evict", "choose_victims"}
#: the callers that must go through the cycle
CALLERS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "operator").rglob("*.py")) + [
    "core/gang_allocator.py", "sim/envs.py", "sim/scaling_env.py"] + sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "sim").glob("engine*.py"))
#: the training environments: they drive the event engine, whose cycle decides
TRAINING_ENVS = ("sim/envs.py", "sim/scaling_env.py")


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` of a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id] + parts[::-1])
    return None


def _callee(node: ast.AST) -> str | None:
    """The class or function name a call calls (``Admission(...)``,
    ``planning.Admission(...)`` -> ``Admission``)."""
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        return name.rsplit(".", 1)[-1] if name else None
    return None


def _values(node: ast.AST):
    """What an assignment may bind: the value, each branch of ``a if c else b``."""
    if isinstance(node, ast.IfExp):
        yield from _values(node.body)
        yield from _values(node.orelse)
    elif node is not None:
        yield node


def _assignments(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                yield t, node.value
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            yield node.target, node.value


def bound_to(tree: ast.AST, classes: set[str]) -> set[str]:
    """Dotted names (``self.queues``, ``adm``) bound to an instance of ``classes``, and
    the names they are copied to (``adm = self.queues``)."""
    names: set[str] = set()
    changed = True
    while changed:
        changed = False
        for target, value in _assignments(tree):
            name = _dotted(target)
            if name is None or name in names:
                continue
            if any(_callee(v) in classes or _dotted(v) in names for v in _values(value)):
                names.add(name)
                changed = True
    return names


def direct_plans(source: str, filename: str = "<src>") -> list[str]:
    """``file:line receiver.plan`` for every use of ``.plan`` on core's Admission or
    ScalingPlanner: on a name bound to one, on the class itself (``Admission.plan``), on
    a fresh instance (``Admission(...).plan``), or on a cycle's parts
    (``....admission.plan``, ``....planner.plan``)."""
    tree = ast.parse(source, filename=filename)
    planners = bound_to(tree, PLANNERS)
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr == "plan"):
            continue
        base = node.value
        name = _dotted(base)
        if (name is not None and (name in planners or name in PLANNERS or name.rsplit(".", 1)[-1] in CYCLE_PARTS)) \
                or _callee(base) in PLANNERS:
            bad.append((node.lineno, f"{filename}:{node.lineno} {name or _callee(base) + '(...)'}.plan"))
    return [hit for _, hit in sorted(bad)]


def direct_preemption(source: str, filename: str = "<src>") -> list[str]:
    """``file:line receiver.rule`` for every use of admission's preemption rules
    (:data:`PREEMPTION_RULES`, on any receiver: ``self.admission.choose_victims``,
    ``adm.may_preempt``, ``Admission.may_evict``, ``getattr(x, "choose_victims")``)."""
    tree = ast.parse(source, filename=filename)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PREEMPTION_RULES:
            bad.append((node.lineno, f"{filename}:{node.lineno} {_dotted(node) or '(...).' + node.attr}"))
        elif isinstance(node, ast.Constant) and node.value in PREEMPTION_RULES:
            bad.append((node.lineno, f"{filename}:{node.lineno} {node.value!r}"))
    return [hit for _, hit in sorted(bad)]


def cycle_calls(source: str, method: str = "plan") -> int:
    """How many ``.<method>(...)`` calls go to a name bound to a SchedulingCycle."""
    tree = ast.parse(source)
    cycles = bound_to(tree, {"SchedulingCycle"})
    return sum(1 for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
               and (_dotted(node.func.value) in cycles or _callee(node.func.value) == "SchedulingCycle"))


def test_the_callers_never_drive_the_planners_themselves():
    assert {"operator/controller.py", "sim/engine.py", "sim/engine_allocation.py"} <= set(CALLERS)
    bad = [hit for rel in CALLERS for hit in direct_plans((ROOT / rel).read_text(), rel)]
    assert bad == []


def test_the_callers_never_choose_victims_themselves():
    bad = [hit for rel in CALLERS for hit in direct_preemption((ROOT / rel).read_text(), rel)]
    assert bad == []


def test_the_engine_holds_no_cycle_of_its_own():
    """The event engine has one path: a heuristic is core's gang allocator behind its one
    live-allocation call, so no engine module builds a cycle, an admission or a planner,
    and core's cycle has no step methods left for a caller to drive one at a time."""
    from rlsched.core.cycle import SchedulingCycle

    for path in sorted((ROOT / "sim").glob("engine*.py")):
        tree = ast.parse(path.read_text())
        built = {_callee(node) for node in ast.walk(tree) if isinstance(node, ast.Call)}
        assert not built & {"SchedulingCycle", "Admission", "ScalingPlanner"}, path.name
    steps = {"head", "preempt", "preemption_rounds", "preemption_possible", "scale"}
    assert not steps & set(vars(SchedulingCycle))


def engine_bypasses(source: str, filename: str = "<src>") -> list[str]:
    """``file:line`` of every call of the engine's hand-driven ``start``/``advance``
    (``self.sim.start(...)``, ``sim.advance()``): a start or an event time there would
    skip core's admission and preemption."""
    tree = ast.parse(source, filename=filename)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("start", "advance") and (_dotted(node.func.value) or "").endswith("sim"):
            bad.append(f"{filename}:{node.lineno} {_dotted(node.func)}")
    return bad


def test_the_training_environments_start_jobs_only_through_the_cycle():
    """The DAS environment's agents are the ordering and placement of core's gang
    allocator, the engine's one allocator call (``Simulator.decide`` takes it now);
    neither environment starts a job or moves the clock around the engine's cycle."""
    assert [hit for rel in TRAINING_ENVS for hit in engine_bypasses((ROOT / rel).read_text(), rel)] == []
    tree = ast.parse((ROOT / "sim/envs.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    (engine,) = [c for c in calls if _callee(c) == "Simulator"]
    assert {k.arg for k in engine.keywords} >= {"allocation", "placement"}
    assert not {"ordering", "scaling"} & {k.arg for k in engine.keywords}  # no passes of its own
    assert {"GangAllocator", "LiveAllocation"} <= {_callee(c) for c in calls}
    assert {_dotted(c.func) for c in calls} >= {"self.sim.decide"}
    assert engine_bypasses("self.sim.start(job.id, nodes)\nsim.advance()\n") == ["<src>:1 self.sim.start",
                                                                                "<src>:2 sim.advance"]


def test_the_gang_allocator_calls_the_cycle_once_and_the_operator_the_allocator_once():
    assert cycle_calls((ROOT / "core/gang_allocator.py").read_text()) == 1
    src = (ROOT / "operator/controller.py").read_text()
    assert cycle_calls(src) == 0 and "SchedulingCycle" not in src
    calls = [node for node in ast.walk(ast.parse(src)) if isinstance(node, ast.Call)
             and _dotted(node.func) == "self.allocation.plan"]
    assert len(calls) == 1  # its one decision call


def test_each_engine_adapter_makes_one_decision_call():
    """The interval engine calls its allocator once per decision, the event engine's
    allocation adapter its live allocation once: each only translates around it."""
    def calls(path: str, *names: str, within: str | None = None) -> int:
        tree = ast.parse((ROOT / path).read_text())
        if within is not None:
            tree = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == within)
        return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Call) and _dotted(node.func) in names)

    # the engine's one call, through the one local name (the allocator's, or its
    # one-type-per-job wrapper's for an allocator unaware of GPU types)
    assert calls("sim/interval.py", "allocate", "self.allocator.allocate", within="IntervalSimulator") == 1
    assert calls("sim/engine_allocation.py", "sim.allocation.plan", "self.sim.allocation.plan") == 1
    assert calls("sim/engine.py", "self.allocation.plan") == 0


def test_the_scaling_environment_decides_through_the_one_call():
    """RLPTO's environment runs the event engine to its end with core's gang allocator
    (``allocation=``) and calls none of the engine's step methods: its agents only
    answer the questions of the allocator's planner."""
    tree = ast.parse((ROOT / "sim/scaling_env.py").read_text())
    called = {name for node in ast.walk(tree) if isinstance(node, ast.Call) and (name := _dotted(node.func))}
    step_api = {"start", "advance", "advance_until", "decide", "step", "scale", "scaling_cycle", "allocation_cycle"}
    assert sorted(c for c in called if c.split(".")[0] in ("sim", "self") and ".sim." in f".{c}."
                  and c.rsplit(".", 1)[-1] in step_api) == []
    assert "sim.run" in called and "GangAllocator" in called and "LiveAllocation" in called
    assert "ScalingPlanner" not in (ROOT / "sim/scaling_env.py").read_text()


def test_the_checker_catches_direct_calls():
    src = '''
class Controller:
    def __init__(self, policy, scaling):
        self.queues = Admission(policy, backfill=True)
        self.planner: ScalingPlanner | None = ScalingPlanner(scaling) if scaling else None
        self.scheduling = SchedulingCycle(self.queues, self.planner)

    def cycle(self, w, h, s, r):
        plan = self.queues.plan(w, h, s)
        q = self.queues
        q.plan(w, h, s)
        splan = self.planner.plan(r, s)
        Admission.plan(self.queues, w, h, s)
        Admission(None).plan(w, h, s)
        self.scheduling.admission.plan(w, h, s)
        ok = self.scheduling.plan(w, h, s, running=r)
        fine = self.other.plan()
        also = planning.ScalingPlanner(x).plan
'''
    assert direct_plans(src) == [
        "<src>:9 self.queues.plan",
        "<src>:11 q.plan",
        "<src>:12 self.planner.plan",
        "<src>:13 Admission.plan",
        "<src>:14 Admission(...).plan",
        "<src>:15 self.scheduling.admission.plan",
        "<src>:18 ScalingPlanner(...).plan",
    ]
    assert cycle_calls(src) == 1


def test_the_checker_catches_an_engine_choosing_victims():
    """The event engine before it went through the cycle (issue 25): it asked admission
    for victims itself and drove the planner with the blocked head's reservation."""
    src = '''
class Simulator:
    def __init__(self, ordering, scaling):
        self.admission = Admission(ordering, backfill=False) if ordering is not None else None
        self.planner = ScalingPlanner(scaling) if scaling is not None else None

    def _preempt_once(self, entry, running, free, total, st):
        if not self.admission.may_preempt(entry):
            return False
        victims = self.admission.choose_victims(entry, running, free, total, st)
        return any(self.admission.may_evict(entry, r, st) for r in running)

    def scaling_cycle(self, policy=None):
        planner = self.planner if policy is None else ScalingPlanner(policy)
        return planner.plan(self.elastic_jobs(), self.state, reserved_gpus=0)

    def sneaky(self):
        return getattr(self.admission, "choose_victims")

    def fine(self):
        self.cycle = SchedulingCycle(self.admission, self.planner)
        self.cycle.preemption_possible(True)
        return self.cycle.scale([], self.state)
'''
    assert direct_preemption(src) == [
        "<src>:8 self.admission.may_preempt",
        "<src>:10 self.admission.choose_victims",
        "<src>:11 self.admission.may_evict",
        "<src>:18 'choose_victims'",
    ]
    assert direct_plans(src) == ["<src>:15 planner.plan"]
    assert cycle_calls(src, "scale") == 1 and cycle_calls(src, "preemption_rounds") == 0


def test_the_guard_fails_on_the_engine_of_before():
    """Precise enough for the engine it replaced: the pre-cycle engine's own victim
    search and planner call (as they stood, verbatim excerpts) are caught."""
    old = '''
class Simulator:
    def __init__(self, ordering, scaling):
        self.admission = (
            None if ordering is None
            else Admission(ordering, backfill=self.config.backfill, preemption=self.config.preemption)
        )
        self.planner = ScalingPlanner(scaling) if scaling is not None else None

    def _preempt_once(self) -> bool:
        entry = self._entry(head)
        if not self.admission.may_preempt(entry):
            return False
        victims = self.admission.choose_victims(entry, running, free, total, st)

    def scaling_cycle(self, policy=None):
        planner = self.planner if policy is None else ScalingPlanner(policy)
        plan = planner.plan(running, self.state, reserved_gpus=reserved_gpus(self._blocked_head()), place=self._place_one)
'''
    assert direct_preemption(old) == ["<src>:12 self.admission.may_preempt", "<src>:14 self.admission.choose_victims"]
    assert direct_plans(old) == ["<src>:18 planner.plan"] and cycle_calls(old, "preemption_rounds") == 0


def test_the_engine_starts_and_resizes_jobs_only_through_its_policies():
    """The event engine has no hand-driven steps left: no caller starts, resizes or
    moves a job, or advances the clock without the policies deciding."""
    from rlsched.sim.engine import Simulator

    assert not {"start", "scale", "advance", "fits_now", "scaling_cycle", "elastic_jobs"} & set(vars(Simulator))
    assert {"step", "decide", "run", "advance_until"} <= set(vars(Simulator))
