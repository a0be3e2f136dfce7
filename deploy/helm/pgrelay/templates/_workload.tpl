{{/*
The relay's and the consumer's Deployment, Service and PodDisruptionBudget:
include "pgrelay.workload" (dict "root" $ "component" "relay" "keys" (list ...)).
*/}}
{{- define "pgrelay.workload" -}}
{{- $root := .root -}}
{{- $c := .component -}}
{{- $v := index $root.Values $c -}}
{{- $name := printf "%s-%s" (include "pgrelay.fullname" $root) $c -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "pgrelay.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $c }}
spec:
  replicas: {{ $v.replicas }}
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
  selector:
    matchLabels:
      {{- include "pgrelay.selector" (list $root $c) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "pgrelay.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $c }}
        {{- with $v.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- $ann := merge (dict) ($v.podAnnotations | default dict) (include "pgrelay.scrapeAnnotations" (dict "root" $root "port" $v.metricsPort) | fromYaml | default dict) }}
      {{- with $ann }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
      serviceAccountName: {{ include "pgrelay.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ $c }}
          image: {{ include "pgrelay.image" (dict "root" $root "component" $c) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["/usr/local/bin/{{ $c }}"]
          args: ["run"]
          env:
            - name: PGRELAY_BROKER
              value: {{ $root.Values.broker | quote }}
            - name: METRICS_ADDR
              value: ":{{ $v.metricsPort }}"
            {{- include "pgrelay.secretEnv" (dict "root" $root "keys" .keys) | trim | nindent 12 }}
            {{- include "pgrelay.env" $v.env | trim | nindent 12 }}
          ports:
            - name: metrics
              containerPort: {{ $v.metricsPort }}
              protocol: TCP
          livenessProbe:
            httpGet: {path: /livez, port: metrics}
            initialDelaySeconds: 10
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          readinessProbe:
            # The database and the broker each checked within 2s.
            httpGet: {path: /readyz, port: metrics}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 3
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}-metrics
  labels:
    {{- include "pgrelay.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $c }}
spec:
  type: ClusterIP
  selector:
    {{- include "pgrelay.selector" (list $root $c) | nindent 4 }}
  ports:
    - name: metrics
      port: {{ $v.metricsPort }}
      targetPort: metrics
      protocol: TCP
{{- if and $v.pdb.enabled (ge (int $v.replicas) 2) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  labels:
    {{- include "pgrelay.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $c }}
spec:
  minAvailable: {{ $v.pdb.minAvailable }}
  selector:
    matchLabels:
      {{- include "pgrelay.selector" (list $root $c) | nindent 6 }}
{{- end }}
{{- end -}}
