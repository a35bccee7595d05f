{{- define "oculis.labels" -}}
app.kubernetes.io/name: oculis
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Cluster-scoped objects are shared by every release in the cluster: their names carry the
release namespace, so the same release name can be installed in a second namespace. */}}
{{- define "oculis.clusterName" -}}
{{ .Release.Namespace }}:{{ .Release.Name }}-operator
{{- end }}

{{/* The namespaces the operator watches, as recorded on its ClusterRole: "*" for all. */}}
{{- define "oculis.watched" -}}
{{ if .Values.operator.watchNamespaces }}{{ join "," .Values.operator.watchNamespaces }}{{ else }}*{{ end }}
{{- end }}

{{/* Each release's operator replicas elect a leader among themselves (their own Lease): two
releases' operators watching one namespace would both reconcile its objects. Refuse, at install/upgrade, a release whose operator
would watch a namespace another release's operator already watches (`lookup` sees the cluster
then; `helm template` renders offline and skips this). */}}
{{- define "oculis.refuseSecondOperator" -}}
{{- $mine := splitList "," (include "oculis.watched" .) }}
{{- $self := include "oculis.clusterName" . }}
{{- $roles := lookup "rbac.authorization.k8s.io/v1" "ClusterRole" "" "" }}
{{- range $role := ($roles.items | default list) }}
{{- $notes := $role.metadata.annotations | default dict }}
{{- $theirs := get $notes "oculis.dev/watch-namespaces" }}
{{- if and $theirs (ne $role.metadata.name $self) }}
{{- $overlap := list }}
{{- range $ns := $mine }}
{{- if or (eq $ns "*") (has "*" (splitList "," $theirs)) (has $ns (splitList "," $theirs)) }}
{{- $overlap = append $overlap $ns }}
{{- end }}
{{- end }}
{{- if $overlap }}
{{- fail (printf "operator.watchNamespaces: the operator of release %s in namespace %s already watches %s (this release would watch %s); two operators would reconcile the same objects, as leader election runs only among one release's replicas. Install this release with --set operator.enabled=false (router only), or set operator.watchNamespaces to namespaces no other operator watches" (get $notes "meta.helm.sh/release-name") (get $notes "meta.helm.sh/release-namespace") (replace "*" "all namespaces" $theirs) (replace "*" "all namespaces" (include "oculis.watched" $))) }}
{{- end }}
{{- if and $.Values.operator.webhook.enabled (eq (get $notes "oculis.dev/webhook") "true") }}
{{- fail (printf "operator.webhook.enabled: the operator of release %s in namespace %s already serves the validating webhook; the operator names its ValidatingWebhookConfiguration oculis.dev, one per cluster, so leave operator.webhook.enabled false in this release" (get $notes "meta.helm.sh/release-name") (get $notes "meta.helm.sh/release-namespace")) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Alerting rules over the metrics the operator (oculis_operator_*) and the router (oculis_*)
export; `promtool check rules` runs on them in the tests. `.jump`: escalation-rate factor. */}}
{{- define "oculis.ruleGroups" -}}
groups:
  - name: oculis
    rules:
      - alert: OculisChangeRefused
        expr: sum by (reason) (increase(oculis_operator_refusals_total[10m])) > 0
        labels: {severity: warning}
        annotations:
          summary: "A GPUUpstream engine change was refused ({{ "{{" }} $labels.reason {{ "}}" }})"
          description: "The running Deployment is unchanged; `kubectl get gu -A` shows which upstream is CapacityOK=False and the largest safe settings."
      - alert: OculisUpstreamNotReady
        expr: max(oculis_operator_upstreams{ready="false"}) > 0
        for: 10m
        labels: {severity: warning}
        annotations:
          summary: "{{ "{{" }} $value {{ "}}" }} GPUUpstream(s) not Ready for 10 minutes"
          description: "`kubectl get gu -A` shows READY False and the REASON; their routes fail over or are Degraded."
      - alert: OculisEscalationRateJump
        expr: |
          (sum by (route) (rate(oculis_escalations_total[15m])) / sum by (route) (rate(oculis_requests_total[15m])))
            > {{ .jump }} * (sum by (route) (rate(oculis_escalations_total[1d] offset 15m))
                        / sum by (route) (rate(oculis_requests_total[1d] offset 15m)))
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: "Route {{ "{{" }} $labels.route {{ "}}" }} escalates more than {{ .jump }}x its usual share"
          description: "A tier fails or the classifier's confidence fell (new traffic?): check oculis_upstream_failures_total and `oculis route analyze`."
      - alert: OculisClassifierDrift
        # The expression of the operator's ClassifierDrift condition (InferenceRoute spec.classifierDrift):
        # a tier's share of a route's requests, or the route's escalation rate, over 15m is more than
        # `jump` times the day before (baselines below 2 % count as 2 %, so noise from zero is no drift).
        expr: |
          (sum by (route, tier) (rate(oculis_requests_total[15m]))
            / ignoring (tier) group_left sum by (route) (rate(oculis_requests_total[15m])))
            > {{ .jump }} * clamp_min(sum by (route, tier) (rate(oculis_requests_total[1d] offset 15m))
                        / ignoring (tier) group_left sum by (route) (rate(oculis_requests_total[1d] offset 15m)), 0.02)
          or on (route)
          (sum by (route) (rate(oculis_escalations_total[15m])) / sum by (route) (rate(oculis_requests_total[15m])))
            > {{ .jump }} * clamp_min(sum by (route) (rate(oculis_escalations_total[1d] offset 15m))
                        / sum by (route) (rate(oculis_requests_total[1d] offset 15m)), 0.02)
        for: 15m
        labels: {severity: warning}
        annotations:
          summary: "Route {{ "{{" }} $labels.route {{ "}}" }}: the classifier drifts from its traffic (tier mix or escalations moved {{ .jump }}x)"
          description: "`kubectl get ir {{ "{{" }} $labels.route {{ "}}" }} -o jsonpath='{.status.traffic}'` shows both windows; refit the classifier on recent traffic (oculis classifier fit)."
      - alert: OculisUpstreamFailures
        expr: sum by (upstream, kind) (rate(oculis_upstream_failures_total[5m])) > 0.1
        for: 10m
        labels: {severity: warning}
        annotations:
          summary: "Upstream {{ "{{" }} $labels.upstream {{ "}}" }} fails requests ({{ "{{" }} $labels.kind {{ "}}" }})"
          description: "More than one failure every 10 s after retries; requests fail over to the next tier."
      - alert: OculisCacheErrors
        # The router serves a cache backend error (Redis unreachable or slow) as a miss and goes on, so
        # only this counter shows it: answers are not lost, but every request pays the upstream.
        expr: sum by (backend, op) (rate(oculis_cache_errors_total[5m])) > 0
        for: 5m
        labels: {severity: warning}
        annotations:
          summary: "Response cache backend {{ "{{" }} $labels.backend {{ "}}" }} fails ({{ "{{" }} $labels.op {{ "}}" }})"
          description: "Lookups are served as misses; check the router's Redis (the router log warns every 10 s)."
      - alert: OculisRouterConfigRejected
        expr: sum(increase(oculis_config_reloads_total{result="rejected"}[10m])) > 0
        labels: {severity: warning}
        annotations:
          summary: "The router rejected a new config and keeps serving the last good one"
          description: "The router log names the field; the operator's InferenceRoute status says which route."
{{- end }}

{{/* The operator's rights on namespaced objects: in its ClusterRole when it watches every namespace, else
in a Role in each of operator.watchNamespaces (operator-rbac.yaml). */}}
{{- define "oculis.operatorNamespacedRules" }}
  - apiGroups: [oculis.dev]
    resources: [gpuupstreams, inferenceroutes]
    verbs: [get, list, watch]
  - apiGroups: [oculis.dev]
    resources: [gpuupstreams/status, inferenceroutes/status]
    verbs: [get, patch]
  # delete: only the canary's Deployment and Service (<name>-vllm-canary) once it is promoted, rolled
  # back or superseded; the stable ones go with their GPUUpstream (ownerReferences).
  - apiGroups: [apps]
    resources: [deployments]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [""]
    resources: [services]
    verbs: [get, list, watch, create, patch, update, delete]
  # Router ConfigMaps: deleted when no InferenceRoute names them any more (a route moved away).
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [get, list, watch, create, patch, update, delete]
  - apiGroups: [policy]
    resources: [poddisruptionbudgets]
    verbs: [get, list, watch, create, patch, update]
  # One InferencePool per GPUUpstream where the Gateway API Inference Extension CRD is installed.
  - apiGroups: [inference.networking.k8s.io]
    resources: [inferencepools]
    verbs: [create, patch]
  # Secrets: `get` to see whether an external upstream's apiKeySecretRef key exists (its value is not
  # used) and to read the engines' own keys (oculis-engine-keys) for the adapter sync; `create` for that
  # Secret, `patch` on it alone. Never list or watch: no Secret is read that an upstream does not name.
  - apiGroups: [""]
    resources: [secrets]
    verbs: [get, create]
  - apiGroups: [""]
    resources: [secrets]
    resourceNames: [oculis-engine-keys]
    verbs: [patch]
  # One NetworkPolicy per GPUUpstream (values networkPolicy).
  - apiGroups: [networking.k8s.io]
    resources: [networkpolicies]
    verbs: [get, create, patch]
  - apiGroups: ["", events.k8s.io]
    resources: [events]
    verbs: [create, patch]
{{- end }}
