{{/* The chart's name, overridable. */}}
{{- define "kubetriton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's objects: the release name, with the chart's name unless it holds it. */}}
{{- define "kubetriton.fullname" -}}
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

{{/* The labels of the release's objects: those of the operator, and those of `helm test` (component: test). */}}
{{- define "kubetriton.labels" -}}
{{ include "kubetriton.releaseLabels" . }}
{{ include "kubetriton.selectorLabels" . }}
{{- end }}

{{- define "kubetriton.testLabels" -}}
{{ include "kubetriton.releaseLabels" . }}
{{ include "kubetriton.identityLabels" . }}
app.kubernetes.io/component: test
{{- end }}

{{- define "kubetriton.releaseLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kubetriton.identityLabels" -}}
app.kubernetes.io/name: {{ include "kubetriton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The component label keeps the operator's selector apart from models' pods, which share the instance label's key. */}}
{{- define "kubetriton.selectorLabels" -}}
{{ include "kubetriton.identityLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The names of `helm test`'s objects: its model, its Pod, and the ServiceAccount that both depend on. */}}
{{- define "kubetriton.testModel" -}}
{{- printf "smoke-%s" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubetriton.testName" -}}
{{- printf "%s-test" (include "kubetriton.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kubetriton.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubetriton.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kubetriton.image" -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) }}
{{- end }}

{{/*
The operator's RBAC rules (files/operator-rules.yaml, a copy of kubetriton.operator.rbac.RULES),
split by scope: rules on cluster-scoped resources go into a ClusterRole in every mode; the rest go
into a ClusterRole when every namespace is watched, otherwise into a Role in each watched namespace.
*/}}
{{- define "kubetriton.clusterScopedResources" -}}
{{- list "namespaces" "customresourcedefinitions" | toJson }}
{{- end }}

{{- define "kubetriton.rules" -}}
{{- $clusterScoped := include "kubetriton.clusterScopedResources" . | fromJsonArray }}
{{- $selected := list }}
{{- range .context.Files.Get "files/operator-rules.yaml" | fromYamlArray }}
{{- $cluster := false }}
{{- range .resources }}
{{- if has . $clusterScoped }}{{ $cluster = true }}{{ end }}
{{- end }}
{{- if eq $cluster (eq $.scope "cluster") }}
{{- $selected = append $selected . }}
{{- end }}
{{- end }}
{{- toYaml $selected }}
{{- end }}

{{/* The namespace of the test hook's model: the release's, unless the operator does not watch it. */}}
{{- define "kubetriton.testNamespace" -}}
{{- if or (not .Values.watchNamespaces) (has .Release.Namespace .Values.watchNamespaces) }}
{{- .Release.Namespace }}
{{- else }}
{{- first .Values.watchNamespaces }}
{{- end }}
{{- end }}
