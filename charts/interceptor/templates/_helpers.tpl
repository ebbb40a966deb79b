{{/*
The labels of every object: linkerd-cni's resource label (Linkerd's proxy injector and its
control-plane lookups skip what carries it), ours (the agent and the installer tell the
DaemonSet is still ours by app.kubernetes.io/name), then commonLabels, which cannot replace
them.
*/}}
{{- define "interceptor.labels" -}}
{{- $labels := dict "linkerd.io/cni-resource" "true" "app.kubernetes.io/name" "interceptor" "app.kubernetes.io/part-of" "interceptor" -}}
{{- toYaml (merge $labels (.Values.commonLabels | default dict)) -}}
{{- end -}}

{{/*
The pod template's labels: the selector's (linkerd-cni's, immutable), the objects' labels,
podLabels and commonLabels, which cannot replace the others.
*/}}
{{- define "interceptor.podLabels" -}}
{{- $labels := dict "k8s-app" "linkerd-cni" "linkerd.io/cni-resource" "true" "app.kubernetes.io/name" "interceptor" "app.kubernetes.io/part-of" "interceptor" -}}
{{- toYaml (merge $labels (.Values.podLabels | default dict) (.Values.commonLabels | default dict)) -}}
{{- end -}}

{{/*
The image every container runs. Without image.name, interceptor's own image as `cargo xtask
image` names it, loaded on each node: no registry has it, so a linkerd2-cni values file's
image.version (a tag of linkerd-cni's image) and pullPolicy Always would name or pull an image
that exists nowhere; they are ignored, and NOTES.txt says so ("interceptor.imageIgnored").
Linkerd's cni-plugin image is linkerd-cni's installer: a linkerd2-cni values file carried over
names it, and it would run here as something it is not.
*/}}
{{- define "interceptor.localImage" -}}
{{- printf "localhost/interceptor:%s" .Chart.AppVersion -}}
{{- end -}}

{{- define "interceptor.image" -}}
{{- if regexMatch "linkerd/cni-plugin([:@].*)?$" .Values.image.name -}}
{{- fail (printf "image.name=%s is Linkerd's cni-plugin image (linkerd-cni's installer), not interceptor's: unset image.name (a linkerd2-cni values file sets it), or set it to where you pushed interceptor's image (cargo xtask image)" .Values.image.name) -}}
{{- end -}}
{{- if .Values.image.name -}}
{{- printf "%s:%s" .Values.image.name (.Values.image.version | default .Chart.AppVersion) -}}
{{- else -}}
{{- include "interceptor.localImage" . -}}
{{- end -}}
{{- end -}}

{{- define "interceptor.imagePullPolicy" -}}
{{- if and (not .Values.image.name) (eq .Values.image.pullPolicy "Always") -}}
IfNotPresent
{{- else -}}
{{- .Values.image.pullPolicy -}}
{{- end -}}
{{- end -}}

{{/* The image values ignored without image.name, one "value=x" a line. */}}
{{- define "interceptor.imageIgnored" -}}
{{- if not .Values.image.name -}}
{{- if and .Values.image.version (ne .Values.image.version .Chart.AppVersion) }}
image.version={{ .Values.image.version }}
{{- end -}}
{{- if eq .Values.image.pullPolicy "Always" }}
image.pullPolicy=Always
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Quoted ports for a JSON list, from a list of ports and comma-separated strings of ports and
ranges ("" adds none), as linkerd2-cni's partials.splitStringList renders them.
*/}}
{{- define "interceptor.portList" -}}
{{- $ports := list -}}
{{- range . -}}
{{- $text := toString . -}}
{{- if $text -}}
{{- range splitList "," $text -}}
{{- $ports = append $ports (quote .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "," $ports -}}
{{- end -}}

{{/*
logLevel, which linkerd-cni gives its plugin in logrus' words, as the installer's tracing
filter: tracing has no panic or fatal level, and says warn.
*/}}
{{- define "interceptor.installerLogLevel" -}}
{{- if has .Values.logLevel (list "panic" "fatal") -}}
error
{{- else if eq .Values.logLevel "warning" -}}
warn
{{- else -}}
{{- .Values.logLevel -}}
{{- end -}}
{{- end -}}
