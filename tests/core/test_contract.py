"""The pure parser of Kubernetes shapes: quantities, pod GPU requests, node GPUs."""

from fractions import Fraction
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.core.contract import (
    LABEL_GPU_COUNT,
    MAX_GPUS,
    PRIORITY_CLASSES,
    RESOURCE_GPU,
    ShapeError,
    class_rank,
    gpu_count,
    node_gpus,
    node_shape,
    parse_quantity,
    pod_gpus,
    whole_number,
)


def test_class_rank_serves_the_more_important_class_first():
    assert [class_rank(c) for c in PRIORITY_CLASSES] == [2, 1, 0]
    assert sorted(PRIORITY_CLASSES, key=class_rank, reverse=True) == ["highest", "urgent", "normal"]
    for bad in ("Highest", "", None):
        with pytest.raises(ValueError, match="unknown priority class"):
            class_rank(bad)


@pytest.mark.parametrize(
    "text, value",
    [
        ("4", 4),
        ("0", 0),
        (" 2 ", 2),
        ("+3", 3),
        ("-1", -1),
        ("1.5", Fraction(3, 2)),
        ("1.", 1),
        (".5", Fraction(1, 2)),
        ("500m", Fraction(1, 2)),
        ("2000m", 2),
        ("4k", 4000),
        ("2M", 2_000_000),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),  # exa, not an exponent
        ("1Ki", 1024),
        ("1.5Ki", 1536),
        ("2Mi", 2 * 2**20),
        ("1Gi", 2**30),
        ("1Ei", 2**60),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1e+3", 1000),
        ("15e-1", Fraction(3, 2)),
        ("0.1", Fraction(1, 10)),  # exact, not the nearest float
        (7, 7),
        (2.0, 2),
        (0.5, Fraction(1, 2)),
    ],
)
def test_quantity_grammar(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "bad",
    ["", " ", "abc", "1e", "e3", "1kk", "1 k", "1.2.3", "Ki", "1KI", "1ki", "1K", "1m3", "--1", "1e1.5", "١",
     "1e100000", "1" * 100, True, None, [], {}, float("nan"), float("inf")],
)
def test_not_a_quantity(bad):
    with pytest.raises(ShapeError):
        parse_quantity(bad, "x")


def test_errors_name_the_field():
    with pytest.raises(ShapeError, match=r"^spec\.gpus: 'abc' is not a quantity"):
        parse_quantity("abc", "spec.gpus")


@pytest.mark.parametrize("text, n", [("4", 4), (4, 4), (4.0, 4), ("4k", 4000), ("1Ki", 1024), ("1e3", 1000),
                                     ("2000m", 2), ("0", 0), (str(MAX_GPUS), MAX_GPUS)])
def test_gpu_count(text, n):
    assert gpu_count(text) == n


@pytest.mark.parametrize(
    "bad, message",
    [
        ("500m", "not a whole number of GPUs"),
        ("1.5", "not a whole number of GPUs"),
        (1.5, "not a whole number of GPUs"),
        ("x", "not a whole number of GPUs"),
        (None, "not a whole number of GPUs"),
        (True, "got a boolean"),
        (-1, "out of range"),
        ("-1", "out of range"),
        ("1e7", "out of range"),
        ("9999999", "out of range"),
        ("٣", "not a whole number of GPUs"),
    ],
)
def test_gpu_count_refuses(bad, message):
    with pytest.raises(ShapeError, match=message):
        gpu_count(bad, "gpus")


def test_whole_number_is_plain_digits():
    assert whole_number("3", "a") == whole_number(3, "a") == whole_number(3.0, "a") == 3
    for bad in ("3k", "1e3", "-1", "1.5", "", "٣", True, None):
        with pytest.raises(ShapeError):
            whole_number(bad, "a")


def container(requests=None, limits=None):
    res = {}
    if requests is not None:
        res["requests"] = {RESOURCE_GPU: requests, "cpu": "500m"}
    if limits is not None:
        res["limits"] = {RESOURCE_GPU: limits, "memory": "1Gi"}
    return {"name": "c", "resources": res}


def pod(*containers, init=()):
    spec = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "p"}, "spec": spec}


def test_pod_gpus_sums_containers():
    assert pod_gpus(pod(container("1"), container(limits=2), {"name": "sidecar"})) == 3


def test_pod_gpus_limits_only_and_requests_first():
    assert pod_gpus(pod(container(limits="4"))) == 4
    assert pod_gpus(pod(container(requests="2", limits="2"))) == 2
    assert pod_gpus(pod(container(requests="1", limits="3"))) == 1  # requests, as kube-scheduler counts


def test_pod_gpus_init_containers_by_the_effective_request_rule():
    # max(sum(containers), max(initContainers))
    assert pod_gpus(pod(container("1"), container("2"), init=[container("4"), container("1")])) == 4
    assert pod_gpus(pod(container("2"), container("2"), init=[container("3")])) == 4
    assert pod_gpus(pod(init=[container("2")])) == 2


def test_pod_gpus_of_pods_without_gpus():
    assert pod_gpus({}) == 0
    assert pod_gpus(pod({"name": "c"}, {"name": "d", "resources": {"limits": {"cpu": "1"}}})) == 0


def test_pod_gpus_quantities():
    assert pod_gpus(pod(container("4k"))) == 4000
    assert pod_gpus(pod(container("1e3"))) == 1000
    with pytest.raises(ShapeError, match=r"Pod\.spec\.containers\[1\]\.resources\.limits\['nvidia\.com/gpu'\]: "
                                         r"'500m' is not a whole number of GPUs"):
        pod_gpus(pod(container("1"), container(limits="500m")))
    with pytest.raises(ShapeError, match=r"initContainers\[0\]"):
        pod_gpus(pod(container("1"), init=[container("-1")]))


@pytest.mark.parametrize(
    "bad, where",
    [
        ([], "Pod: expected an object"),
        ({"spec": []}, "Pod.spec: expected dict"),
        ({"spec": {"containers": "x"}}, "Pod.spec.containers: expected list"),
        ({"spec": {"containers": ["x"]}}, r"Pod.spec.containers\[0\]: expected an object"),
        ({"spec": {"containers": [{"resources": {"limits": []}}]}}, r"containers\[0\].resources.limits: expected dict"),
    ],
)
def test_pod_of_the_wrong_shape(bad, where):
    with pytest.raises(ShapeError, match=where):
        pod_gpus(bad)


def test_mapping_views_read_like_dicts():
    p = MappingProxyType({"spec": MappingProxyType({"containers": [MappingProxyType(container("2"))]})})
    assert pod_gpus(p) == 2


def node(allocatable=None, capacity=None, labels=None, name="n1"):
    status = {}
    if allocatable is not None:
        status["allocatable"] = allocatable
    if capacity is not None:
        status["capacity"] = capacity
    return {"metadata": {"name": name, "labels": labels or {}}, "status": status}


def test_node_gpus_allocatable_then_capacity_then_gfd_label():
    assert node_gpus(node({RESOURCE_GPU: "8", "cpu": "32"}, {RESOURCE_GPU: "10"})) == 8
    assert node_gpus(node({"cpu": "32"}, {RESOURCE_GPU: "4"})) == 4
    assert node_gpus(node({"cpu": "32"}, labels={LABEL_GPU_COUNT: "2"})) == 2
    assert node_gpus(node({"cpu": "32"})) == 0
    assert node_gpus(node({RESOURCE_GPU: "0"}, labels={LABEL_GPU_COUNT: "8"})) == 0


def test_node_shape():
    labels = {"topology.rlsched.dev/rack": "r1", "nvidia.com/gpu.product": "H100"}
    shape = node_shape(node({RESOURCE_GPU: "8"}, labels=labels))
    assert (shape.name, shape.labels, shape.gpus) == ("n1", labels, 8)
    with pytest.raises(ShapeError, match="metadata.name"):
        node_shape(node({RESOURCE_GPU: "8"}, name=""))
    with pytest.raises(ShapeError, match=r"labels\['a'\]: expected a string"):
        node_shape(node({RESOURCE_GPU: "8"}, labels={"a": 1}))
    with pytest.raises(ShapeError, match=r"status.allocatable\['nvidia.com/gpu'\]: '1.5' is not a whole number"):
        node_shape(node({RESOURCE_GPU: "1.5"}))


@given(st.integers(0, MAX_GPUS))
def test_integers_round_trip_in_every_spelling(n):
    assert gpu_count(n) == gpu_count(str(n)) == gpu_count(f"{n}000m") == gpu_count(f" {n}.0 ") == n
    if n % 1000 == 0:
        assert gpu_count(f"{n // 1000}k") == n
    if n % 1024 == 0:
        assert gpu_count(f"{n // 1024}Ki") == n


@given(st.text(alphabet="0123456789", min_size=1, max_size=20))
def test_plain_digits_count_as_the_grammar_reads_them(text):
    """gpu_count's shortcut for plain digits gives what the quantity grammar gives."""
    q = parse_quantity(text)
    if q <= MAX_GPUS:
        assert gpu_count(text) == int(q)
    else:
        with pytest.raises(ShapeError, match="out of range"):
            gpu_count(text)


@given(st.text(max_size=12))
def test_any_text_is_a_quantity_or_a_shape_error(text):
    try:
        q = parse_quantity(text)
    except ShapeError:
        return
    assert isinstance(q, Fraction)
