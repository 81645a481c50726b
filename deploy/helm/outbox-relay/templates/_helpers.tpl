{{/* Names, labels and the checks that refuse a release which could not work. */}}

{{- define "outbox-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "outbox-relay.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "outbox-relay.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "outbox-relay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "outbox-relay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outbox-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "outbox-relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "outbox-relay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "outbox-relay.secretName" -}}
{{- default (include "outbox-relay.fullname" .) .Values.secret.existingSecret }}
{{- end }}

{{/*
The config file: .Values.config with the keys the chart owns. The metrics
listener is set by RELAY_METRICS_LISTEN and the password files by their
RELAY_*_FILE variables (the environment overrides the file), so only the
shutdown timeout is written here.
*/}}
{{- define "outbox-relay.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- /* values.yaml's empty dsn placeholder is not written */}}
{{- $pg := get $cfg "postgres" | default dict }}
{{- if not (get $pg "dsn") }}{{ $_ := unset $pg "dsn" }}{{ end }}
{{- if $pg }}{{ $_ := set $cfg "postgres" $pg }}{{ else }}{{ $_ := unset $cfg "postgres" }}{{ end }}
{{- $pipeline := get $cfg "pipeline" | default dict }}
{{- $_ := set $pipeline "shutdown_timeout" (printf "%ds" (int .Values.shutdownTimeoutSeconds)) }}
{{- $_ := set $cfg "pipeline" $pipeline }}
{{- toYaml $cfg }}
{{- end }}

{{/* Where the Secret's files are mounted. */}}
{{- define "outbox-relay.secretDir" -}}/etc/outbox-relay/secrets{{- end }}

{{/* The Secret's keys read as files, as a JSON array. */}}
{{- define "outbox-relay.secretFileKeys" -}}
{{- $out := list }}
{{- range list .Values.secret.keys.postgresPassword .Values.secret.keys.kafkaSaslPassword }}
{{- if . }}{{ $out = append $out . }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* The relay's environment: what the chart owns, then extraEnv. */}}
{{- define "outbox-relay.env" -}}
{{- $keys := .Values.secret.keys }}
{{- $secretDir := include "outbox-relay.secretDir" . -}}
- name: RELAY_METRICS_LISTEN
  value: "0.0.0.0:{{ .Values.metrics.port }}"
{{- if $keys.postgresDsn }}
- name: RELAY_POSTGRES_DSN
  valueFrom:
    secretKeyRef:
      name: {{ include "outbox-relay.secretName" . }}
      key: {{ $keys.postgresDsn }}
{{- end }}
{{- if $keys.postgresPassword }}
- name: RELAY_POSTGRES_PASSWORD_FILE
  value: {{ printf "%s/%s" $secretDir $keys.postgresPassword | quote }}
{{- end }}
{{- if $keys.kafkaSaslPassword }}
- name: RELAY_KAFKA_SASL_PASSWORD_FILE
  value: {{ printf "%s/%s" $secretDir $keys.kafkaSaslPassword | quote }}
{{- end }}
{{- with .Values.goMemLimit }}
- name: GOMEMLIMIT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The config directory and the Secret's files. */}}
{{- define "outbox-relay.volumeMounts" -}}
- name: config
  mountPath: /etc/outbox-relay/config
  readOnly: true
{{- if include "outbox-relay.secretFileKeys" . | fromJsonArray }}
- name: secrets
  mountPath: {{ include "outbox-relay.secretDir" . }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
bytes turns a memory quantity (128Mi, 1Gi, 500M, 134217728) into a number of
bytes, or "" when it has another form (1.5Gi, 1e9): the check then stays off.
*/}}
{{- define "outbox-relay.bytes" -}}
{{- $q := toString . }}
{{- if regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q }}
{{- $n := regexFind "^[0-9]+" $q | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+" $q "" }}
{{- $mult := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- mul $n (get $mult $unit) }}
{{- end }}
{{- end }}

{{/*
validate fails the render with the fix, for what would only show as a pod that
crashes or is killed later.
*/}}
{{- define "outbox-relay.validate" -}}
{{- $cfg := .Values.config | default dict }}
{{- $pg := get $cfg "postgres" | default dict }}
{{- $keys := .Values.secret.keys }}
{{- if hasKey (get $cfg "pipeline" | default dict) "shutdown_timeout" }}
{{- fail "config.pipeline.shutdown_timeout: set shutdownTimeoutSeconds instead, which also sizes terminationGracePeriodSeconds" }}
{{- end }}
{{- if hasKey (get $cfg "metrics" | default dict) "listen" }}
{{- fail "config.metrics.listen: set metrics.port instead; the probes and the Service use it" }}
{{- end }}
{{- $dsn := get $pg "dsn" | default "" | toString }}
{{- if regexMatch "(?i)(://[^/@]*:[^/@]*@|password\\s*=)" $dsn }}
{{- fail "config.postgres.dsn contains a password, and ConfigMaps are not secret: leave it out and put the password in secret.postgresPassword (secret.keys.postgresPassword), or move the whole DSN to secret.postgresDsn (secret.keys.postgresDsn)" }}
{{- end }}
{{- if and (not $keys.postgresDsn) (not $dsn) }}
{{- fail "no Postgres DSN: set config.postgres.dsn (without its password, which goes in secret.postgresPassword), or keep the whole DSN in the Secret: secret.keys.postgresDsn=postgres-dsn, secret.keys.postgresPassword=\"\", secret.postgresDsn" }}
{{- end }}
{{- if and $keys.postgresDsn $keys.postgresPassword }}
{{- fail "secret.keys.postgresDsn and secret.keys.postgresPassword are both set: the DSN from the Secret carries its password; set one of them to \"\"" }}
{{- end }}
{{- if and $keys.postgresDsn $dsn }}
{{- fail "config.postgres.dsn is set and so is secret.keys.postgresDsn, whose RELAY_POSTGRES_DSN would override it: keep one" }}
{{- end }}
{{- if not .Values.secret.existingSecret }}
{{- range $key, $value := dict "postgresDsn" .Values.secret.postgresDsn "postgresPassword" .Values.secret.postgresPassword "kafkaSaslPassword" .Values.secret.kafkaSaslPassword }}
{{- if and (get $keys $key) (not $value) }}
{{- fail (printf "secret.%s is empty while secret.keys.%s is %q: pass it at install time (--set-file secret.%s=FILE), name your own Secret in secret.existingSecret, or set secret.keys.%s \"\"" $key $key (get $keys $key) $key $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if lt (int .Values.shutdownTimeoutSeconds) 1 }}
{{- fail "shutdownTimeoutSeconds must be at least 1" }}
{{- end }}
{{- if lt (int .Values.terminationGraceExtraSeconds) 5 }}
{{- fail "terminationGraceExtraSeconds must be at least 5: the relay needs time after its drain to save the checkpoint and close" }}
{{- end }}
{{- $limit := include "outbox-relay.bytes" (dig "limits" "memory" "" (.Values.resources | default dict)) }}
{{- if and $limit (not .Values.goMemLimit) }}
{{- $window := dig "pipeline" "max_in_flight_bytes" 8388608 $cfg | int64 }}
{{- $soft := add 33554432 (mul 2 $window) }}
{{- /* Peak RSS, docs/operating.md#memory: the soft limit + 32 MiB outside the Go heap. */}}
{{- $peak := add $soft 33554432 }}
{{- if or (gt (mul $soft 10) (mul ($limit | int64) 8)) (gt $peak ($limit | int64)) }}
{{- fail (printf "the relay's soft memory limit (32 MiB + 2 x pipeline.max_in_flight_bytes = %d MiB) is above 80%% of resources.limits.memory (%s), or its peak RSS (that + 32 MiB outside the Go heap = %d MiB, see docs/operating.md#memory) above the limit: raise the limit to at least %d Mi, or set goMemLimit" (div $soft 1048576) (dig "limits" "memory" "" .Values.resources) (div $peak 1048576) (add (max (div (mul $soft 10) (mul 8 1048576)) (div $peak 1048576)) 1)) }}
{{- end }}
{{- end }}
{{- end }}
