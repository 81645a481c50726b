package debezium

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Java object serialization (the Java Object Serialization Specification,
// chapter 6), reduced to exactly what Kafka Connect's FileOffsetBackingStore
// writes: one java.util.HashMap whose keys and values are byte arrays or
// null. Anything else is reported, never guessed at: the file decides where
// a relay starts reading the WAL.

// Stream constants of java.io.ObjectStreamConstants.
const (
	streamMagic   = 0xACED
	streamVersion = 5

	tcNull          = 0x70
	tcReference     = 0x71
	tcClassDesc     = 0x72
	tcObject        = 0x73
	tcString        = 0x74
	tcArray         = 0x75
	tcBlockData     = 0x77
	tcEndBlockData  = 0x78
	tcBlockDataLong = 0x7A

	baseWireHandle = 0x7E0000

	scWriteMethod  = 0x01
	scSerializable = 0x02
)

// errNotOffsetFile prefixes every error of readByteArrayMap.
var errNotOffsetFile = errors.New("not a Kafka Connect offset file")

// A javaEntry is one key and value of the map; nil is Java's null.
type javaEntry struct{ key, value []byte }

// javaReader reads the stream. Handles are assigned in stream order to class
// descriptors and objects; only byte arrays and class descriptors can be
// referred to later, and only those are kept.
type javaReader struct {
	b       []byte
	off     int
	handles []any // *javaClass or []byte, by handle - baseWireHandle
}

type javaClass struct {
	name  string
	flags byte
	// fields are the serializable fields' type codes, in stream order
	// (primitive fields only: HashMap has no object fields).
	fields []byte
	super  *javaClass
}

// readByteArrayMap decodes data written by ObjectOutputStream.writeObject of
// a java.util.HashMap<byte[], byte[]>, returning its entries in stream order.
func readByteArrayMap(data []byte) ([]javaEntry, error) {
	r := &javaReader{b: data}
	entries, err := r.hashMap()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNotOffsetFile, err)
	}
	return entries, nil
}

func (r *javaReader) hashMap() ([]javaEntry, error) {
	magic, err := r.u16()
	if err != nil {
		return nil, err
	}
	version, err := r.u16()
	if err != nil {
		return nil, err
	}
	if magic != streamMagic || version != streamVersion {
		return nil, fmt.Errorf("starts with %04x %04x, not a Java serialization stream (aced 0005)", magic, version)
	}
	tc, err := r.u8()
	if err != nil {
		return nil, err
	}
	if tc != tcObject {
		return nil, fmt.Errorf("holds %s, not an object", tcName(tc))
	}
	class, err := r.classDesc()
	if err != nil {
		return nil, fmt.Errorf("class of the top-level object: %w", err)
	}
	if class == nil || class.name != "java.util.HashMap" {
		return nil, fmt.Errorf("holds a %s, not a java.util.HashMap", className(class))
	}
	if class.super != nil {
		return nil, fmt.Errorf("java.util.HashMap has serializable superclass %s; want none", class.super.name)
	}
	if class.flags&(scSerializable|scWriteMethod) != scSerializable|scWriteMethod {
		return nil, fmt.Errorf("java.util.HashMap has class flags %#x; want serializable with writeObject (0x03)", class.flags)
	}
	r.newHandle(nil) // the map object itself; never referred to by a byte array
	// The default fields (loadFactor, threshold), then writeObject's block
	// data: the table's capacity and the entry count.
	for _, code := range class.fields {
		if err := r.skipPrimitive(code); err != nil {
			return nil, fmt.Errorf("java.util.HashMap fields: %w", err)
		}
	}
	block, err := r.blockData()
	if err != nil {
		return nil, fmt.Errorf("java.util.HashMap header: %w", err)
	}
	if len(block) != 8 {
		return nil, fmt.Errorf("java.util.HashMap header is %d bytes of block data; want 8 (capacity, size)", len(block))
	}
	size := int32(binary.BigEndian.Uint32(block[4:]))
	// Every entry takes at least two bytes (two nulls).
	if size < 0 || int(size) > (len(r.b)-r.off)/2 {
		return nil, fmt.Errorf("java.util.HashMap claims %d entries in %d remaining bytes", size, len(r.b)-r.off)
	}
	entries := make([]javaEntry, 0, size)
	for i := range int(size) {
		k, err := r.byteArray()
		if err != nil {
			return nil, fmt.Errorf("key of entry %d: %w", i, err)
		}
		v, err := r.byteArray()
		if err != nil {
			return nil, fmt.Errorf("value of entry %d: %w", i, err)
		}
		entries = append(entries, javaEntry{key: k, value: v})
	}
	tc, err = r.u8()
	if err != nil {
		return nil, err
	}
	if tc != tcEndBlockData {
		return nil, fmt.Errorf("after %d entries holds %s; want the end of the map (TC_ENDBLOCKDATA)", size, tcName(tc))
	}
	if r.off != len(r.b) {
		return nil, fmt.Errorf("%d bytes follow the map", len(r.b)-r.off)
	}
	return entries, nil
}

// classDesc reads a class descriptor: TC_CLASSDESC, TC_REFERENCE to one
// read before, or TC_NULL (returned as nil).
func (r *javaReader) classDesc() (*javaClass, error) {
	c, done, err := earlier[*javaClass](r, tcClassDesc, "a class descriptor refers to an object that is not one", "holds %s where a class descriptor belongs")
	if done || err != nil {
		return c, err
	}
	name, err := r.utf()
	if err != nil {
		return nil, err
	}
	if _, err := r.take(8); err != nil { // serialVersionUID
		return nil, err
	}
	c = &javaClass{name: name}
	r.newHandle(c)
	if c.flags, err = r.u8(); err != nil {
		return nil, err
	}
	n, err := r.u16()
	if err != nil {
		return nil, err
	}
	for range n {
		code, err := r.u8()
		if err != nil {
			return nil, err
		}
		field, err := r.utf()
		if err != nil {
			return nil, err
		}
		if primitiveSize(code) == 0 {
			return nil, fmt.Errorf("class %s has field %s of type %q; only primitive fields are expected", name, field, code)
		}
		c.fields = append(c.fields, code)
	}
	// No class annotation (ObjectOutputStream writes none), then the
	// superclass.
	tc, err := r.u8()
	if err != nil {
		return nil, err
	}
	if tc != tcEndBlockData {
		return nil, fmt.Errorf("class %s has annotations (%s); want none", name, tcName(tc))
	}
	if c.super, err = r.classDesc(); err != nil {
		return nil, fmt.Errorf("superclass of %s: %w", name, err)
	}
	return c, nil
}

// earlier reads the type code of a T: TC_NULL gives the zero T, done;
// TC_REFERENCE the T read before that it names, done; start (the code of a
// new T) not done, for the caller to read it. notT is the error for a
// reference to something else, wrongTC the format of the error for another
// code (given its name).
func earlier[T any](r *javaReader, start byte, notT, wrongTC string) (v T, done bool, err error) {
	tc, err := r.u8()
	if err != nil {
		return v, true, err
	}
	switch tc {
	case tcNull:
		return v, true, nil
	case tcReference:
		h, err := r.handle()
		if err != nil {
			return v, true, err
		}
		t, ok := h.(T)
		if !ok {
			return v, true, errors.New(notT)
		}
		return t, true, nil
	case start:
		return v, false, nil
	}
	return v, true, fmt.Errorf(wrongTC, tcName(tc))
}

// byteArray reads a byte[] (TC_ARRAY of class "[B"), a reference to one read
// before, or null.
func (r *javaReader) byteArray() ([]byte, error) {
	b, done, err := earlier[[]byte](r, tcArray, "refers to an object that is not a byte array", "is %s, not a byte array")
	if done || err != nil {
		return b, err
	}
	class, err := r.classDesc()
	if err != nil {
		return nil, err
	}
	if class == nil || class.name != "[B" {
		return nil, fmt.Errorf("is an array of class %s, not a byte array ([B)", className(class))
	}
	n, err := r.u32()
	if err != nil {
		return nil, err
	}
	if n > uint32(len(r.b)-r.off) {
		return nil, fmt.Errorf("byte array of %d bytes, but only %d remain", n, len(r.b)-r.off)
	}
	b, _ = r.take(int(n))
	b = append([]byte{}, b...) // not aliasing the file's buffer
	r.newHandle(b)
	return b, nil
}

// blockData reads one TC_BLOCKDATA or TC_BLOCKDATALONG record.
func (r *javaReader) blockData() ([]byte, error) {
	tc, err := r.u8()
	if err != nil {
		return nil, err
	}
	var n int
	switch tc {
	case tcBlockData:
		l, err := r.u8()
		if err != nil {
			return nil, err
		}
		n = int(l)
	case tcBlockDataLong:
		l, err := r.u32()
		if err != nil {
			return nil, err
		}
		if l > math.MaxInt32 {
			return nil, fmt.Errorf("block data of %d bytes", l)
		}
		n = int(l)
	default:
		return nil, fmt.Errorf("holds %s where block data belongs", tcName(tc))
	}
	return r.take(n)
}

func (r *javaReader) newHandle(v any) { r.handles = append(r.handles, v) }

func (r *javaReader) handle() (any, error) {
	h, err := r.u32()
	if err != nil {
		return nil, err
	}
	i := int64(h) - baseWireHandle
	if i < 0 || i >= int64(len(r.handles)) {
		return nil, fmt.Errorf("reference to handle %#x, which was not assigned", h)
	}
	return r.handles[i], nil
}

func (r *javaReader) skipPrimitive(code byte) error {
	_, err := r.take(primitiveSize(code))
	return err
}

// primitiveSize is the size of a primitive field by its type code, or 0 for
// an object type code ('L', '[') or an unknown one.
func primitiveSize(code byte) int {
	switch code {
	case 'B', 'Z':
		return 1
	case 'C', 'S':
		return 2
	case 'I', 'F':
		return 4
	case 'J', 'D':
		return 8
	}
	return 0
}

// utf reads a length-prefixed modified UTF-8 string. Class and field names
// here are ASCII, where modified UTF-8 is plain ASCII.
func (r *javaReader) utf() (string, error) {
	n, err := r.u16()
	if err != nil {
		return "", err
	}
	b, err := r.take(int(n))
	return string(b), err
}

func (r *javaReader) take(n int) ([]byte, error) {
	if n > len(r.b)-r.off {
		return nil, fmt.Errorf("ends after %d bytes, in the middle of the map: the file is truncated", len(r.b))
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b, nil
}

func (r *javaReader) u8() (byte, error) {
	b, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return b[0], nil
}

func (r *javaReader) u16() (uint16, error) {
	b, err := r.take(2)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint16(b), nil
}

func (r *javaReader) u32() (uint32, error) {
	b, err := r.take(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func className(c *javaClass) string {
	if c == nil {
		return "null"
	}
	return c.name
}

func tcName(tc byte) string {
	switch tc {
	case tcNull:
		return "null (TC_NULL)"
	case tcReference:
		return "a back reference (TC_REFERENCE)"
	case tcClassDesc:
		return "a class descriptor (TC_CLASSDESC)"
	case tcObject:
		return "an object (TC_OBJECT)"
	case tcString:
		return "a string (TC_STRING)"
	case tcArray:
		return "an array (TC_ARRAY)"
	case tcBlockData, tcBlockDataLong:
		return "block data"
	case tcEndBlockData:
		return "the end of block data (TC_ENDBLOCKDATA)"
	}
	return fmt.Sprintf("type code %#x", tc)
}
