{{/*
Names and labels shared by every template. Kubernetes names and label values are at most
63 characters: everything is cut there, without a trailing dash.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "ballast.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else the release name followed
by the chart name unless the release name already contains it ("ballast" gives "ballast",
"prod" gives "prod-ballast").
*/}}
{{- define "ballast.fullname" -}}
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

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "ballast.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* What selects this release's objects. */}}
{{- define "ballast.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ballast.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels of every object. */}}
{{- define "ballast.labels" -}}
helm.sh/chart: {{ include "ballast.chart" . }}
{{ include "ballast.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ballast
{{- end }}

{{/* What selects the operator's pods (the Deployment, its Service, anti-affinity). */}}
{{- define "ballast.operatorSelectorLabels" -}}
{{ include "ballast.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The labels of the operator's Deployment, pods and Service. */}}
{{- define "ballast.operatorLabels" -}}
{{ include "ballast.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "ballast.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ballast.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image: repository and tag (the chart's appVersion by default). */}}
{{- define "ballast.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Whether the cluster serves the Prometheus Operator's ServiceMonitors (by kind: a
cluster may have some of its CRDs and not others). */}}
{{- define "ballast.hasMonitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor" }}true{{ end }}
{{- end }}
