// Package wire holds the protobuf wire-format helpers of walcast's
// hand-written codecs (message, task records, WAL entries): walking fields
// as proto.Unmarshal reads them and appending fields as
// proto.MarshalOptions{Deterministic: true} writes them (proto3: zero
// scalars and empty strings and bytes are left out). The codecs' tests
// compare them with the protobuf runtime.
package wire

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

var (
	// ErrFieldNumber is a field number above protobuf's largest:
	// protowire.ConsumeTag takes those, proto.Unmarshal refuses them.
	ErrFieldNumber = errors.New("field number out of range")
	// ErrUTF8 is a string field that is not UTF-8 (proto.Unmarshal and
	// proto.Marshal refuse those).
	ErrUTF8 = errors.New("string field contains invalid UTF-8")
)

// Fields calls field with each field's number, wire type and the bytes
// after its tag; field returns how many bytes its value took (negative: a
// protowire parse error) or an error of its own.
func Fields(b []byte, field func(num protowire.Number, typ protowire.Type, b []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return ErrFieldNumber
		}
		b = b[n:]
		n, err := field(num, typ, b)
		if err != nil {
			return err
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}

// String is a string field's value; not UTF-8 is ErrUTF8.
func String(v []byte) (string, error) {
	if !utf8.Valid(v) {
		return "", ErrUTF8
	}
	return string(v), nil
}

// ConsumeString reads a length-delimited string field's value from b: the
// string, the bytes it took (negative: a protowire parse error, with an
// empty string) and ErrUTF8 if it is not UTF-8.
func ConsumeString(b []byte) (string, int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return "", n, nil
	}
	s, err := String(v)
	return s, n, err
}

// CopyBytes copies v; nil if it is empty (as proto.Unmarshal leaves an
// empty proto3 bytes field).
func CopyBytes(v []byte) []byte {
	if len(v) == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}

// VarintSize is the size of a varint field, none if v is 0.
func VarintSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

// BoolSize is the size of a bool field, none if false.
func BoolSize(num protowire.Number, v bool) int {
	if !v {
		return 0
	}
	return protowire.SizeTag(num) + 1
}

// BytesSize is the size of a bytes field, none if empty.
func BytesSize(num protowire.Number, v []byte) int {
	if len(v) == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(v))
}

// StringSize is the size of a string field, none if empty.
func StringSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

// AppendVarint appends a varint field, unless v is 0.
func AppendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// AppendBool appends a bool field, unless false.
func AppendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}

// AppendBytes appends a bytes field, unless empty.
func AppendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// AppendString appends a string field, unless empty.
func AppendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return AppendElemString(b, num, s)
}

// AppendElemString appends a string field even if it is empty: an element
// of a repeated field, a map entry's key or value.
func AppendElemString(b []byte, num protowire.Number, s string) []byte {
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}
