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

{{/*
The CNI plugin's `linkerd` block, for the installer and the agent (whose repair meshes a pod as
its ADD would have): keys, order and values as linkerd2-cni's chart renders its block for the
same values (templates/cni-plugin.yaml, cni_network_config). Every key not written takes
Linkerd's default; "ipv6" false unless disableIPv6 is false, as Linkerd's default proxy listens
on IPv4 only. A port list linkerd-cni would read only in part is refused
(interceptor.checkPortList).
*/}}
{{- define "interceptor.linkerdBlock" -}}
{{- include "interceptor.checkPortList" (list "ignoreInboundPorts" .Values.ignoreInboundPorts) -}}
{{- include "interceptor.checkPortList" (list "ignoreOutboundPorts" .Values.ignoreOutboundPorts) -}}
{
  "incoming-proxy-port": {{ int64 .Values.inboundProxyPort }},
  "outgoing-proxy-port": {{ int64 .Values.outboundProxyPort }},
  "proxy-uid": {{ int64 .Values.proxyUID }},
  {{- if ge (int64 .Values.proxyGID) 0 }}
  "proxy-gid": {{ int64 .Values.proxyGID }},
  {{- end }}
  "ports-to-redirect": [{{ .Values.portsToRedirect }}],
  "inbound-ports-to-ignore": [{{ include "interceptor.portList" (list .Values.proxyAdminPort .Values.proxyControlPort .Values.ignoreInboundPorts) }}],
  {{- with .Values.ignoreOutboundPorts }}
  "outbound-ports-to-ignore": [{{ include "interceptor.portList" (list .) }}],
  {{- end }}
  "simulate": false,
  "use-wait-flag": {{ .Values.useWaitFlag }},
  "iptables-mode": {{ .Values.iptablesMode | quote }},
  "ipv6": {{ ternary "false" "true" .Values.disableIPv6 }}
}
{{- end -}}

{{/*
A list of ports and ranges as linkerd2-cni takes it: split at commas, each part quoted as
written. linkerd-cni skips at run time a part that is not a port or a range (" 26" of
"25, 26"), so that port would not be ignored as the value says: refused, naming the part.
*/}}
{{- define "interceptor.checkPortList" -}}
{{- $name := index . 0 -}}
{{- $text := toString (index . 1) -}}
{{- if $text -}}
{{- range splitList "," $text -}}
{{- if not (regexMatch "^[0-9]+(-[0-9]+)?$" .) -}}
{{- fail (printf "%s=%q: linkerd-cni would skip the part %q (not a port or a range of ports) and redirect that port; write the ports and ranges with commas only, e.g. \"25,26,8000-8080\"" $name $text .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
A container's resources from a linkerd2-cni-shaped map (cpu, memory, ephemeral-storage, each
with limit and request; "" for none), as linkerd2-cni's partials.resources renders them.
*/}}
{{- define "interceptor.resources" -}}
{{- $storage := index . "ephemeral-storage" | default dict -}}
{{- $cpu := .cpu | default dict -}}
{{- $memory := .memory | default dict -}}
{{- if or $cpu.limit $memory.limit $storage.limit }}
limits:
  {{- with $cpu.limit }}
  cpu: {{ . | quote }}
  {{- end }}
  {{- with $memory.limit }}
  memory: {{ . | quote }}
  {{- end }}
  {{- with $storage.limit }}
  ephemeral-storage: {{ . | quote }}
  {{- end }}
{{- end }}
{{- if or $cpu.request $memory.request $storage.request }}
requests:
  {{- with $cpu.request }}
  cpu: {{ . | quote }}
  {{- end }}
  {{- with $memory.request }}
  memory: {{ . | quote }}
  {{- end }}
  {{- with $storage.request }}
  ephemeral-storage: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
updateStrategy with a maxSurge above 0 refused: two agents on one node would both bind the
metrics port on the node's address (the second never starts, so the update stalls), and the
pinned programs are taken over by one agent from the one before, never shared.
*/}}
{{- define "interceptor.checkUpdateStrategy" -}}
{{- $surge := toString (dig "rollingUpdate" "maxSurge" "0" .Values.updateStrategy) -}}
{{- if not (has $surge (list "0" "0%" "")) -}}
{{- fail (printf "updateStrategy.rollingUpdate.maxSurge=%s: two agents cannot run on one node (the second cannot bind the metrics port %d on the node's address, so the update would stall): unset maxSurge or set it to 0, and use maxUnavailable" $surge (int64 .Values.metrics.port)) -}}
{{- end -}}
{{- end -}}
