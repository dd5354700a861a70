{{/* Chart name, shortened to fit a label value. */}}
{{- define "vramfit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Prefix of every object name; leaves room for the longest suffix ("-webhook-tls"). */}}
{{- define "vramfit.fullname" -}}
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

{{- define "vramfit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "vramfit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: vramfit
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "webhook"). */}}
{{- define "vramfit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vramfit.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vramfit.componentLabels" -}}
{{ include "vramfit.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "vramfit.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "vramfit.webhookServiceName" -}}
{{ include "vramfit.fullname" . }}-webhook
{{- end -}}

{{- define "vramfit.collectorServiceName" -}}
{{ include "vramfit.fullname" . }}-collector
{{- end -}}

{{/* What the webhook replicas forward decisions to: the collector Service. */}}
{{- define "vramfit.ledgerUrl" -}}
http://{{ include "vramfit.collectorServiceName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.collector.port }}
{{- end -}}

{{- define "vramfit.tlsSecretName" -}}
{{- if .Values.tls.certManager.enabled -}}
{{ include "vramfit.fullname" . }}-webhook-tls
{{- else -}}
{{ required "tls.secretName is required when tls.certManager.enabled is false" .Values.tls.secretName }}
{{- end -}}
{{- end -}}

{{- define "vramfit.serviceAccountName" -}}
{{- $names := index .root.Values.serviceAccount .component -}}
{{ $names.name | default (printf "%s-%s" (include "vramfit.fullname" .root) .component) }}
{{- end -}}

{{/* The pools.yaml that --pools reads. */}}
{{- define "vramfit.poolsConfig" -}}
headroom_fraction: {{ .Values.headroomFraction }}
pools:
{{- toYaml .Values.pools | nindent 2 }}
{{- end -}}

{{/* Body shared by the mutating and validating webhook entries. */}}
{{- define "vramfit.webhookCommon" -}}
admissionReviewVersions: ["v1"]
sideEffects: NoneOnDryRun
failurePolicy: {{ .Values.webhook.failurePolicy }}
timeoutSeconds: {{ .Values.webhook.timeoutSeconds }}
matchPolicy: Equivalent
namespaceSelector:
  matchExpressions:
    {{- if .Values.webhook.namespaceSelector.optIn }}
    - key: {{ .Values.webhook.namespaceSelector.labelKey }}
      operator: In
      values: [{{ .Values.webhook.namespaceSelector.labelValue | quote }}]
    {{- end }}
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- toYaml (prepend .Values.webhook.namespaceSelector.excludeNamespaces .Release.Namespace | uniq) | nindent 8 }}
{{- if .Values.webhook.matchConditions.enabled }}
{{- $gpu := .Values.webhook.matchConditions.gpuResourceName | quote | replace "\"" "'" }}
matchConditions:
  - name: pods-requesting-gpus
    expression: >-
      request.resource.group != '' || request.resource.resource != 'pods' ||
      (has(object.metadata.annotations) && 'vramfit.io/spec' in object.metadata.annotations) ||
      object.spec.containers.exists(c, has(c.resources) && has(c.resources.limits) &&
      {{ $gpu }} in c.resources.limits)
  - name: batch-jobs-requesting-gpus
    expression: >-
      request.resource.group != 'batch' || request.resource.resource != 'jobs' ||
      (has(object.metadata.annotations) && 'vramfit.io/spec' in object.metadata.annotations) ||
      object.spec.template.spec.containers.exists(c, has(c.resources) && has(c.resources.limits) &&
      {{ $gpu }} in c.resources.limits)
  - name: not-a-controllers-pod
    expression: >-
      request.resource.group != '' || request.resource.resource != 'pods' ||
      !has(object.metadata.ownerReferences) ||
      !object.metadata.ownerReferences.exists(o, has(o.controller) && o.controller)
  - name: not-a-job-of-a-placed-jobset
    expression: >-
      request.resource.group != 'batch' || request.resource.resource != 'jobs' ||
      !has(object.metadata.ownerReferences) ||
      !object.metadata.ownerReferences.exists(o, has(o.controller) && o.controller && o.kind == 'JobSet') ||
      !has(object.spec.template.metadata) || !has(object.spec.template.metadata.annotations) ||
      !('vramfit.io/decision-id' in object.spec.template.metadata.annotations)
{{- end }}
rules:
  {{- range .Values.webhook.rules }}
  - operations: ["CREATE"]
    apiGroups: {{ toJson .apiGroups }}
    apiVersions: {{ toJson .apiVersions }}
    resources: {{ toJson .resources }}
    scope: Namespaced
  {{- end }}
{{- end -}}

{{/* clientConfig of one webhook; call with (dict "root" $ "path" "/mutate"). */}}
{{- define "vramfit.clientConfig" -}}
clientConfig:
  service:
    name: {{ include "vramfit.webhookServiceName" .root }}
    namespace: {{ .root.Release.Namespace }}
    path: {{ .path }}
    port: 443
  {{- if not .root.Values.tls.certManager.enabled }}
  caBundle: {{ required "tls.caBundle is required when tls.certManager.enabled is false" .root.Values.tls.caBundle }}
  {{- end }}
{{- end -}}

{{- define "vramfit.webhookAnnotations" -}}
{{- if .Values.tls.certManager.enabled -}}
annotations:
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "vramfit.fullname" . }}-webhook
{{- end -}}
{{- end -}}
