{{/* The objects' base name: <release>-pgrelay, or the release name when it already contains "pgrelay". */}}
{{- define "pgrelay.fullname" -}}
{{- if contains "pgrelay" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-pgrelay" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pgrelay.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: pgrelay
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: include "pgrelay.selector" (list $ "relay") */}}
{{- define "pgrelay.selector" -}}
app.kubernetes.io/name: pgrelay
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "pgrelay.secretName" -}}
{{- .Values.secret.existingSecret | default (include "pgrelay.fullname" .) -}}
{{- end -}}

{{- define "pgrelay.image" -}}
{{- $img := index .root.Values.image .component -}}
{{- printf "%s:%s" $img.repository ($img.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/*
The connection strings, from the Secret: include "pgrelay.secretEnv" (dict "root" $ "keys" (list ...)).
DATABASE_URL is required, and the broker's URL (NATS_URL, AMQP_URL): a pod
without it does not start (a relay without NATS_URL would run an embedded NATS).
*/}}
{{- define "pgrelay.secretEnv" -}}
{{- $root := .root -}}
{{- range .keys }}
{{- $required := or (eq . "DATABASE_URL") (and (eq . "NATS_URL") (eq $root.Values.broker "nats")) (and (eq . "AMQP_URL") (eq $root.Values.broker "rabbitmq")) }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "pgrelay.secretName" $root }}
      key: {{ . }}
      optional: {{ not $required }}
{{- end }}
{{- end -}}

{{/*
A component's env map, sorted by name; a null value is left out. Values files
give numbers as float64: a whole one is written as an integer (16777216, not
1.6777216e+07).
*/}}
{{- define "pgrelay.env" -}}
{{- range $name, $value := . }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ $name }}
  value: {{ if and (kindIs "float64" $value) (eq $value (floor $value)) }}{{ int64 $value | toString | quote }}{{ else }}{{ $value | toString | quote }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "pgrelay.scrapeAnnotations" -}}
{{- if .root.Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/* The pods' ServiceAccount: serviceAccount.name, or the chart's name when it creates one, or the namespace's default. */}}
{{- define "pgrelay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "pgrelay.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}
