package service

import (
	"encoding/binary"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// The provider's reply goes to gRPC callers as a google.protobuf.Struct
// (payment), beside its exact bytes (payment_json). Building the Struct
// (encoding/json into a map, then structpb) and marshalling it cost more
// than the rest of a payment's handling; appendStructWire instead writes
// the Struct's wire encoding straight from the JSON, in one pass and into
// one buffer. What a caller decodes is what upstream.DecodeReply and
// proto.Marshal would have sent (FuzzStructWire checks it): numbers are
// float64s parsed as encoding/json parses them, strings are unquoted as
// encoding/json unquotes them, and a key given twice keeps its last value
// (the wire carries both entries; a map field keeps the last).

// Field numbers of google/protobuf/struct.proto.
const (
	structFields  = 1 // Struct.fields, map<string, Value>
	mapEntryKey   = 1
	mapEntryValue = 2
	valueNull     = 1 // Value.null_value
	valueNumber   = 2 // Value.number_value
	valueString   = 3 // Value.string_value
	valueBool     = 4 // Value.bool_value
	valueStruct   = 5 // Value.struct_value
	valueList     = 6 // Value.list_value
	listValues    = 1 // ListValue.values
)

// appendStructWire appends to b the wire encoding of the Struct that
// upstream.DecodeReply makes of reply, a JSON object that
// upstream.CheckReply accepts (anything else gives nonsense, never a
// panic).
func appendStructWire(b, reply []byte) []byte {
	w := structWriter{in: reply, b: b}
	w.skipSpace()
	if w.i < len(w.in) && w.in[w.i] == '{' {
		w.object()
	}
	return w.b
}

type structWriter struct {
	in []byte
	i  int
	b  []byte
}

// open starts a length-prefixed field: its tag, and one byte for its
// length, which close fixes up.
func (w *structWriter) open(field protowire.Number) int {
	w.b = protowire.AppendTag(w.b, field, protowire.BytesType)
	w.b = append(w.b, 0)
	return len(w.b)
}

// close ends the field whose content started at start, writing its length
// before it (moving the content up when the length needs more than one
// byte).
func (w *structWriter) close(start int) {
	n := len(w.b) - start
	if n < 0x80 {
		w.b[start-1] = byte(n)
		return
	}
	size := protowire.SizeVarint(uint64(n))
	w.b = append(w.b, make([]byte, size-1)...)
	copy(w.b[start-1+size:], w.b[start:start+n])
	protowire.AppendVarint(w.b[:start-1], uint64(n))
}

func (w *structWriter) skipSpace() {
	for w.i < len(w.in) {
		switch w.in[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

// object writes the Struct's fields of the object at w.i, '{' included.
func (w *structWriter) object() {
	w.i++ // {
	for {
		w.skipSpace()
		if w.i >= len(w.in) || w.in[w.i] == '}' {
			w.i++
			return
		}
		if w.in[w.i] == ',' {
			w.i++
			continue
		}
		entry := w.open(structFields)
		key := w.open(mapEntryKey)
		w.string()
		w.close(key)
		w.skipSpace()
		if w.i < len(w.in) && w.in[w.i] == ':' {
			w.i++
		}
		value := w.open(mapEntryValue)
		w.value()
		w.close(value)
		w.close(entry)
	}
}

// value writes the Value of the JSON value at w.i.
func (w *structWriter) value() {
	w.skipSpace()
	if w.i >= len(w.in) {
		return
	}
	switch c := w.in[w.i]; {
	case c == '{':
		s := w.open(valueStruct)
		w.object()
		w.close(s)
	case c == '[':
		l := w.open(valueList)
		w.i++
		for {
			w.skipSpace()
			if w.i >= len(w.in) || w.in[w.i] == ']' {
				w.i++
				break
			}
			if w.in[w.i] == ',' {
				w.i++
				continue
			}
			v := w.open(listValues)
			w.value()
			w.close(v)
		}
		w.close(l)
	case c == '"':
		s := w.open(valueString)
		w.string()
		w.close(s)
	case c == 't':
		w.b = protowire.AppendTag(w.b, valueBool, protowire.VarintType)
		w.b = append(w.b, 1)
		w.i += len("true")
	case c == 'f':
		w.b = protowire.AppendTag(w.b, valueBool, protowire.VarintType)
		w.b = append(w.b, 0)
		w.i += len("false")
	case c == 'n':
		w.b = protowire.AppendTag(w.b, valueNull, protowire.VarintType)
		w.b = append(w.b, 0)
		w.i += len("null")
	default:
		start := w.i
		for w.i < len(w.in) && isNumberByte(w.in[w.i]) {
			w.i++
		}
		f, _ := strconv.ParseFloat(string(w.in[start:w.i]), 64)
		w.b = protowire.AppendTag(w.b, valueNumber, protowire.Fixed64Type)
		w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(f))
		if w.i == start {
			w.i++ // not a value: skip it, to end
		}
	}
}

func isNumberByte(c byte) bool {
	return ('0' <= c && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// string appends the unquoted bytes of the JSON string at w.i, as
// encoding/json unquotes it: a \u escape of a lone surrogate becomes
// U+FFFD.
func (w *structWriter) string() {
	w.i++ // "
	for w.i < len(w.in) {
		start := w.i
		for w.i < len(w.in) && w.in[w.i] != '"' && w.in[w.i] != '\\' {
			w.i++
		}
		w.b = append(w.b, w.in[start:w.i]...)
		if w.i >= len(w.in) {
			return
		}
		if w.in[w.i] == '"' {
			w.i++
			return
		}
		w.i++ // \
		if w.i >= len(w.in) {
			return
		}
		switch e := w.in[w.i]; e {
		case 'b':
			w.b = append(w.b, '\b')
		case 'f':
			w.b = append(w.b, '\f')
		case 'n':
			w.b = append(w.b, '\n')
		case 'r':
			w.b = append(w.b, '\r')
		case 't':
			w.b = append(w.b, '\t')
		case 'u':
			r := hex4(w.in[w.i+1:])
			w.i += 4
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if w.i+2 < len(w.in) && w.in[w.i+1] == '\\' && w.in[w.i+2] == 'u' {
					r2 = hex4(w.in[w.i+3:])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					r = dec
					w.i += 6
				} else {
					r = utf8.RuneError
				}
			}
			w.b = utf8.AppendRune(w.b, r)
		default: // " \ /
			w.b = append(w.b, e)
		}
		w.i++
	}
}

// hex4 reads four hex digits, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 4 {
		return -1
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
