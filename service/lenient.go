package service

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxLenientDepth bounds how deep unmarshalLenient descends into nested
// messages (the rate-limit request nests three deep).
const maxLenientDepth = 32

// errTooDeep is returned (wrapped) for a message nested deeper than
// maxLenientDepth.
var errTooDeep = errors.New("message nested too deeply")

// unmarshalLenient decodes the protobuf wire bytes b into m (which it
// merges into, like proto.UnmarshalOptions{Merge: true}) with one
// difference from proto.Unmarshal: a string field may hold any bytes,
// including invalid UTF-8, which proto3 decoding refuses. Every message
// that proto.Unmarshal decodes, unmarshalLenient decodes to an equal
// message (FuzzLenientMatchesProto checks it).
//
// It walks the fields of b itself, setting strings through reflection
// (which does not validate them) and descending into message fields; every
// other field (scalars, maps, groups, unknown fields) is handed in wire order
// to proto.Unmarshal with Merge, which keeps proto's semantics for them.
// The one difference in ordering: a oneof mixing string or message members
// with others resolves by kind rather than by the last member on the wire;
// the rate-limit request has no oneof.
func unmarshalLenient(b []byte, m protoreflect.Message) error {
	return lenient(b, m, 0)
}

func lenient(b []byte, m protoreflect.Message, depth int) error {
	if depth > maxLenientDepth {
		return errTooDeep
	}
	fields := m.Descriptor().Fields()
	var rest []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		vn := protowire.ConsumeFieldValue(num, typ, b[n:])
		if vn < 0 {
			return protowire.ParseError(vn)
		}
		field, value := b[:n+vn], b[n:n+vn]
		b = b[n+vn:]
		fd := fields.ByNumber(num)
		if fd == nil || typ != protowire.BytesType || fd.IsMap() {
			rest = append(rest, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(value)
		switch fd.Kind() {
		case protoreflect.StringKind:
			s := protoreflect.ValueOfString(string(v))
			if fd.IsList() {
				m.Mutable(fd).List().Append(s)
			} else {
				m.Set(fd, s)
			}
		case protoreflect.MessageKind:
			if fd.IsList() {
				list := m.Mutable(fd).List()
				elem := list.NewElement()
				if err := lenient(v, elem.Message(), depth+1); err != nil {
					return fmt.Errorf("%s: %w", fd.Name(), err)
				}
				list.Append(elem)
				continue
			}
			if err := lenient(v, m.Mutable(fd).Message(), depth+1); err != nil {
				return fmt.Errorf("%s: %w", fd.Name(), err)
			}
		default:
			rest = append(rest, field...)
		}
	}
	if len(rest) == 0 {
		return nil
	}
	return proto.UnmarshalOptions{Merge: true}.Unmarshal(rest, m.Interface())
}
