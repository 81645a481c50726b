package retry

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
)

// storable reports whether s can be stored in a Postgres text column (or a
// jsonb string) unchanged. A database whose encoding is not UTF-8 may still
// refuse some characters; Insert's last-resort record covers that.
func storable(s string) bool { return event.IsPlainText(s) }

// headerJSON is one entry of the headers column. A key or value that jsonb
// cannot hold as a string (invalid UTF-8, or a NUL byte: jsonb refuses
// \u0000) is in the _b64 field instead, so every byte sequence round-trips;
// readable ones stay readable. A nil value (a Kafka null header value, not
// the same as an empty one) has neither value field. Rows written by earlier
// versions have key and value only.
type headerJSON struct {
	Key      *string `json:"key,omitempty"`
	KeyB64   *string `json:"key_b64,omitempty"`
	Value    *string `json:"value,omitempty"`
	ValueB64 *string `json:"value_b64,omitempty"`
}

// encodeHeaders returns the headers column's value: nil (NULL) for nil.
func encodeHeaders(hs []Header) (*string, error) {
	if hs == nil {
		return nil, nil
	}
	out := make([]headerJSON, len(hs))
	for i, h := range hs {
		if storable(h.Key) {
			out[i].Key = &h.Key
		} else {
			b := base64.StdEncoding.EncodeToString([]byte(h.Key))
			out[i].KeyB64 = &b
		}
		switch v := string(h.Value); {
		case h.Value == nil:
		case storable(v):
			out[i].Value = &v
		default:
			b := base64.StdEncoding.EncodeToString(h.Value)
			out[i].ValueB64 = &b
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	s := string(b)
	return &s, nil
}

// decodeHeaders reads the headers column, in either format.
func decodeHeaders(b []byte) ([]Header, error) {
	var hs []headerJSON
	if err := json.Unmarshal(b, &hs); err != nil {
		return nil, err
	}
	out := make([]Header, len(hs))
	for i, h := range hs {
		switch {
		case h.KeyB64 != nil:
			k, err := base64.StdEncoding.DecodeString(*h.KeyB64)
			if err != nil {
				return nil, fmt.Errorf("header %d: key_b64: %w", i, err)
			}
			out[i].Key = string(k)
		case h.Key != nil:
			out[i].Key = *h.Key
		}
		switch {
		case h.ValueB64 != nil:
			v, err := base64.StdEncoding.DecodeString(*h.ValueB64)
			if err != nil {
				return nil, fmt.Errorf("header %d: value_b64: %w", i, err)
			}
			out[i].Value = v
		case h.Value != nil:
			out[i].Value = []byte(*h.Value)
		}
	}
	return out, nil
}

// docString is a string of a last-resort document: a JSON string when it is
// valid UTF-8 (JSON escapes NUL and control characters losslessly), else
// {"base64": "…"}, since encoding/json would replace invalid bytes.
type docString string

func (s docString) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(s)) {
		return json.Marshal(string(s))
	}
	return json.Marshal(struct {
		Base64 []byte `json:"base64"`
	}{[]byte(s)})
}

func (s *docString) UnmarshalJSON(b []byte) error {
	var str string
	if err := json.Unmarshal(b, &str); err == nil {
		*s = docString(str)
		return nil
	}
	var o struct {
		Base64 []byte `json:"base64"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	*s = docString(o.Base64)
	return nil
}

type docHeader struct {
	Key   docString `json:"key"`
	Value []byte    `json:"value"` // base64; null for a nil value
}

// document is a last-resort record: the whole Event, in a form that a bytea
// column stores whatever the event holds. Bytes are base64 (encoding/json's
// []byte), so nothing depends on the database's encoding or limits on text.
type document struct {
	Format        int         `json:"format"` // 1
	EventKey      docString   `json:"event_key"`
	EventID       docString   `json:"event_id"`
	Aggregate     docString   `json:"aggregate"`
	AggregateType docString   `json:"aggregate_type"`
	AggregateID   docString   `json:"aggregate_id"`
	EventType     docString   `json:"event_type"`
	Topic         docString   `json:"topic"`
	Key           []byte      `json:"key"`
	Value         []byte      `json:"value"`
	Extra         []docHeader `json:"headers"` // the extra headers
	SourceLSN     string      `json:"source_lsn,omitempty"`
	CommitTime    *time.Time  `json:"commit_time,omitempty"`
	Reason        docString   `json:"reason"`
	Permanent     bool        `json:"permanent"`
	Waiting       bool        `json:"waiting"`
	// StoreError is why the retry table's columns refused the event.
	StoreError string `json:"store_error"`
}

func encodeDocument(e *Event, storeErr error) ([]byte, error) {
	d := document{
		Format: 1, EventKey: docString(e.EventKey), EventID: docString(e.EventID),
		Aggregate: docString(e.Aggregate), AggregateType: docString(e.AggregateType),
		AggregateID: docString(e.AggregateID), EventType: docString(e.EventType), Topic: docString(e.Topic),
		Key: e.Key, Value: e.Value, Reason: docString(e.Reason), Permanent: e.Permanent, Waiting: e.Waiting,
		StoreError: strings.ToValidUTF8(storeErr.Error(), "\uFFFD"),
	}
	if e.Extra != nil {
		d.Extra = make([]docHeader, len(e.Extra))
		for i, h := range e.Extra {
			d.Extra[i] = docHeader{Key: docString(h.Key), Value: h.Value}
		}
	}
	if e.SourceLSN != 0 {
		d.SourceLSN = e.SourceLSN.String()
	}
	if !e.CommitTime.IsZero() {
		ct := e.CommitTime
		d.CommitTime = &ct
	}
	return json.Marshal(d)
}

// fill sets e's event fields from the document d, which is the whole event
// as the pipeline handed it; the row's columns may hold only part of it.
func (d *document) fill(e *Entry) error {
	if d.Format != 1 {
		return fmt.Errorf("unknown last-resort document format %d", d.Format)
	}
	e.EventID, e.AggregateType, e.AggregateID = string(d.EventID), string(d.AggregateType), string(d.AggregateID)
	e.EventType, e.Topic, e.Key, e.Value = string(d.EventType), string(d.Topic), d.Key, d.Value
	e.Extra = nil
	if d.Extra != nil {
		e.Extra = make([]Header, len(d.Extra))
		for i, h := range d.Extra {
			e.Extra[i] = Header{Key: string(h.Key), Value: h.Value}
		}
	}
	if d.SourceLSN != "" {
		lsn, err := pglogrepl.ParseLSN(d.SourceLSN)
		if err != nil {
			return fmt.Errorf("source lsn %q: %w", d.SourceLSN, err)
		}
		e.SourceLSN = lsn
	}
	if d.CommitTime != nil {
		e.CommitTime = *d.CommitTime
	}
	return nil
}

func decodeDocument(b []byte) (*document, error) {
	var d document
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// asciiOnly returns s with everything but printable ASCII escaped as in a Go
// string literal: text that every server encoding stores, for the last
// last-resort attempt.
func asciiOnly(s string) string {
	if isPrintableASCII(s) {
		return s
	}
	q := strconv.QuoteToASCII(s)
	return q[1 : len(q)-1]
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
