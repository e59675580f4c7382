package server

import (
	"bytes"
	"testing"
)

// TestH2Sniffer: a connection serves from its first HEADERS frame, whatever
// came before it (the preface, SETTINGS, PING, WINDOW_UPDATE) and however
// the bytes are split across reads.
func TestH2Sniffer(t *testing.T) {
	preface := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	frame := func(typ byte, payload int) []byte {
		return append([]byte{byte(payload >> 16), byte(payload >> 8), byte(payload), typ, 0, 0, 0, 0, 1}, bytes.Repeat([]byte{1}, payload)...)
	}
	settings, ping, window, headers := frame(0x4, 12), frame(0x6, 8), frame(0x8, 4), frame(0x1, 40)
	for _, tt := range []struct {
		name  string
		bytes [][]byte
		want  bool
	}{
		{"nothing", nil, false},
		{"the preface only", [][]byte{preface}, false},
		{"preface and settings", [][]byte{preface, settings}, false},
		{"pings and window updates", [][]byte{preface, settings, ping, window, ping}, false},
		{"a call", [][]byte{preface, settings, window, headers}, true},
		{"a frame whose payload holds a HEADERS type byte", [][]byte{preface, frame(0x0, 9), headers[:3]}, false},
		{"a partial frame header", [][]byte{preface, settings, headers[:8]}, false},
	} {
		for _, split := range []int{1, 7, 1 << 20} {
			s := newH2Sniffer()
			all := bytes.Join(tt.bytes, nil)
			got := false
			for len(all) > 0 {
				n := min(split, len(all))
				got = s.feed(all[:n]) || got
				all = all[n:]
			}
			if got != tt.want {
				t.Errorf("%s, reads of %d bytes: serving %t, want %t", tt.name, split, got, tt.want)
			}
		}
	}
}
