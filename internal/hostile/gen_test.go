package hostile

import (
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"strings"
)

// validTypes are the aggregate types whose topics exist from the start.
var validTypes = []string{"Order", "Payment", "Customer"}

// invalidTypes make topic names Kafka cannot have.
var invalidTypes = []string{"Bad Type", "a/b", strings.Repeat("L", 250), "Ünïcode✓", "tab\there", "dollar$", "semi;colon"}

// An agg is an aggregate the generator writes events of.
type agg struct {
	typ, id *string
	clean   bool // never gets a bad event from the generator
}

// gen draws hostile outbox rows from a seeded source. Not safe for concurrent use.
type gen struct {
	rng       *mrand.Rand
	kind      string // "jsonb", "json" or "text": payload and headers columns
	clean     []agg
	tainted   []agg
	late      []agg
	colliding []agg
	next      int64          // row number
	seq       map[string]int // per aggregate
	tooLarge  int            // budget of payloads beyond batch_bytes
	collide   string         // the Col type whose topic is not created
}

// ev is one row to insert; nil is SQL NULL.
type ev struct {
	n                                      int64
	seq                                    int
	id, aggType, aggID, evType, payload, h *string
}

func ptr(s string) *string { return &s }

// js is s as a JSON string.
func js(s string) string {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return string(b)
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

// noise is n bytes of incompressible text (letters, digits and some
// multi-byte characters).
func (g *gen) noise(n int) string {
	var b strings.Builder
	b.Grow(n + 4)
	for b.Len() < n {
		if g.rng.IntN(16) == 0 {
			b.WriteRune(rune(0x400 + g.rng.IntN(0x2000)))
			continue
		}
		b.WriteByte(alnum[g.rng.IntN(len(alnum))])
	}
	return b.String()
}

// weird is a short text with unicode and control characters (never NUL,
// which Postgres text cannot hold).
func (g *gen) weird() string {
	parts := []string{"é", "✓", "😀", "\x01", "\x1f", "\x7f", "\t", "\r\n", "\u200b", "\u202e", "\\", "'", `"`, "%s", "{aggregate_type}", " ", "ß", "中文", "\ufeff"}
	var b strings.Builder
	for range 1 + g.rng.IntN(6) {
		b.WriteString(parts[g.rng.IntN(len(parts))])
	}
	return b.String()
}

func newGen(seed uint64, kind string) *gen {
	g := &gen{rng: mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), kind: kind, seq: map[string]int{}}
	for _, t := range validTypes {
		for i := range 10 {
			g.clean = append(g.clean, agg{ptr(t), ptr(fmt.Sprintf("c-%d", i)), true})
		}
		g.clean = append(g.clean,
			agg{ptr(t), ptr("é✓😀-" + g.weird()), true},
			agg{ptr(t), ptr("ctl\x01\t\r\n\x7f-" + g.weird()), true},
			agg{ptr(t), ptr(" "), true},
			agg{ptr(t), ptr(g.noise(8000 + g.rng.IntN(12000))), true}, // 8–20 KB key
		)
		for i := range 3 {
			g.tainted = append(g.tainted, agg{ptr(t), ptr(fmt.Sprintf("t-%d-%s", i, g.weird())), false})
		}
		g.tainted = append(g.tainted, agg{ptr(t), ptr(g.noise(8000 + g.rng.IntN(12000))), false})
	}
	for i := range 3 {
		g.late = append(g.late, agg{ptr("Late"), ptr(fmt.Sprintf("l-%d", i)), false})
	}
	g.collide = "Col.x"
	if g.rng.IntN(2) == 0 {
		g.collide = "Col_x"
	}
	for _, t := range []string{"Col.x", "Col_x"} {
		g.colliding = append(g.colliding, agg{ptr(t), ptr("k-" + t), t != g.collide})
	}
	return g
}

func (g *gen) pick(as []agg) agg { return as[g.rng.IntN(len(as))] }

func (g *gen) id() *string {
	switch p := g.rng.IntN(100); {
	case p < 3:
		return ptr("id-" + g.weird() + fmt.Sprint(g.next))
	case p < 4:
		return ptr(g.noise(3000 + g.rng.IntN(6000))) // a huge event id
	default:
		return ptr(fmt.Sprintf("%016x-%d", g.rng.Uint64(), g.next))
	}
}

func (g *gen) evType() *string {
	switch p := g.rng.IntN(100); {
	case p < 4:
		return nil
	case p < 8:
		return ptr("")
	case p < 14:
		return ptr("Changed-" + g.weird())
	case p < 15:
		return ptr(g.noise(3000))
	default:
		return ptr("Changed")
	}
}

// payload returns a payload of some JSON type (or not JSON, for a text
// column), with the sequence number in it when it is an object.
func (g *gen) payload(seq int) *string {
	obj := fmt.Sprintf(`{"seq": %d, "n": %d, "note": %s}`, seq, g.next, js(g.weird()))
	opts := []string{obj, obj, obj, obj,
		fmt.Sprintf(`{"seq": %d, "deep": {"a": [1, {"b": [null, true, 1.5e300]}]}, "k": "\t\u0001é"}`, seq),
		fmt.Sprintf(`[%d, "x", null]`, seq), `"just a string \u0001 é✓"`, `12345678901234567890`, `-0.0`, `null`, `true`, `{}`, `[]`}
	if g.kind != "jsonb" {
		opts = append(opts, `{"nul": "\u0000"}`, `{"dup": 1, "dup": 2}`)
	}
	if g.kind == "text" {
		opts = append(opts, "", "{not json", "plain text é\x01\x7f", " ")
	}
	switch p := g.rng.IntN(100); {
	case p < 5:
		return nil
	case p < 6:
		return ptr(fmt.Sprintf(`{"seq": %d, "blob": %s}`, seq, js(g.noise(100_000+g.rng.IntN(500_000)))))
	}
	return ptr(opts[g.rng.IntN(len(opts))])
}

func (g *gen) tooLargePayload(seq int) *string {
	return ptr(fmt.Sprintf(`{"seq": %d, "blob": %s}`, seq, js(g.noise(1_200_000+g.rng.IntN(400_000)))))
}

// headers returns a headers column value: objects with every JSON type,
// reserved, upper-case, empty, duplicate and odd keys; other JSON types; and
// invalid JSON for a text column.
func (g *gen) headers() *string {
	opts := []string{
		fmt.Sprintf(`{"trace_id": "tr-%d", "tenant": 7}`, g.next),
		`{"id": "evil", "event_type": "evil", "aggregate_type": "evil", "ID": "upper", "": "empty-key", "x": "y"}`,
		`{"s": "str\t\n\u0001 é✓😀", "n": 1.50, "i": -0, "b": false, "nul": null, "arr": [1, "two", null], "obj": {"k": {"deep": [{}]}}, "big": 12345678901234567890}`,
		`{"k": "first", "k": "second", "k": 3, "id": "evil2"}`,
		`{"ké✓\u0001": "v", "\t": "tab-key", "\"q\"": "\\"}`,
		`{ "sp" :  "v" ,"t":[ 1 ,2 ] }`,
		`[1, 2]`, `"just a string"`, `42`, `null`, `true`, `{}`, `[]`,
	}
	if g.kind != "jsonb" {
		opts = append(opts, `{"z": "\u0000nul", "id": "\u0000"}`)
	}
	if g.kind == "text" {
		opts = append(opts, `{"a":`, `not json`, ``, `  {"ws": 1}  `, `{"a":1} trailing`, `{"a": 1,}`)
	}
	if g.rng.IntN(4) == 0 {
		return nil
	}
	return ptr(opts[g.rng.IntN(len(opts))])
}

func aggKeyOf(t, id *string) string {
	if t == nil || *t == "" || id == nil || *id == "" {
		return ""
	}
	return *t + "\x00" + *id
}

// event draws the next row. cleanOnly restricts it to clean aggregates.
func (g *gen) event(cleanOnly bool) ev {
	g.next++
	e := ev{n: g.next, id: g.id(), evType: g.evType()}
	if g.kind == "" { // no headers column
		e.h = nil
	} else {
		e.h = g.headers()
	}
	var a agg
	bad := ""
	switch p := g.rng.Float64(); {
	case cleanOnly || p < 0.62:
		a = g.pick(g.clean)
	case p < 0.77:
		a = g.pick(g.tainted)
		if g.rng.IntN(10) < 3 {
			bad = []string{"large", "nullid", "emptyid"}[g.rng.IntN(3)]
			if bad == "large" && g.tooLarge <= 0 {
				bad = "nullid"
			}
		}
	case p < 0.84:
		t := invalidTypes[g.rng.IntN(len(invalidTypes))]
		a = agg{typ: &t, id: ptr("i-" + fmt.Sprint(g.rng.IntN(3)))}
	case p < 0.87:
		a = g.pick(g.late)
	case p < 0.90:
		a = g.pick(g.colliding)
	case p < 0.93:
		a = agg{typ: ptr(validTypes[g.rng.IntN(len(validTypes))])}
		if g.rng.IntN(2) == 0 {
			a.id = ptr("")
		}
	case p < 0.965:
		a = agg{typ: []*string{nil, ptr("")}[g.rng.IntN(2)], id: ptr("x-" + fmt.Sprint(g.rng.IntN(3)))}
	default: // every column NULL, or every column empty
		g.seq[""]++
		if g.rng.IntN(2) == 0 {
			return ev{n: g.next}
		}
		e := ev{n: g.next, id: ptr(""), aggType: ptr(""), aggID: ptr(""), evType: ptr("")}
		if g.kind == "text" {
			e.payload, e.h = ptr(""), ptr("")
		}
		return e
	}
	e.aggType, e.aggID = a.typ, a.id
	if k := aggKeyOf(a.typ, a.id); k != "" {
		g.seq[k]++
		e.seq = g.seq[k]
	}
	e.payload = g.payload(e.seq)
	switch bad {
	case "large":
		g.tooLarge--
		e.payload = g.tooLargePayload(e.seq)
	case "nullid":
		e.id = nil
	case "emptyid":
		e.id = ptr("")
	}
	return e
}

// txnSize draws a transaction's number of events.
func (g *gen) txnSize() int {
	switch p := g.rng.IntN(100); {
	case p < 60:
		return 1 + g.rng.IntN(5)
	case p < 95:
		return 6 + g.rng.IntN(35)
	default:
		return 100 + g.rng.IntN(100)
	}
}
