package tlsfiles

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// ErrPlainText is the handshake error of a connection that spoke plain
// HTTP to a TLS port; the client was told so.
var ErrPlainText = errors.New("tls: client spoke plain text to a TLS port")

// PlainTextHint is what a client that speaks plain HTTP to a TLS port is
// told.
const PlainTextHint = "this address serves TLS: use https:// (walcast: pass --tls-ca <CA bundle> unless the system trusts the server's certificate)"

// Listener returns a TLS listener over inner with config. A client that
// speaks plain HTTP/1.x to it gets a Connect-protocol error (HTTP 400,
// code failed_precondition) saying to use TLS, and an HTTP/2 client without
// TLS (gRPC over h2c) a gRPC status saying the same, instead of a bare
// connection reset.
func Listener(inner net.Listener, config *tls.Config) net.Listener {
	return tls.NewListener(sniffListener{inner}, config)
}

type sniffListener struct{ net.Listener }

func (l sniffListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c}, nil
}

// sniffConn looks at a connection's first byte before the TLS handshake
// reads it: every TLS connection starts with a handshake record (0x16).
type sniffConn struct {
	net.Conn
	once sync.Once
	br   *bufio.Reader
	err  error
}

func (c *sniffConn) Read(b []byte) (int, error) {
	c.once.Do(c.sniff)
	if c.err != nil {
		return 0, c.err
	}
	return c.br.Read(b)
}

const (
	recordTypeHandshake = 0x16
	h2Preface           = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

func (c *sniffConn) sniff() {
	c.br = bufio.NewReaderSize(c.Conn, 512)
	first, err := c.br.Peek(1)
	if err != nil || first[0] == recordTypeHandshake {
		return // the handshake reports a read error itself
	}
	head, _ := c.br.Peek(len(h2Preface))
	switch {
	case string(head) == h2Preface:
		_, _ = c.br.Discard(len(h2Preface))
		c.answerH2C()
	case looksLikeHTTP(head):
		body := fmt.Sprintf(`{"code":"failed_precondition","message":%q}`, PlainTextHint)
		_, _ = fmt.Fprintf(c.Conn, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	}
	c.lingeringClose()
	c.err = ErrPlainText
}

// lingeringClose half-closes the connection and drains what the client
// still sends for a moment, so that the answer is not lost to a reset.
func (c *sniffConn) lingeringClose() {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.Conn.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.br, 1<<20))
}

func looksLikeHTTP(b []byte) bool {
	for i, ch := range b {
		switch {
		case ch == ' ' && i > 0:
			return true
		case ch < 'A' || ch > 'Z':
			return false
		}
	}
	return false
}

// answerH2C answers an HTTP/2 client without TLS (gRPC over h2c): a
// trailers-only gRPC response with code FailedPrecondition and the hint,
// on the first stream it opens, then GOAWAY.
func (c *sniffConn) answerH2C() {
	fr := http2.NewFramer(c.Conn, c.br)
	if fr.WriteSettings() != nil {
		return
	}
	for range 16 { // the client's SETTINGS, WINDOW_UPDATE, then HEADERS
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		if _, ok := f.(*http2.HeadersFrame); !ok {
			continue
		}
		var block bytes.Buffer
		enc := hpack.NewEncoder(&block)
		for _, hf := range [][2]string{{":status", "200"}, {"content-type", "application/grpc"},
			{"grpc-status", "9"}, {"grpc-message", url.PathEscape(PlainTextHint)}} {
			_ = enc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]})
		}
		id := f.Header().StreamID
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true})
		_ = fr.WriteGoAway(id, http2.ErrCodeNo, []byte(PlainTextHint))
		return
	}
}
