import math

import pytest

from rlsched.trainer import ENV_JOB, ENV_NAMESPACE, Reporter


def test_no_job_in_environment_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(ENV_JOB, raising=False)
    monkeypatch.delenv(ENV_NAMESPACE, raising=False)
    with pytest.raises(RuntimeError, match=f"set {ENV_JOB} and {ENV_NAMESPACE}"):
        Reporter(api=object())


def test_job_and_namespace_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_JOB, "resnet")
    monkeypatch.setenv(ENV_NAMESPACE, "team-a")
    r = Reporter(api=object())
    assert (r.job, r.namespace) == ("resnet", "team-a")


@pytest.mark.parametrize("kw", [dict(epoch=-1, loss=1.0, accuracy=0.5), dict(epoch=1, loss=math.nan, accuracy=0.5),
                                dict(epoch=1, loss=1.0, accuracy=math.inf)])
def test_bad_reports_rejected_before_any_api_call(kw):
    # api=object(): any API call would fail with AttributeError, not ValueError
    with pytest.raises(ValueError):
        Reporter("j", "ns", api=object()).report(**kw)


def test_history_limit_validated():
    with pytest.raises(ValueError, match="history_limit"):
        Reporter("j", "ns", api=object(), history_limit=1)
