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

{{/* The operator runs kopf standalone (no leader election, no peering): two operators watching one
namespace would both reconcile its objects. Refuse, at install/upgrade, a release whose operator
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
{{- fail (printf "operator.watchNamespaces: the operator of release %s in namespace %s already watches %s (this release would watch %s); two operators would reconcile the same objects, as the operator runs without leader election. Install this release with --set operator.enabled=false (router only), or set operator.watchNamespaces to namespaces no other operator watches" (get $notes "meta.helm.sh/release-name") (get $notes "meta.helm.sh/release-namespace") (replace "*" "all namespaces" $theirs) (replace "*" "all namespaces" (include "oculis.watched" $))) }}
{{- end }}
{{- if and $.Values.operator.webhook.enabled (eq (get $notes "oculis.dev/webhook") "true") }}
{{- fail (printf "operator.webhook.enabled: the operator of release %s in namespace %s already serves the validating webhook; the operator names its ValidatingWebhookConfiguration oculis.dev, one per cluster, so leave operator.webhook.enabled false in this release" (get $notes "meta.helm.sh/release-name") (get $notes "meta.helm.sh/release-namespace")) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
