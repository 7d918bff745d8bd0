import pytest

from rlsched.core.batch import BatchBounds
from rlsched.operator.spec import SpecError, parse_spec


def body(**over):
    s = {
        "minWorkers": 2, "maxWorkers": 4, "gpusPerWorker": 2, "beta": 0.01, "maxEpochs": 20,
        "priority": {"class": "urgent", "value": 3},
        "template": {"spec": {"containers": [{"name": "t", "image": "x"}]}},
    }
    s.update(over)
    return s


def test_valid_spec_parses_every_field():
    s = parse_spec(body(workers=3, dataSize=1000, estimatedRuntime=60))
    assert (s.min_workers, s.max_workers, s.gpus_per_worker) == (2, 4, 2)
    assert (s.priority_class, s.priority_value, s.beta, s.max_epochs) == ("urgent", 3.0, 0.01, 20)
    assert (s.pinned_workers, s.data_size, s.estimated_runtime, s.gang_gpus) == (3, 1000, 60.0, 4)


def test_lifecycle_fields_parse_with_job_defaults():
    s = parse_spec(body(batchSize=256, successPolicy="AllWorkers", backoffLimit=0,
                        checkpoint={"path": "/ckpt", "volume": {"persistentVolumeClaim": {"claimName": "c"}}}))
    assert (s.batch_size, s.success_policy, s.backoff_limit) == (256, "AllWorkers", 0)
    d = parse_spec(body())
    assert (d.batch_size, d.success_policy, d.backoff_limit) == (None, "Chief", 6)


def test_batch_bounds_parse_and_are_checked():
    s = parse_spec(body(batchSize=128, maxBatchSize=4096, localBatchSize={"min": 16, "max": 256}))
    assert (s.batch_size, s.max_batch_size, s.local_batch_size) == (128, 4096, (16, 256))
    assert s.bounds == BatchBounds(128, 4096, 16, 256) and parse_spec(body()).bounds is None
    assert parse_spec(body()).local_batch_size == (None, None) and parse_spec(body()).max_batch_size is None
    assert parse_spec(body(suspend=True)).suspend is True and parse_spec(body()).suspend is False
    for over, needle in (({"maxBatchSize": 512}, "needs spec.batchSize"),
                         ({"batchSize": 256, "maxBatchSize": 128}, "must be >= spec.batchSize"),
                         ({"localBatchSize": {"min": 64, "max": 32}}, "localBatchSize.min (64) must be <="),
                         ({"localBatchSize": {"max": 0}}, "localBatchSize.max must be >= 1"),
                         ({"localBatchSize": {"min": 1.5}}, "localBatchSize.min must be an integer"),
                         ({"localBatchSize": 8}, "must be an object"),
                         ({"suspend": "yes"}, "spec.suspend must be true or false")):
        with pytest.raises(SpecError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            parse_spec(body(**over))


def test_a_seed_profile_parses_into_rows_and_each_bad_row_is_named(offline_controller):
    rows = [{"gpuType": "aws", "localBatchSize": 64, "stepTimeSeconds": 0.4},
            {"gpuType": "NVIDIA-A100-SXM4-40GB", "localBatchSize": 64, "stepTimeSeconds": 0.1}]
    s = parse_spec(body(seedProfile=rows))
    assert s.seed_profile == (("aws", 64, 0.4), ("NVIDIA-A100-SXM4-40GB", 64, 0.1))
    assert parse_spec(body()).seed_profile == ()
    with pytest.raises(SpecError) as exc:
        parse_spec(body(seedProfile=[rows[0], {"gpuType": "", "localBatchSize": 0, "stepTimeSeconds": -1}, 3]))
    assert exc.value.problems == [
        "spec.seedProfile[1].gpuType must be a GPU type or product name, got ''",
        "spec.seedProfile[1].localBatchSize must be an integer in 1..16777216, got 0",
        "spec.seedProfile[1].stepTimeSeconds must be a finite number > 0, got -1",
        "spec.seedProfile[2] must be an object {gpuType, localBatchSize, stepTimeSeconds}"]
    # the allocator gets one-GPU samples, a product read through --gpu-types as a node's label is
    ctl = offline_controller(gpu_types={"NVIDIA-A100-SXM4-40GB": "dgx-ext"})
    assert [(p.gpu_type, p.num_replicas, p.num_nodes, p.atomic_bsz, p.step_time)
            for p in ctl.lifecycle.seed_profile(s)] == [("aws", 1, 1, 64, 0.4), ("dgx-ext", 1, 1, 64, 0.1)]


def test_job_name_must_start_with_a_letter_for_its_service():
    with pytest.raises(SpecError, match="must start with a letter"):
        parse_spec(body(), name="1job")


def test_defaults():
    s = parse_spec({"minWorkers": 1, "maxWorkers": 1, "template": {"spec": {"containers": [{}]}}})
    assert (s.gpus_per_worker, s.priority_class, s.beta, s.max_epochs, s.pinned_workers) == (1, "normal", 0.001, 100, None)


@pytest.mark.parametrize(
    "over, needle",
    [
        ({"minWorkers": 5}, "minWorkers (5) must be <= spec.maxWorkers (4)"),
        ({"gpusPerWorker": 0}, "gpusPerWorker must be >= 1"),
        ({"beta": 1.0}, "0 < beta < 1"),
        ({"beta": 0}, "0 < beta < 1"),
        ({"priority": {"class": "vip"}}, "priority.class must be one of"),
        ({"workers": 9}, "spec.workers (9) must lie within"),
        ({"minWorkers": 1.5}, "minWorkers must be an integer"),
        ({"batchSize": 0}, "spec.batchSize must be >= 1"),
        ({"masterPort": 70000}, "spec.masterPort must lie in 1..65535"),
        ({"backoffLimit": -1}, "spec.backoffLimit must be >= 0"),
        ({"successPolicy": "Any"}, "spec.successPolicy must be one of Chief, AllWorkers"),
        ({"checkpoint": {"path": "relative"}}, "spec.checkpoint.path must be an absolute path"),
        ({"checkpoint": {"path": "/c", "volume": {"name": "v", "emptyDir": {}}}}, "must not have a name"),
        ({"checkpoint": {"path": "/c", "volume": {"emptyDir": {}}},
          "template": {"spec": {"containers": [{}], "volumes": [{"name": "rlsched-checkpoint", "emptyDir": {}}]}}},
         "already has a volume named 'rlsched-checkpoint'"),
        ({"template": {"spec": {"containers": [{}], "restartPolicy": "OnFailure"}}}, "restartPolicy is 'OnFailure'"),
        ({"template": {"spec": {"containers": [{}], "hostname": "h"}}}, "hostname and subdomain must be unset"),
        ({"template": {"spec": {"containers": []}}}, "at least one container"),
        ({"template": {"spec": {"schedulerName": "default-scheduler", "containers": [{}]}}}, "schedulerName"),
        ({"template": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}},
         "asks for 4 nvidia.com/gpu but spec.gpusPerWorker is 2"),
        # issue 12 item 6: two containers x 1 GPU, or an 8-GPU init container, with gpusPerWorker 1
        ({"gpusPerWorker": 1, "template": {"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
         "asks for 2 nvidia.com/gpu but spec.gpusPerWorker is 1"),
        ({"gpusPerWorker": 1, "template": {"spec": {
            "containers": [{"name": "a"}],
            "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
         "asks for 8 nvidia.com/gpu but spec.gpusPerWorker is 1"),
        # the template's total matches, but the operator puts the GPUs on the first container
        ({"gpusPerWorker": 1, "template": {"spec": {"containers": [
            {"name": "a"}, {"name": "b", "resources": {"requests": {"nvidia.com/gpu": 1}}}]}}},
         "spec.template.spec.containers[1] asks for 1 nvidia.com/gpu"),
        ({"gpusPerWorker": 2, "template": {"spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
         "containers[1] asks for 1 nvidia.com/gpu"),
    ],
)
def test_invalid_specs_name_the_problem(over, needle):
    with pytest.raises(SpecError) as exc:
        parse_spec(body(**over))
    assert needle in str(exc.value)


def test_all_problems_are_listed():
    with pytest.raises(SpecError) as exc:
        parse_spec(body(minWorkers=9, beta=2.0))
    assert len(exc.value.problems) == 2


def test_missing_spec():
    with pytest.raises(SpecError, match="spec is missing"):
        parse_spec(None)


def test_template_gpus_that_come_out_at_gpus_per_worker_are_valid():
    # GPUs on the first container, an init container asking for no more than a worker has
    s = parse_spec(body(gpusPerWorker=2, template={"spec": {
        "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}}, {"name": "side"}],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}))
    assert s.gpus_per_worker == 2


def test_worker_pod_names_must_be_dns_labels():
    """Issue 12 item 3: a job whose worker pod names exceed 63 characters is refused
    before it holds GPUs (the API server would refuse its pods with 422)."""
    ok = "a" * (63 - len("-worker-3"))  # maxWorkers 4: the last worker is -worker-3
    assert parse_spec(body(), name=ok).max_workers == 4
    with pytest.raises(SpecError, match="worker pod name: .* has 64 characters, more than 63"):
        parse_spec(body(), name=ok + "b")
    with pytest.raises(SpecError, match="more than 63"):
        parse_spec(body(maxWorkers=11), name=ok)  # -worker-10 is one character longer
    with pytest.raises(SpecError, match="more than 63"):
        parse_spec(body(), name="x" * 64)
    # without a name (a spec alone) nothing is said about names
    assert parse_spec(body()).max_workers == 4


def test_worker_cpu_and_memory_are_the_templates_effective_request():
    tmpl = {"spec": {"containers": [{"name": "t", "image": "x", "resources": {"requests": {"cpu": "3", "memory": "8Gi"}}},
                                    {"name": "log", "image": "y", "resources": {"limits": {"cpu": "500m"}}}],
                     "initContainers": [{"name": "fetch", "image": "z", "resources": {"requests": {"cpu": "6"}}}]}}
    s = parse_spec(body(template=tmpl))
    assert (s.cpu_milli, s.memory_mib) == (6000, 8192)  # the init container's 6 cores outweigh 3.5
    v = s.view("ns/j", submit_time=0.0, workers=2, priority=0.0)
    assert (v.cpu_milli, v.memory_mib) == (6000, 8192)  # what admission and placement count
    assert (parse_spec(body()).cpu_milli, parse_spec(body()).memory_mib) == (0, 0)
    bad = {"spec": {"containers": [{"name": "t", "image": "x", "resources": {"requests": {"memory": "a lot"}}}]}}
    with pytest.raises(SpecError, match="memory"):
        parse_spec(body(template=bad))
