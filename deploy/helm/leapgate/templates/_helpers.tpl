{{/* The chart's name. */}}
{{- define "leapgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, used for every object. */}}
{{- define "leapgate.fullname" -}}
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

{{/* Labels of every object. */}}
{{- define "leapgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "leapgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the pods. */}}
{{- define "leapgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "leapgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The service account's name. */}}
{{- define "leapgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "leapgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding REDIS_AUTH, if any. */}}
{{- define "leapgate.redisSecret" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else if .Values.redis.auth }}
{{- printf "%s-redis" (include "leapgate.fullname" .) }}
{{- end }}
{{- end }}

{{- define "leapgate.feedsSecret" -}}
{{- if .Values.feeds.existingSecret }}
{{- .Values.feeds.existingSecret }}
{{- else if .Values.feeds.token }}
{{- printf "%s-feeds" (include "leapgate.fullname" .) }}
{{- end }}
{{- end }}
