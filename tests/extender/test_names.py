"""Kubernetes names as the API server checks them (core.contract), which the extender
requires of everything it keeps: pod names, namespaces, job labels, node names."""

from __future__ import annotations

import pytest

from rlsched.core.contract import ShapeError, dns_label, dns_subdomain, label_value


@pytest.mark.parametrize("name", ["a", "node-00", "w-0.team-a", "0", "a" * 253, "a." * 126 + "a"])
def test_valid_subdomains(name):
    assert dns_subdomain(name) == name


@pytest.mark.parametrize("name", ["", "A", "a_b", "-a", "a-", ".a", "a.", "a..b", "a.-b", "a\n", "ä", " a",
                                  "a" * 254, "n" * 8_000_000, 7, None])
def test_invalid_subdomains(name):
    with pytest.raises(ShapeError) as err:
        dns_subdomain(name, "Pod.metadata.name")
    assert str(err.value).startswith("Pod.metadata.name: ") and len(str(err.value)) < 200


@pytest.mark.parametrize("name, ok", [("team-a", True), ("a" * 63, True), ("a" * 64, False), ("a.b", False),
                                       ("A", False), ("", False)])
def test_labels(name, ok):
    if ok:
        assert dns_label(name) == name
    else:
        with pytest.raises(ShapeError):
            dns_label(name)


@pytest.mark.parametrize("value, ok", [("", True), ("tj", True), ("Tj_1.x-2", True), ("a" * 63, True),
                                        ("a" * 64, False), ("_x", False), ("x-", False), ("a b", False)])
def test_label_values(value, ok):
    if ok:
        assert label_value(value) == value
    else:
        with pytest.raises(ShapeError):
            label_value(value)
