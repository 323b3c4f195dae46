// Package tfevents decodes TensorBoard event files the way TensorBoard's
// own reader does, written from the format's definition (TFRecord framing,
// the Event and Summary protobuf messages) and sharing no code with kiln's
// writer (trainer/results), so that tests can hold the writer to the format.
package tfevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Event is what a reader of TensorBoard's format finds in one record.
type Event struct {
	Wall    float64
	Step    int64
	Version string
	Values  map[string]float32
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func unmask(m uint32) uint32 {
	c := m - 0xa282ead8
	return c<<15 | c>>17
}

// Read decodes every record of an event file.
func Read(b []byte) ([]Event, error) {
	var out []Event
	for len(b) > 0 {
		if len(b) < 12 {
			return out, fmt.Errorf("truncated record header: %d bytes left", len(b))
		}
		n := binary.LittleEndian.Uint64(b[:8])
		if crc32.Checksum(b[:8], castagnoli) != unmask(binary.LittleEndian.Uint32(b[8:12])) {
			return out, errors.New("length CRC mismatch")
		}
		if uint64(len(b)-16) < n {
			return out, fmt.Errorf("truncated record: %d bytes of %d", len(b)-16, n)
		}
		data := b[12 : 12+n]
		if crc32.Checksum(data, castagnoli) != unmask(binary.LittleEndian.Uint32(b[12+n:16+n])) {
			return out, errors.New("data CRC mismatch")
		}
		b = b[16+n:]
		e, err := parseEvent(data)
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

// fields walks one protobuf message: fn gets each field's number, wire
// type, fixed or varint value, and raw bytes.
func fields(b []byte, fn func(num, typ int, v uint64, raw []byte) error) error {
	uvarint := func() (uint64, error) {
		x, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, errors.New("bad varint")
		}
		b = b[n:]
		return x, nil
	}
	take := func(n uint64) ([]byte, error) {
		if uint64(len(b)) < n {
			return nil, errors.New("field runs past its message")
		}
		raw := b[:n]
		b = b[n:]
		return raw, nil
	}
	for len(b) > 0 {
		key, err := uvarint()
		if err != nil {
			return err
		}
		num, typ := int(key>>3), int(key&7)
		var v uint64
		var raw []byte
		switch typ {
		case 0:
			v, err = uvarint()
		case 1:
			if raw, err = take(8); err == nil {
				v = binary.LittleEndian.Uint64(raw)
			}
		case 2:
			var l uint64
			if l, err = uvarint(); err == nil {
				raw, err = take(l)
			}
		case 5:
			if raw, err = take(4); err == nil {
				v = uint64(binary.LittleEndian.Uint32(raw))
			}
		default:
			return fmt.Errorf("unexpected wire type %d", typ)
		}
		if err != nil {
			return err
		}
		if err := fn(num, typ, v, raw); err != nil {
			return err
		}
	}
	return nil
}

func parseEvent(data []byte) (Event, error) {
	e := Event{Values: map[string]float32{}}
	err := fields(data, func(num, typ int, v uint64, raw []byte) error {
		switch num {
		case 1:
			e.Wall = math.Float64frombits(v)
		case 2:
			e.Step = int64(v)
		case 3:
			e.Version = string(raw)
		case 5: // Summary
			return fields(raw, func(num, typ int, v uint64, raw []byte) error {
				if num != 1 {
					return nil
				}
				var tag string
				var val float32
				err := fields(raw, func(num, typ int, v uint64, raw []byte) error {
					switch num {
					case 1:
						tag = string(raw)
					case 2:
						val = math.Float32frombits(uint32(v))
					}
					return nil
				})
				e.Values[tag] = val
				return err
			})
		}
		return nil
	})
	return e, err
}
