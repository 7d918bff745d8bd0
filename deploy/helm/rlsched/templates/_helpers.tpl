{{/*
Names. The release is usually installed once per cluster, so the default full name is
"<release>-rlsched" unless the release is already called rlsched.
*/}}
{{- define "rlsched.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlsched.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rlsched.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels; pass a dict with "ctx" (the root context) and "component". */}}
{{- define "rlsched.labels" -}}
helm.sh/chart: {{ include "rlsched.chart" .ctx }}
{{ include "rlsched.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: rlsched
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "rlsched.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlsched.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "rlsched.operator.fullname" -}}
{{- printf "%s-operator" (include "rlsched.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlsched.scheduler.fullname" -}}
{{- printf "%s-scheduler" (include "rlsched.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rlsched.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "rlsched.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "rlsched.scheduler.serviceAccountName" -}}
{{- if .Values.scheduler.serviceAccount.create }}
{{- default (include "rlsched.scheduler.fullname" .) .Values.scheduler.serviceAccount.name }}
{{- else }}
{{- required "scheduler.serviceAccount.name is required when scheduler.serviceAccount.create is false" .Values.scheduler.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* image reference: pass the image dict and the root context. Tag defaults to appVersion. */}}
{{- define "rlsched.image" -}}
{{- $img := .image -}}
{{- $tag := default .ctx.Chart.AppVersion $img.tag -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end }}

{{/* Leader-election lease name of the scheduler (its own; never kube-scheduler's). */}}
{{- define "rlsched.scheduler.leaseName" -}}
{{- default (printf "%s-scheduler" .Values.scheduler.schedulerName) .Values.scheduler.leaderElection.leaseName }}
{{- end }}

{{/* "true" when the operator watches the whole cluster. */}}
{{- define "rlsched.operator.clusterWide" -}}
{{- if .Values.operator.watchNamespace }}false{{ else }}true{{ end }}
{{- end }}

{{/*
The extender's probe, run in its container as `python -I -S -c <this> PATH` (argument:
the extender's port): GET http://127.0.0.1:<port>PATH, exit 0 on 200, else a message.
*/}}
{{- define "rlsched.extender.probe" -}}
import sys, http.client
try:
    c = http.client.HTTPConnection("127.0.0.1", {{ . }}, timeout=4)
    c.request("GET", sys.argv[1])
    status = c.getresponse().status
except OSError as exc:
    sys.exit(f"extender {sys.argv[1]}: {exc}")
sys.exit(0 if status == 200 else f"extender {sys.argv[1]}: HTTP {status}")
{{- end }}
