{{- define "kvscope.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvscope.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvscope.monitoringLabels" -}}
{{ include "kvscope.labels" . }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kvscope.nodeSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end -}}

{{- define "kvscope.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The restricted Pod Security profile of a container that needs nothing of the host. */}}
{{- define "kvscope.restrictedContainer" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
The sidecar, as an init container with restartPolicy: Always (a native sidecar, Kubernetes >= 1.29): it
starts before the engine, stops after it, and its probes never touch the pod's readiness. It needs no
host access and passes the restricted Pod Security profile. Startup and liveness probe /health, which
answers without rendering the metrics; there is deliberately no readiness probe (a native sidecar's
readiness counts towards the pod's, and an inference pod must not leave its Service because of the agent).
*/}}
{{- define "kvscope.sidecarContainer" -}}
name: kvscope
image: {{ include "kvscope.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
restartPolicy: Always
args: ["run", "--config=/etc/kvscope/kvscope.toml"]
ports:
  - {name: kvscope-metrics, containerPort: {{ .Values.sidecar.port }}}
startupProbe:
  httpGet: {path: /health, port: kvscope-metrics}
  periodSeconds: 2
  timeoutSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet: {path: /health, port: kvscope-metrics}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
resources:
  requests: {cpu: 100m, memory: 128Mi}
  limits: {cpu: "1", memory: 512Mi}
securityContext:
  {{- include "kvscope.restrictedContainer" . | nindent 2 }}
volumeMounts:
  - {name: kvscope-config, mountPath: /etc/kvscope, readOnly: true}
  - {name: kvscope-tmp, mountPath: /tmp}
{{- end -}}
