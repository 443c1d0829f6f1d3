{{- define "faultrouter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "faultrouter.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "faultrouter.labels" -}}
{{ include "faultrouter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "faultrouter.secretName" -}}
{{- default (include "faultrouter.fullname" .) .Values.kafka.existingSecret -}}
{{- end -}}

{{- define "faultrouter.hasSecret" -}}
{{- if or .Values.kafka.existingSecret .Values.kafka.user -}}true{{- end -}}
{{- end -}}

{{- define "faultrouter.consoleSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-console
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "faultrouter.consoleSecretName" -}}
{{- default (printf "%s-console" (include "faultrouter.fullname" .)) .Values.console.existingSecret -}}
{{- end -}}

{{- define "faultrouter.registrySecretName" -}}
{{- .Values.schemaRegistry.existingSecret | default (printf "%s-registry" (include "faultrouter.fullname" .)) -}}
{{- end -}}

{{- define "faultrouter.hasRegistrySecret" -}}
{{- if or .Values.schemaRegistry.existingSecret .Values.schemaRegistry.user -}}true{{- end -}}
{{- end -}}
