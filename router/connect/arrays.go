package connect

import "strings"

// arrayElem maps the array types Debezium writes as Connect arrays to their
// element's type.
var arrayElem = map[uint32]uint32{
	boolArrayOID: boolOID, int2ArrayOID: int2OID, int4ArrayOID: int4OID, int8ArrayOID: int8OID,
	textArrayOID: 0, bpcharArrayOID: 0, varcharArrayOID: 0, uuidArrayOID: 0,
	float4ArrayOID: float4OID, float8ArrayOID: float8OID,
}

// renderArray writes a one-dimensional Postgres array text ({a,"b c",NULL})
// as a Connect array: a JSON array in a header and under JsonConverter
// ([1,2,3], ["a","b c"]), Java's List.toString in a Struct ([a, b c]).
// Explicit bounds are dropped, as Debezium drops them; a multi-dimensional
// array is a null per top-level element ([null, null]), as Debezium's.
func renderArray(dst []byte, elem uint32, v []byte, w int) ([]byte, bool) {
	items, ok := parseArray(string(v))
	if !ok {
		return nil, false
	}
	sep := ","
	if w == inStruct {
		sep = ", "
	}
	dst = append(dst, '[')
	for i, it := range items {
		if i > 0 {
			dst = append(dst, sep...)
		}
		if it == nil {
			dst = append(dst, "null"...)
			continue
		}
		switch {
		case elem == 0 && w == inHeader:
			// Connect's Values.convertToString quotes a string escaping only
			// '\\' and '"': other characters, non-ASCII and control ones
			// included, are written as they are.
			dst = append(dst, '"')
			for _, c := range []byte(*it) {
				if c == '\\' || c == '"' {
					dst = append(dst, '\\')
				}
				dst = append(dst, c)
			}
			dst = append(dst, '"')
		case elem == 0 && w == inJSON: // a JSON string, as Jackson writes it
			dst = AppendJSONString(dst, []byte(*it))
		case elem == 0:
			dst = append(dst, *it...)
		default:
			dst = render(dst, Type{OID: elem, Mod: -1}, []byte(*it), inJSON)
		}
	}
	return append(dst, ']'), true
}

// parseArray splits a one-dimensional array's text into its elements, nil
// for NULL, with quotes and backslash escapes removed.
func parseArray(s string) ([]*string, bool) {
	if strings.HasPrefix(s, "[") {
		// Explicit bounds ([2:3]={1,2}): Debezium's list has the elements
		// only.
		i := strings.Index(s, "]={")
		if i < 0 {
			return nil, false
		}
		s = s[i+2:]
	}
	if strings.HasPrefix(s, "{{") {
		// More than one dimension: Debezium's list holds a null per
		// top-level element ({{1,2},{3,4}} is [null, null]).
		var items []*string
		depth := 0
		for i := 1; i < len(s)-1; i++ {
			switch s[i] {
			case '"':
				for i++; i < len(s) && s[i] != '"'; i++ {
					if s[i] == '\\' {
						i++
					}
				}
			case '{':
				if depth == 0 {
					items = append(items, nil)
				}
				depth++
			case '}':
				depth--
			}
		}
		return items, depth == 0
	}
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, false
	}
	body := s[1 : len(s)-1]
	var items []*string
	if body == "" {
		return items, true
	}
	for i := 0; i <= len(body); {
		if i < len(body) && body[i] == '{' {
			return nil, false // multi-dimensional
		}
		var sb strings.Builder
		quoted := i < len(body) && body[i] == '"'
		if quoted {
			i++
			for i < len(body) && body[i] != '"' {
				if body[i] == '\\' && i+1 < len(body) {
					i++
				}
				sb.WriteByte(body[i])
				i++
			}
			if i >= len(body) {
				return nil, false
			}
			i++ // closing quote
		} else {
			for i < len(body) && body[i] != ',' {
				sb.WriteByte(body[i])
				i++
			}
		}
		it := sb.String()
		if !quoted && strings.EqualFold(it, "NULL") {
			items = append(items, nil)
		} else {
			items = append(items, &it)
		}
		if i < len(body) && body[i] != ',' {
			return nil, false
		}
		i++
	}
	return items, true
}
