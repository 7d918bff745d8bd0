"""The FGD fragmentation measure against hand-computed values."""

import numpy as np
import pytest

from rlsched.core.fgd import Workload, fragmentation, whole_gpu_free_milli


def test_two_node_example():
    # target workload: half the tasks want 0.5 GPU, half want 2 whole GPUs
    wl = Workload.from_pairs([(0.5, 0.5), (2, 0.5)])
    a = np.array([1000, 300, 0, 0])  # node A: 2 GPUs, one idle, one with 300 free (padded)
    b = np.array([1000, 1000, 0, 600])  # node B: 4 GPUs
    # A, 0.5-GPU task: the 300 share is below 500 -> 300; 2-GPU task: one idle GPU is
    # not enough -> all 1300 free. F_A = 0.5 * 300 + 0.5 * 1300 = 800
    # B, 0.5-GPU task: no free share below 500 except the empty GPU -> 0; 2-GPU task:
    # two idle GPUs host it, the 600 partial share is left over -> 600. F_B = 300
    np.testing.assert_allclose(fragmentation(np.stack([a, b]), wl), [800.0, 300.0])
    assert float(fragmentation(a, wl)) == pytest.approx(800.0)
    # CPU: a 2-GPU task that also needs 8 CPUs cannot go on B with 4 CPUs free
    wl_cpu = Workload(np.array([500, 2000]), np.array([0.5, 0.5]), np.array([0, 8000]))
    np.testing.assert_allclose(
        fragmentation(np.stack([a, b]), wl_cpu, cpu_free=np.array([64000, 4000])), [800.0, 0.5 * 2600]
    )


def test_cpu_only_tasks_see_every_free_gpu_as_fragment():
    wl = Workload.from_pairs([(0, 1.0)])
    assert float(fragmentation(np.array([1000, 250]), wl)) == 1250.0


def test_whole_gpu_nodes():
    fm = whole_gpu_free_milli(np.array([0, 3, 8]), 8)
    assert fm.tolist()[1] == [1000] * 3 + [0] * 5
    wl = Workload.from_pairs([(1, 0.25), (4, 0.75)])
    np.testing.assert_allclose(fragmentation(fm, wl), [0.0, 0.75 * 3000, 0.0])


def test_learned_workload_merges_requests():
    wl = Workload.from_requests([1000, 500, 1000, 2000])
    assert wl.pairs() == [(0.5, 0.25), (1.0, 0.5), (2.0, 0.25)]


@pytest.mark.parametrize(
    "bad",
    [lambda: Workload.from_pairs([]), lambda: Workload.from_pairs([(1.5, 1.0)]),
     lambda: Workload.from_pairs([(1, -1.0)]), lambda: fragmentation(np.array([1200]), Workload.from_pairs([(1, 1)]))],
)
def test_bad_input(bad):
    with pytest.raises(ValueError):
        bad()


from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core.fgd import fragmentation_by_class

demands = st.sampled_from([0, 100, 250, 500, 999, 1000, 2000, 4000, 8000])


@settings(max_examples=100, deadline=None)
@given(
    free=st.lists(st.lists(st.integers(0, 1000), min_size=8, max_size=8), min_size=1, max_size=5),
    classes=st.lists(st.tuples(demands, st.floats(0.01, 1.0), st.sampled_from([0, 0, 4000, 16000])), min_size=1, max_size=6),
    cpu=st.lists(st.integers(0, 20000), min_size=5, max_size=5),
)
def test_table_form_equals_the_definition(free, classes, cpu):
    fm = np.array(free)
    wl = Workload(np.array([c[0] for c in classes]), np.array([c[1] for c in classes]), np.array([c[2] for c in classes]))
    c = np.array(cpu[: len(free)], dtype=float)
    np.testing.assert_allclose(fragmentation(fm, wl, c), fragmentation_by_class(fm, wl, c), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(fragmentation(fm, wl), fragmentation_by_class(fm, wl), rtol=1e-9, atol=1e-6)
