package server

// h2Sniffer watches the first bytes a plaintext gRPC client sends, the
// HTTP/2 connection preface and frames, until the first HEADERS frame: the
// start of the connection's first call or stream. Until then the
// connection does no useful work (it may be silent, or have sent only the
// preface and settings), so the listener's cap may evict it.
type h2Sniffer struct {
	preface int     // bytes of the 24-byte preface still to come
	hdr     [9]byte // the frame header being read
	hdrN    int     // bytes of hdr read
	skip    int     // payload bytes of the current frame still to come
	seen    bool    // a HEADERS frame has arrived
}

// h2Preface is the length of the HTTP/2 client connection preface
// ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").
const h2Preface = 24

// h2Headers is the HTTP/2 frame type of HEADERS.
const h2Headers = 0x1

func newH2Sniffer() *h2Sniffer { return &h2Sniffer{preface: h2Preface} }

// feed reads b, the next bytes of the connection, and reports whether a
// HEADERS frame has arrived by their end.
func (s *h2Sniffer) feed(b []byte) bool {
	for len(b) > 0 && !s.seen {
		switch {
		case s.preface > 0:
			n := min(s.preface, len(b))
			s.preface -= n
			b = b[n:]
		case s.skip > 0:
			n := min(s.skip, len(b))
			s.skip -= n
			b = b[n:]
		default:
			n := copy(s.hdr[s.hdrN:], b)
			s.hdrN += n
			b = b[n:]
			if s.hdrN < len(s.hdr) {
				continue
			}
			s.hdrN = 0
			if s.hdr[3] == h2Headers {
				s.seen = true
			}
			s.skip = int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2])
		}
	}
	return s.seen
}
