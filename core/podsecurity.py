"""The Kubernetes Pod Security Standards as a pure check of a pod spec, plus rlsched's
rule on Secrets.

Creating a TrainingJob must not be more powerful than creating a pod: the operator holds
every worker template to its namespace's standard (baseline or restricted,
https://kubernetes.io/docs/concepts/security/pod-security-standards/) and refuses Secret
references unless allowed (:func:`secret_references`). Fails closed; pure, no I/O.
The controls checked: docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .contract import (
    ANNOTATION_APPARMOR_PREFIX,
    POD_SECURITY_BASELINE,
    POD_SECURITY_LEVELS,
    POD_SECURITY_PRIVILEGED,
    POD_SECURITY_RESTRICTED,
    ShapeError,
)

__all__ = [
    "Violation",
    "RULE_SECRETS",
    "parse_level",
    "check_pod_spec",
    "check_template",
    "secret_references",
    "BASELINE_CAPABILITIES",
    "RESTRICTED_ADD_CAPABILITIES",
    "SAFE_SYSCTLS",
    "SELINUX_TYPES",
    "RESTRICTED_VOLUME_TYPES",
]

#: the level name under which rlsched's own rule (Secrets) reports
RULE_SECRETS = "rlsched"

# ------------------------------------------------------------------ allowed values
#: baseline: capabilities a container may add
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
#: restricted: the one capability a container may add back after dropping ALL
RESTRICTED_ADD_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
#: baseline: the "safe" sysctls (namespaced and isolated from other pods)
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
#: baseline: SELinux types a pod or container may set ("" is the same as unset)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
#: baseline: seccomp and AppArmor profile types that may be set (restricted: must be set)
PROFILE_TYPES = ("RuntimeDefault", "Localhost")
#: restricted: every volume must be one of these
RESTRICTED_VOLUME_TYPES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret")

_CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_HOOKS = ("postStart", "preStop")
_HOST_HANDLERS = ("httpGet", "tcpSocket")
_HOST_NAMESPACES = {"hostNetwork": "network", "hostPID": "process (PID)", "hostIPC": "IPC"}


@dataclass(frozen=True, slots=True)
class Violation:
    """One field of the pod spec that breaks one control."""

    #: the level that introduces the control (``baseline``, ``restricted``) or ``rlsched``
    level: str
    #: the control's name in the standard (``HostPath Volumes``), or ``Shape`` for a field of the wrong type
    control: str
    #: what is wrong, in words
    message: str
    #: the offending field, e.g. ``spec.template.spec.volumes[0].hostPath``
    path: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message} ({self.path})"


def parse_level(value: Any) -> str:
    """A Pod Security Standards level name (``privileged``, ``baseline``, ``restricted``),
    exactly as the namespace label spells it; anything else raises :class:`ShapeError`."""
    if isinstance(value, str) and value in POD_SECURITY_LEVELS:
        return value
    raise ShapeError(f"pod security level: {value!r:.40} is not one of {', '.join(POD_SECURITY_LEVELS)}")


# ------------------------------------------------------------------ reading with fail-closed types
_TYPE_NAMES = {Mapping: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer"}


class _Reader:
    """Reads fields and turns a value of the wrong type into a ``Shape`` violation
    (reported under ``level``) instead of an exception; the value then reads as unset."""

    def __init__(self, level: str) -> None:
        self.level = level
        self.out: list[Violation] = []

    def add(self, level: str, control: str, message: str, path: str) -> None:
        self.out.append(Violation(level, control, message, path))

    def get(self, obj: Mapping, key: str, kind: type, path: str) -> Any:
        v = obj.get(key)
        if v is None:
            return None
        ok = isinstance(v, kind) and not (kind is int and isinstance(v, bool))
        if not ok:
            self.add(self.level, "Shape", f"expected {_TYPE_NAMES[kind]}, got {type(v).__name__}", path)
            return None
        return v

    def objects(self, obj: Mapping, key: str, path: str) -> Iterator[tuple[str, Mapping]]:
        """``(path, item)`` of every object in the list ``obj[key]``."""
        for i, item in enumerate(self.get(obj, key, list, f"{path}.{key}") or ()):
            p = f"{path}.{key}[{i}]"
            if isinstance(item, Mapping):
                yield p, item
            else:
                self.add(self.level, "Shape", f"expected an object, got {type(item).__name__}", p)

    def strings(self, obj: Mapping, key: str, path: str) -> Iterator[tuple[str, str]]:
        """``(path, item)`` of every string in the list ``obj[key]``."""
        for i, item in enumerate(self.get(obj, key, list, f"{path}.{key}") or ()):
            p = f"{path}.{key}[{i}]"
            if isinstance(item, str):
                yield p, item
            else:
                self.add(self.level, "Shape", f"expected a string, got {type(item).__name__}", p)

    def result(self) -> list[Violation]:
        """The violations in the order found, each once."""
        return list(dict.fromkeys(self.out))


@dataclass(frozen=True, slots=True)
class _Container:
    path: str
    body: Mapping
    #: its securityContext ({} when unset) and that field's path
    sc: Mapping
    sc_path: str


@dataclass(frozen=True, slots=True)
class _Pod:
    path: str
    spec: Mapping
    sc: Mapping
    sc_path: str
    containers: tuple[_Container, ...]
    volumes: tuple[tuple[str, Mapping], ...]
    windows: bool


def _read_pod(r: _Reader, spec: Mapping, where: str) -> _Pod:
    sc_path = f"{where}.securityContext"
    containers = []
    for kind in _CONTAINER_KINDS:
        for path, c in r.objects(spec, kind, where):
            csc = f"{path}.securityContext"
            containers.append(_Container(path, c, r.get(c, "securityContext", Mapping, csc) or {}, csc))
    os_ = r.get(spec, "os", Mapping, f"{where}.os") or {}
    return _Pod(
        path=where, spec=spec, sc=r.get(spec, "securityContext", Mapping, sc_path) or {}, sc_path=sc_path,
        containers=tuple(containers), volumes=tuple(r.objects(spec, "volumes", where)),
        windows=r.get(os_, "name", str, f"{where}.os.name") == "windows",
    )


def _contexts(pod: _Pod) -> Iterator[tuple[Mapping, str]]:
    """The pod's securityContext, then every container's: ``(context, path)``."""
    yield pod.sc, pod.sc_path
    for c in pod.containers:
        yield c.sc, c.sc_path


def _nested(r: _Reader, obj: Mapping, key: str, field: str, kind: type, path: str) -> Any:
    """``obj[key][field]`` (``None`` when either is unset)."""
    inner = r.get(obj, key, Mapping, f"{path}.{key}")
    return None if inner is None else r.get(inner, field, kind, f"{path}.{key}.{field}")


# ------------------------------------------------------------------ baseline controls
B = POD_SECURITY_BASELINE  # the level each control below reports under
R = POD_SECURITY_RESTRICTED


def _host_process(r: _Reader, pod: _Pod) -> None:
    for sc, path in _contexts(pod):
        if _nested(r, sc, "windowsOptions", "hostProcess", bool, path):
            r.add(B, "HostProcess", "Windows HostProcess containers are forbidden", f"{path}.windowsOptions.hostProcess")


def _host_namespaces(r: _Reader, pod: _Pod) -> None:
    for key, what in _HOST_NAMESPACES.items():
        if r.get(pod.spec, key, bool, f"{pod.path}.{key}"):
            r.add(B, "Host Namespaces", f"sharing the host's {what} namespace is forbidden", f"{pod.path}.{key}")


def _privileged(r: _Reader, pod: _Pod) -> None:
    for c in pod.containers:
        if r.get(c.sc, "privileged", bool, f"{c.sc_path}.privileged"):
            r.add(B, "Privileged Containers", "privileged containers are forbidden", f"{c.sc_path}.privileged")


def _capabilities_baseline(r: _Reader, pod: _Pod) -> None:
    for c in pod.containers:
        caps = r.get(c.sc, "capabilities", Mapping, f"{c.sc_path}.capabilities") or {}
        for path, cap in r.strings(caps, "add", f"{c.sc_path}.capabilities"):
            if cap not in BASELINE_CAPABILITIES:
                r.add(B, "Capabilities", f"adding capability {cap!r:.40} is forbidden", path)


def _host_path(r: _Reader, pod: _Pod) -> None:
    for path, vol in pod.volumes:
        if vol.get("hostPath") is not None:
            r.add(B, "HostPath Volumes", "hostPath volumes are forbidden", f"{path}.hostPath")


def _host_ports(r: _Reader, pod: _Pod) -> None:
    for c in pod.containers:
        for path, port in r.objects(c.body, "ports", c.path):
            if r.get(port, "hostPort", int, f"{path}.hostPort"):
                r.add(B, "Host Ports", "host ports are forbidden", f"{path}.hostPort")


def _host_probes(r: _Reader, pod: _Pod) -> None:
    def handlers(c: _Container) -> Iterator[tuple[Mapping, str]]:
        for probe in _PROBES:
            p = r.get(c.body, probe, Mapping, f"{c.path}.{probe}")
            if p is not None:
                yield p, f"{c.path}.{probe}"
        hooks = r.get(c.body, "lifecycle", Mapping, f"{c.path}.lifecycle") or {}
        for hook in _HOOKS:
            h = r.get(hooks, hook, Mapping, f"{c.path}.lifecycle.{hook}")
            if h is not None:
                yield h, f"{c.path}.lifecycle.{hook}"

    for c in pod.containers:
        for handler, path in handlers(c):
            for kind in _HOST_HANDLERS:
                if _nested(r, handler, kind, "host", str, path):
                    r.add(B, "Host Probes / Lifecycle Hooks", "probes and lifecycle hooks may not name a host",
                          f"{path}.{kind}.host")


def _apparmor(r: _Reader, pod: _Pod, annotations: Any, annotations_where: str) -> None:
    for sc, path in _contexts(pod):
        kind = _nested(r, sc, "appArmorProfile", "type", str, path)
        if kind is not None and kind not in PROFILE_TYPES:
            r.add(B, "AppArmor", f"AppArmor profile {kind!r:.40} is forbidden; allowed: RuntimeDefault, Localhost",
                  f"{path}.appArmorProfile.type")
    if annotations is None:
        return
    if not isinstance(annotations, Mapping):
        r.add(r.level, "Shape", f"expected an object, got {type(annotations).__name__}", annotations_where)
        return
    for key, value in annotations.items():
        if not (isinstance(key, str) and key.startswith(ANNOTATION_APPARMOR_PREFIX)):
            continue
        path = f"{annotations_where}[{key!r}]"
        if not isinstance(value, str):
            r.add(r.level, "Shape", f"expected a string, got {type(value).__name__}", path)
        elif value != "runtime/default" and not value.startswith("localhost/"):
            r.add(B, "AppArmor", f"AppArmor profile {value!r:.40} is forbidden; allowed: runtime/default, localhost/*",
                  path)


def _selinux(r: _Reader, pod: _Pod) -> None:
    for sc, path in _contexts(pod):
        opts = r.get(sc, "seLinuxOptions", Mapping, f"{path}.seLinuxOptions")
        if opts is None:
            continue
        p = f"{path}.seLinuxOptions"
        kind = r.get(opts, "type", str, f"{p}.type")
        if kind is not None and kind not in SELINUX_TYPES:
            r.add(B, "SELinux", f"SELinux type {kind!r:.40} is forbidden", f"{p}.type")
        for key in ("user", "role"):
            if r.get(opts, key, str, f"{p}.{key}"):
                r.add(B, "SELinux", f"a custom SELinux {key} is forbidden", f"{p}.{key}")


def _proc_mount(r: _Reader, pod: _Pod) -> None:
    for c in pod.containers:
        kind = r.get(c.sc, "procMount", str, f"{c.sc_path}.procMount")
        if kind is not None and kind != "Default":
            r.add(B, "/proc Mount Type", f"procMount {kind!r:.40} is forbidden; allowed: Default", f"{c.sc_path}.procMount")


def _seccomp_baseline(r: _Reader, pod: _Pod) -> None:
    for sc, path in _contexts(pod):
        kind = _nested(r, sc, "seccompProfile", "type", str, path)
        if kind is not None and kind not in PROFILE_TYPES:
            r.add(B, "Seccomp", f"seccomp profile {kind!r:.40} is forbidden; allowed: RuntimeDefault, Localhost",
                  f"{path}.seccompProfile.type")


def _sysctls(r: _Reader, pod: _Pod) -> None:
    for path, sysctl in r.objects(pod.sc, "sysctls", pod.sc_path):
        name = r.get(sysctl, "name", str, f"{path}.name")
        if name is None:
            r.add(B, "Sysctls", "a sysctl without a name is forbidden", f"{path}.name")
        elif name not in SAFE_SYSCTLS:
            r.add(B, "Sysctls", f"sysctl {name!r:.60} is not in the safe set", f"{path}.name")


# ------------------------------------------------------------------ restricted controls
def _volume_types(r: _Reader, pod: _Pod) -> None:
    for path, vol in pod.volumes:
        sources = [k for k, v in vol.items() if k != "name" and v is not None]
        if "hostPath" in sources:
            continue  # baseline reported it
        other = [k for k in sources if k not in RESTRICTED_VOLUME_TYPES]
        for k in other:
            r.add(R, "Volume Types", f"{str(k)[:40]} volumes are forbidden; allowed: {', '.join(RESTRICTED_VOLUME_TYPES)}",
                  f"{path}.{k}")
        if not other and not sources:
            r.add(R, "Volume Types", f"a volume must be one of {', '.join(RESTRICTED_VOLUME_TYPES)}", path)


def _privilege_escalation(r: _Reader, pod: _Pod) -> None:
    for c in pod.containers:
        if r.get(c.sc, "allowPrivilegeEscalation", bool, f"{c.sc_path}.allowPrivilegeEscalation") is not False:
            r.add(R, "Privilege Escalation", "allowPrivilegeEscalation must be false",
                  f"{c.sc_path}.allowPrivilegeEscalation")


def _run_as_non_root(r: _Reader, pod: _Pod) -> None:
    pod_value = r.get(pod.sc, "runAsNonRoot", bool, f"{pod.sc_path}.runAsNonRoot")
    if pod_value is False:
        r.add(R, "Running as Non-root", "runAsNonRoot must be true", f"{pod.sc_path}.runAsNonRoot")
    for c in pod.containers:
        v = r.get(c.sc, "runAsNonRoot", bool, f"{c.sc_path}.runAsNonRoot")
        if v is False:
            r.add(R, "Running as Non-root", "runAsNonRoot must be true", f"{c.sc_path}.runAsNonRoot")
        elif v is None and pod_value is None:  # a pod-level false is reported once, above
            r.add(R, "Running as Non-root", "runAsNonRoot must be true, on the container or the pod",
                  f"{c.sc_path}.runAsNonRoot")


def _run_as_user(r: _Reader, pod: _Pod) -> None:
    for sc, path in _contexts(pod):
        if r.get(sc, "runAsUser", int, f"{path}.runAsUser") == 0:
            r.add(R, "Running as Non-root user", "runAsUser 0 (root) is forbidden", f"{path}.runAsUser")


def _seccomp_restricted(r: _Reader, pod: _Pod) -> None:
    pod_kind = _nested(r, pod.sc, "seccompProfile", "type", str, pod.sc_path)
    for c in pod.containers:
        kind = _nested(r, c.sc, "seccompProfile", "type", str, c.sc_path)
        if kind is None and pod_kind is None:  # a value set but not allowed is baseline's
            r.add(R, "Seccomp", "seccompProfile.type must be RuntimeDefault or Localhost, on the container or the pod",
                  f"{c.sc_path}.seccompProfile.type")


def _capabilities_restricted(r: _Reader, pod: _Pod) -> None:
    for c in pod.containers:
        path = f"{c.sc_path}.capabilities"
        caps = r.get(c.sc, "capabilities", Mapping, path) or {}
        if "ALL" not in [cap for _, cap in r.strings(caps, "drop", path)]:
            r.add(R, "Capabilities", "capabilities.drop must include ALL", f"{path}.drop")
        for p, cap in r.strings(caps, "add", path):
            if cap in BASELINE_CAPABILITIES and cap not in RESTRICTED_ADD_CAPABILITIES:  # others are baseline's
                r.add(R, "Capabilities", f"adding capability {cap!r} is forbidden; allowed: NET_BIND_SERVICE", p)


# ------------------------------------------------------------------ entry points
def check_pod_spec(
    spec: Any,
    level: str,
    *,
    annotations: Any = None,
    where: str = "spec.template.spec",
    annotations_where: str = "spec.template.metadata.annotations",
) -> list[Violation]:
    """Every violation of the Pod Security Standard ``level`` in the pod spec ``spec``
    (and in the pod's ``annotations``, for AppArmor); ``[]`` when it complies.
    ``where`` prefixes the field paths."""
    level = parse_level(level)
    if not isinstance(spec, Mapping):
        raise ShapeError(f"{where}: expected an object, got {type(spec).__name__}")
    if level == POD_SECURITY_PRIVILEGED:
        return []
    r = _Reader(level)
    pod = _read_pod(r, spec, where)
    for control in (_host_process, _host_namespaces, _privileged, _capabilities_baseline, _host_path, _host_ports,
                    _host_probes, _selinux, _proc_mount, _seccomp_baseline, _sysctls):
        control(r, pod)
    _apparmor(r, pod, annotations, annotations_where)
    if level == POD_SECURITY_RESTRICTED:
        _volume_types(r, pod)
        _run_as_non_root(r, pod)
        _run_as_user(r, pod)
        if not pod.windows:
            _privilege_escalation(r, pod)
            _seccomp_restricted(r, pod)
            _capabilities_restricted(r, pod)
    return r.result()


def check_template(template: Any, level: str, *, where: str = "spec.template") -> list[Violation]:
    """:func:`check_pod_spec` of a pod template (``{"metadata": ..., "spec": ...}``, the
    TrainingJob's ``spec.template``)."""
    if not isinstance(template, Mapping):
        raise ShapeError(f"{where}: expected an object, got {type(template).__name__}")
    meta = template.get("metadata")
    bad_meta = meta is not None and not isinstance(meta, Mapping)
    out = check_pod_spec(template.get("spec"), level, annotations=None if bad_meta else (meta or {}).get("annotations"),
                         where=f"{where}.spec", annotations_where=f"{where}.metadata.annotations")
    if bad_meta and level != POD_SECURITY_PRIVILEGED:
        out.append(Violation(level, "Shape", f"expected an object, got {type(meta).__name__}", f"{where}.metadata"))
    return out


def secret_references(spec: Any, *, where: str = "spec.template.spec") -> list[Violation]:
    """Every place the pod spec reads a Secret: Secret volumes, projected Secret sources,
    env ``valueFrom.secretKeyRef`` and ``envFrom.secretRef``, in every container kind.
    Reported under :data:`RULE_SECRETS` (rlsched's rule, not the standard's)."""
    if not isinstance(spec, Mapping):
        raise ShapeError(f"{where}: expected an object, got {type(spec).__name__}")
    r = _Reader(RULE_SECRETS)
    control = "Secrets"

    def name_of(ref: Any, key: str) -> str:
        v = ref.get(key) if isinstance(ref, Mapping) else None
        return f"Secret {v!r:.80}" if isinstance(v, str) else "a Secret"

    for path, vol in r.objects(spec, "volumes", where):
        secret = vol.get("secret")
        if secret is not None:
            r.add(RULE_SECRETS, control, f"mounting {name_of(secret, 'secretName')} is refused", f"{path}.secret")
        projected = r.get(vol, "projected", Mapping, f"{path}.projected") or {}
        for p, source in r.objects(projected, "sources", f"{path}.projected"):
            if source.get("secret") is not None:
                r.add(RULE_SECRETS, control, f"projecting {name_of(source['secret'], 'name')} is refused", f"{p}.secret")
    for kind in _CONTAINER_KINDS:
        for cpath, c in r.objects(spec, kind, where):
            for p, env in r.objects(c, "env", cpath):
                ref = _nested(r, env, "valueFrom", "secretKeyRef", Mapping, p)
                if ref is not None:
                    r.add(RULE_SECRETS, control, f"reading {name_of(ref, 'name')} into the environment is refused",
                          f"{p}.valueFrom.secretKeyRef")
            for p, src in r.objects(c, "envFrom", cpath):
                ref = r.get(src, "secretRef", Mapping, f"{p}.secretRef")
                if ref is not None:
                    r.add(RULE_SECRETS, control, f"reading {name_of(ref, 'name')} into the environment is refused",
                          f"{p}.secretRef")
    return r.result()

