{{/* Names, labels and the few values derived from others. */}}

{{- define "mmgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Room is left for the longest suffix ("-engine-0" on pods, "-epp" ...). */}}
{{- define "mmgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mmgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "mmgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "engine") */}}
{{- define "mmgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mmgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "mmgate.gateway.name" -}}{{ include "mmgate.fullname" . }}-gateway{{- end -}}
{{- define "mmgate.engine.name" -}}{{ include "mmgate.fullname" . }}-engine{{- end -}}
{{- define "mmgate.epp.name" -}}{{ include "mmgate.fullname" . }}-epp{{- end -}}
{{- define "mmgate.pool.name" -}}{{ include "mmgate.fullname" . }}-pool{{- end -}}

{{/* The model name the gateways require of the engines and clients send. */}}
{{- define "mmgate.servedModel" -}}
{{- default .Values.model .Values.servedModelName -}}
{{- end -}}

{{/* The engines' headless Service as an absolute DNS name (the trailing dot skips the
search-domain lookups a name with fewer than 5 dots would otherwise cost). */}}
{{- define "mmgate.engine.dns" -}}
{{- printf "%s.%s.svc.%s." (include "mmgate.engine.name" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "mmgate.apiKeySecret" -}}
{{- if .Values.gateway.apiKey.existingSecret -}}
{{- .Values.gateway.apiKey.existingSecret -}}
{{- else if .Values.gateway.apiKey.value -}}
{{- include "mmgate.gateway.name" . }}-api-key
{{- end -}}
{{- end -}}

{{- define "mmgate.adminApiKeySecret" -}}
{{- if .Values.gateway.adminApiKey.existingSecret -}}
{{- .Values.gateway.adminApiKey.existingSecret -}}
{{- else if .Values.gateway.adminApiKey.value -}}
{{- include "mmgate.gateway.name" . }}-admin-api-key
{{- end -}}
{{- end -}}

{{/* The engines' grace period: the preStop sleep, the drain, then time to stop the engine. */}}
{{- define "mmgate.engine.grace" -}}
{{- $e := .Values.engine -}}
{{- $floor := add $e.preStopSleepSeconds $e.drainTimeout -}}
{{- if $e.terminationGracePeriodSeconds -}}
{{- if le (int $e.terminationGracePeriodSeconds) (int $floor) -}}
{{- fail (printf "engine.terminationGracePeriodSeconds (%v) must exceed engine.preStopSleepSeconds + engine.drainTimeout (%v): the kubelet would kill engines mid-drain" $e.terminationGracePeriodSeconds $floor) -}}
{{- end -}}
{{- $e.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add $floor 15 -}}
{{- end -}}
{{- end -}}

{{/* Topology spread over nodes (soft): (dict "root" $ "component" "gateway") */}}
{{- define "mmgate.spread" -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "mmgate.selectorLabels" . | nindent 8 }}
{{- end -}}

{{/* Checks that fail the render with a message rather than deploy something broken. */}}
{{- define "mmgate.validate" -}}
{{- if not .Values.model -}}
{{- fail "set `model`: the model the engines load and the gateways serve (e.g. --set model=Qwen/Qwen2-VL-7B-Instruct)" -}}
{{- end -}}
{{- if and .Values.gateway.enabled (not .Values.engine.enabled) (not .Values.gateway.workers) -}}
{{- fail "engine.enabled=false: list the gateways' engines in gateway.workers (grpc://HOST:PORT)" -}}
{{- end -}}
{{- if and .Values.llmd.enabled (not .Values.engine.enabled) -}}
{{- fail "llmd.enabled needs engine.enabled: the InferencePool selects this release's engine pods" -}}
{{- end -}}
{{- if and .Values.workerTls.enabled .Values.llmd.enabled -}}
{{- fail "workerTls.enabled with llmd.enabled: the InferencePool and its endpoint picker speak h2c to the engines" -}}
{{- end -}}
{{- if and .Values.workerTls.enabled (or (not .Values.workerTls.engineSecret) (not .Values.workerTls.gatewaySecret)) -}}
{{- fail "workerTls.enabled needs workerTls.engineSecret (the engines' certificate) and workerTls.gatewaySecret (the CA the gateways trust)" -}}
{{- end -}}
{{- if and .Values.gateway.tls.requireClientCert (not .Values.gateway.tls.secretName) -}}
{{- fail "gateway.tls.requireClientCert needs gateway.tls.secretName (its ca.crt)" -}}
{{- end -}}
{{- if lt (int .Values.engine.preStopSleepSeconds) (int .Values.gateway.dnsInterval) -}}
{{- fail (printf "engine.preStopSleepSeconds (%v) must be at least gateway.dnsInterval (%v): gateways would still route to an engine that stopped taking calls" .Values.engine.preStopSleepSeconds .Values.gateway.dnsInterval) -}}
{{- end -}}
{{- end -}}

{{/* Where the TLS Secrets are mounted in the pods. */}}
{{- define "mmgate.tlsDir" -}}/etc/mmgate/tls{{- end -}}
{{- define "mmgate.workerTlsDir" -}}/etc/mmgate/worker-tls{{- end -}}

{{/* The scheme of the gateways' engine addresses. */}}
{{- define "mmgate.workerScheme" -}}{{ if .Values.workerTls.enabled }}grpcs{{ else }}grpc{{ end }}{{- end -}}

{{/* The gateway's probe: (dict "g" .Values.gateway "path" "/health") */}}
{{- define "mmgate.gateway.probe" -}}
{{- if .g.tls.requireClientCert -}}
tcpSocket:
  port: http
{{- else -}}
httpGet:
  path: {{ .path }}
  port: http
  {{- if .g.tls.secretName }}
  scheme: HTTPS
  {{- end }}
{{- end -}}
{{- end -}}

{{/* The engine's probe: (dict "root" $ "service" "NAME" or "") */}}
{{- define "mmgate.engine.probe" -}}
{{- if .root.Values.workerTls.enabled -}}
tcpSocket:
  port: grpc
{{- else -}}
grpc:
  port: {{ .root.Values.engine.port }}
  {{- with .service }}
  service: {{ . }}
  {{- end }}
{{- end -}}
{{- end -}}
