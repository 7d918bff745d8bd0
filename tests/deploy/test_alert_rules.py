"""The shipped alerts fire in their scenarios and clear when they should: Prometheus'
own rule engine (``promtool test rules``) evaluates the chart's rules, rendered with
their default thresholds, over series written for each scenario (issue 26 item 5).

* ``RlschedQueueStuck``: the oldest waiting job ages past ``queueStuckSeconds`` (1 h)
  while nothing is admitted — a queue wholly stuck, which ``RlschedQueueWaitHigh``
  (admitted jobs only) never sees — and clears once the job is admitted.
* ``RlschedPolicyFallback``: fires for as long as the extender serves a fallback (its
  model info says ``fallback="true"``), long after the fallback began (the rule it
  replaces, a rate of the fallback counter, cleared 10 minutes after the start), and
  clears when the extender serves its model again.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlsched"


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory):
    from rlsched_dev.demo import shipped_rules
    from rlsched_dev.tools import find_tools

    helm = find_tools() / "helm"
    assert helm.is_file(), f"helm missing from {helm.parent}: run `make tools`"
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump(shipped_rules(helm, CHART), sort_keys=False))
    return path


def _promtool_test(rules_file: Path, tests: list[dict]) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing from PATH: run `make prometheus` (apt-get install prometheus)"
    spec = rules_file.parent / "test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [rules_file.name], "evaluation_interval": "1m", "tests": tests},
                                   sort_keys=False))
    return subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, cwd=rules_file.parent)


STUCK = {
    "interval": "1m",
    # the oldest waiting job ages a minute per minute for 90 min, then is admitted
    "input_series": [{"series": 'rlsched_operator_oldest_pending_seconds{job="rlsched-operator"}',
                      "values": "0+60x90 0x30"}],
    "alert_rule_test": [
        {"eval_time": "59m", "alertname": "RlschedQueueStuck", "exp_alerts": []},  # 3,540 s: below 1 h
        {"eval_time": "64m", "alertname": "RlschedQueueStuck", "exp_alerts": []},  # above, pending (for: 5m)
        {"eval_time": "70m", "alertname": "RlschedQueueStuck", "exp_alerts": [{
            "exp_labels": {"severity": "warning"},
            "exp_annotations": {
                "summary": "A TrainingJob has waited 1h 10m 0s without being admitted.",
                "description": "Unlike RlschedQueueWaitHigh (admitted jobs only) this sees a queue that admits "
                               "nothing at all. `rlsched why JOB` says why the oldest job waits; per team, "
                               "rlsched_queue_oldest_pending_seconds and `kubectl get trainingqueues`."}}]},
        {"eval_time": "95m", "alertname": "RlschedQueueStuck", "exp_alerts": []},  # admitted: cleared
    ],
}

#: the alert as it fires while DAS's model is not served
SERVING_FALLBACK = [{
    "exp_labels": {"severity": "warning", "policy": "das"},
    "exp_annotations": {
        "summary": "The extender serves a fallback instead of its das model.",
        "description": "The model file is missing or corrupt; placement continues with the policy's default "
                       "parameters or the heuristic. Fires for as long as the fallback is served (the model "
                       "info says so), not only when it began."}}]

FALLBACK = {
    "interval": "1m",
    # the extender serves DAS's default parameters for an hour (corrupt model file),
    # then is restarted with a good model
    "input_series": [
        {"series": 'rlsched_extender_model_info{job="rlsched-extender",policy="das",version="none",fallback="true"}',
         "values": "1x60 _x30"},
        {"series": 'rlsched_extender_model_info{job="rlsched-extender",policy="das",version="v3",fallback="false"}',
         "values": "_x60 1x30"},
        {"series": 'rlsched_extender_policy_fallbacks_total{job="rlsched-extender",reason="model_load"}',
         "values": "1x90"},
    ],
    "alert_rule_test": [
        {"eval_time": "5m", "alertname": "RlschedPolicyFallback", "exp_alerts": SERVING_FALLBACK},
        {"eval_time": "55m", "alertname": "RlschedPolicyFallback", "exp_alerts": SERVING_FALLBACK},
        {"eval_time": "70m", "alertname": "RlschedPolicyFallback", "exp_alerts": []},  # its model again
        # the fallback counter that rose once at start is no policy error
        {"eval_time": "55m", "alertname": "RlschedPolicyErrors", "exp_alerts": []},
    ],
}


def test_stuck_queue_alert_fires_and_clears(rules_file):
    out = _promtool_test(rules_file, [STUCK])
    assert out.returncode == 0, out.stdout + out.stderr


def test_fallback_alert_lasts_as_long_as_the_fallback(rules_file):
    out = _promtool_test(rules_file, [FALLBACK])
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_scenarios_can_fail(rules_file):
    """The harness sees a wrong expectation: the stuck alert is not firing at 64 min."""
    wrong = yaml.safe_load(yaml.safe_dump(STUCK))
    wrong["alert_rule_test"][1]["exp_alerts"] = [{"exp_labels": {"severity": "warning"}}]
    out = _promtool_test(rules_file, [wrong])
    assert out.returncode != 0 and "RlschedQueueStuck" in out.stdout + out.stderr
