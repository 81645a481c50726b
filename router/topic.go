package router

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/field"
)

// maxTopicCache bounds the per-aggregate-type topic cache; past it the cache
// starts over, so a flood of distinct aggregate types cannot grow memory.
const maxTopicCache = 4096

// Topic returns the topic for an event of the given aggregate and event type:
// the override for aggregateType if there is one, else the expanded template.
// The error, a *RouteError, says why the result would not be a legal topic.
func (r *Router) Topic(aggregateType, eventType string) (string, error) {
	if aggregateType == "" {
		return "", &RouteError{Code: CodeAggregateTypeEmpty, Reason: "the aggregate type is empty, so the event has no topic"}
	}
	topic, code, reason := r.topic([]byte(aggregateType), []byte(eventType))
	if reason != "" {
		return "", &RouteError{Code: code, Reason: reason}
	}
	return topic, nil
}

// topic returns the topic or the reason it cannot route and its code. The
// reason names no config key (the CLI adds them by the code). It takes bytes so
// that the hot path can look up the caches without allocating.
func (r *Router) topic(aggregateType, eventType []byte) (topic, code, reason string) {
	if len(r.overrides) > 0 {
		if t, ok := r.overrides[string(aggregateType)]; ok {
			return t, "", ""
		}
	}
	if r.rt.regex == nil && r.tmpl.constant {
		return r.tmpl.parts[0].lit, "", ""
	}
	if r.topics != nil {
		if t, ok := r.topics[string(aggregateType)]; ok {
			return t, "", ""
		}
	}
	if r.rt.regex != nil {
		topic = r.rt.regex.topic(aggregateType)
		if why := invalidTopic(topic); why != "" {
			return "", CodeTopicReplacement, fmt.Sprintf("topic %q for aggregate type %q %s; add an override for the aggregate type or change the topic replacement", topic, aggregateType, why)
		}
		r.cacheTopic(aggregateType, topic)
		return topic, "", ""
	}
	if r.tmpl.useEventType && len(eventType) == 0 {
		return "", CodeEventTypeEmpty, fmt.Sprintf("the event type is NULL or empty but the topic template %q uses {event_type}: insert the event with an event type, or add an override for aggregate type %q",
			r.tmpl.String(), aggregateType)
	}
	topic = r.tmpl.expand(aggregateType, eventType)
	if why := invalidTopic(topic); why != "" {
		return "", CodeTopicInvalid, fmt.Sprintf("topic %q for aggregate type %q %s; add an override for the aggregate type or change the topic template", topic, aggregateType, why)
	}
	r.cacheTopic(aggregateType, topic)
	return topic, "", ""
}

func (r *Router) cacheTopic(aggregateType []byte, topic string) {
	if r.topics == nil {
		return
	}
	if len(r.topics) >= maxTopicCache {
		clear(r.topics)
	}
	r.topics[string(aggregateType)] = topic
}

// expand returns the topic the template gives the aggregate and event type,
// in one allocation.
func (t *template) expand(aggregateType, eventType []byte) string {
	n := 0
	for _, p := range t.parts {
		switch p.placeholder {
		case literal:
			n += len(p.lit)
		case aggregateTypeP:
			n += len(aggregateType)
		case eventTypeP:
			n += len(eventType)
		}
	}
	b := make([]byte, 0, n)
	for _, p := range t.parts {
		switch p.placeholder {
		case literal:
			b = append(b, p.lit...)
		case aggregateTypeP:
			b = append(b, aggregateType...)
		case eventTypeP:
			b = append(b, eventType...)
		}
	}
	return string(b)
}

// String is the template as configured.
func (t *template) String() string {
	return t.expand([]byte("{aggregate_type}"), []byte("{event_type}"))
}

// topicRegex is Debezium's route.topic.regex / route.topic.replacement: the
// aggregate type, when the whole of it matches, becomes the expanded
// replacement; otherwise it is the topic as it is (Kafka Connect's
// RegexRouter).
type topicRegex struct {
	re       *regexp.Regexp
	template string // in regexp.Expand's syntax
}

// compileTopicRegex compiles a Java regex and replacement as Debezium's
// RegexRouter takes them: translated into Go's syntax with Java's meaning
// (translateJavaRegex), or refused naming the Java construct Go reads
// otherwise or not at all.
func compileTopicRegex(regex, replacement string) (topicRegex, error) {
	goRegex, err := translateJavaRegex(regex)
	if err != nil {
		return topicRegex{}, field.Errorf("TopicRegex", "%q: %v", regex, err)
	}
	re, err := regexp.Compile(`^(?:` + goRegex + `)$`)
	if err != nil {
		return topicRegex{}, field.Errorf("TopicRegex", "%q: %v (the relay takes Java's syntax except lookaround and backreferences)", regex, err)
	}
	tmpl, err := javaReplacement(replacement, re)
	if err != nil {
		return topicRegex{}, field.Errorf("TopicReplacement", "%q: %v", replacement, err)
	}
	return topicRegex{re: re, template: tmpl}, nil
}

// javaReplacement turns a java.util.regex replacement ($1, ${name}, \$ and
// \\ escapes) into regexp.Expand's template ($$ for a dollar sign).
func javaReplacement(s string, re *regexp.Regexp) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\\':
			i++
			if i == len(s) {
				return "", fmt.Errorf("ends with a lone backslash: write \\\\ for a backslash")
			}
			if s[i] == '$' {
				b.WriteString("$$")
			} else {
				b.WriteByte(s[i])
			}
		case '$':
			i++
			if i == len(s) {
				return "", fmt.Errorf("ends with a lone '$': write \\$ for a dollar sign")
			}
			if s[i] == '{' {
				end := strings.IndexByte(s[i:], '}')
				if end < 0 {
					return "", fmt.Errorf("has an unclosed ${")
				}
				name := s[i+1 : i+end]
				if re.SubexpIndex(name) < 0 {
					return "", fmt.Errorf("names group %q, which the regex does not have", name)
				}
				b.WriteString("${" + name + "}")
				i += end
				continue
			}
			if s[i] < '0' || s[i] > '9' {
				return "", fmt.Errorf("has '$' before %q: use $n or ${name}, or \\$ for a dollar sign", s[i])
			}
			// Java reads as many digits as still name a group.
			n := int(s[i] - '0')
			for i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
				next := n*10 + int(s[i+1]-'0')
				if next > re.NumSubexp() {
					break
				}
				n = next
				i++
			}
			if n > re.NumSubexp() {
				return "", fmt.Errorf("refers to group %d, but the regex has %d", n, re.NumSubexp())
			}
			b.WriteString("${" + strconv.Itoa(n) + "}")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// topic returns the topic for the aggregate type.
func (t *topicRegex) topic(aggregateType []byte) string {
	m := t.re.FindSubmatchIndex(aggregateType)
	if m == nil {
		return string(aggregateType)
	}
	return string(t.re.Expand(nil, []byte(t.template), aggregateType, m))
}

// A template is a parsed topic template: literal text and placeholders.
type template struct {
	parts        []part
	constant     bool // no placeholders: the topic is parts[0].lit (or "")
	useEventType bool
}

type part struct {
	lit         string
	placeholder placeholder
}

type placeholder uint8

const (
	literal placeholder = iota
	aggregateTypeP
	eventTypeP
)

// maxTopicLen is Kafka's limit on a topic name's length.
const maxTopicLen = 249

// invalidTopic says why topic is not a legal Kafka topic name, or returns "".
func invalidTopic(topic string) string {
	switch {
	case topic == "":
		return "is empty: a Kafka topic name needs 1 to 249 characters"
	case topic == "." || topic == "..":
		return "is not allowed as a Kafka topic name"
	case len(topic) > maxTopicLen:
		return fmt.Sprintf("is %d characters long: Kafka allows at most %d", len(topic), maxTopicLen)
	}
	return invalidTopicChars(topic)
}

func invalidTopicChars(s string) string {
	for i := 0; i < len(s); i++ {
		if !legalTopicByte(s[i]) {
			return fmt.Sprintf("contains %q: Kafka topic names may contain only ASCII letters, digits, '.', '_' and '-'", s[i])
		}
	}
	return ""
}

func legalTopicByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}
