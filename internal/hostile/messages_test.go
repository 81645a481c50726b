package hostile

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The messages subtest writes every generated event as a transactional
// logical decoding message (outbox.source: messages) and, in the same
// transaction, a row of the archive table (the outbox table, of text
// columns, which the publication does not cover) holding what the relay's
// contract makes of the message: the row the checker judges. Besides the
// generator's hostile values it sends contents no row can carry: not JSON,
// JSON that is not an object, a key given twice, values of the wrong JSON
// type. Keys come in random order, with unknown keys and JSON nulls for NULL.

// queueMessage queues the archive row and the message of v.
func (e *env) queueMessage(b *pgx.Batch, v *ev) {
	content := e.messageContent(v)
	b.Queue(`INSERT INTO outbox (hnum, hseq, id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, v.n, v.seq, v.id, v.aggType, v.aggID, v.evType, v.payload, v.h)
	b.Queue(`SELECT pg_logical_emit_message(true, 'outbox', $1::text)`, content)
}

// messageContent returns v's message, changing v to the row the relay's
// contract makes of it when the content breaks that contract.
func (e *env) messageContent(v *ev) string {
	switch p := e.rng.IntN(100); {
	case p < 5:
		// Nothing of it can be read: the retry row holds the content as its
		// value, and no field.
		bad := []string{"not json {", `[1, "two"]`, `"a string"`, `42`, `true`, `{`, ``, `{"id": "x", "id": "y", "aggregate_type": "Order", "aggregate_id": "c-1"}`,
			`{"aggregate_type": "Order"} trailing`, "{\"id\": \"raw\x01control\"}"}[e.rng.IntN(10)]
		*v = ev{n: v.n, payload: ptr(bad)}
		return bad
	case p < 9:
		// An id of the wrong JSON type: no id, routed to its lane.
		c := e.fields(v)
		c["id"] = []string{`{"o": 1}`, `[1]`, `true`}[e.rng.IntN(3)]
		v.id = nil
		return e.object(c)
	case p < 11:
		c := e.fields(v)
		c["aggregate_type"] = `7`
		v.aggType = nil
		return e.object(c)
	}
	return e.object(e.fields(v))
}

// fields returns v's keys as raw JSON values.
func (e *env) fields(v *ev) map[string]string {
	c := map[string]string{}
	text := func(key string, s *string) {
		switch {
		case s != nil:
			c[key] = js(*s)
		case e.rng.IntN(2) == 0:
			c[key] = "null"
		}
	}
	text("id", v.id)
	text("aggregate_type", v.aggType)
	text("aggregate_id", v.aggID)
	text("event_type", v.evType)
	// A JSON payload (but a string, sent unescaped, and null, a NULL
	// payload) may go in as it is; anything may go in as a string.
	if v.payload != nil {
		t := strings.TrimSpace(*v.payload)
		if json.Valid([]byte(t)) && t != "null" && t[0] != '"' && e.rng.IntN(2) == 0 {
			c["payload"] = *v.payload
		} else {
			c["payload"] = js(*v.payload)
		}
	} else if e.rng.IntN(2) == 0 {
		c["payload"] = "null"
	}
	// Headers as the headers column reads them: JSON as it is; not JSON
	// (ignored by the column) as a string, which is ignored too.
	if v.h != nil {
		if json.Valid([]byte(*v.h)) {
			c["headers"] = *v.h
		} else {
			c["headers"] = js(*v.h)
		}
	}
	if e.rng.IntN(4) == 0 {
		c["note"] = js(e.g.weird())
	}
	return c
}

// object writes c as a JSON object, keys in random order.
func (e *env) object(c map[string]string) string {
	keys := slices.Sorted(maps.Keys(c)) // then shuffled by the seed: replayable
	e.rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	var b strings.Builder
	b.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString([]string{",", ", ", " ,\n\t"}[e.rng.IntN(3)])
		}
		b.WriteString(js(k) + ":" + c[k])
	}
	b.WriteString("}")
	return b.String()
}
