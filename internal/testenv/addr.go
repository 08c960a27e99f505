package testenv

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// FreeAddr returns a 127.0.0.1:PORT nothing listens on now (the kernel's choice of a free
// port, released at once), for a server a test starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Get GETs http://addr+path within 2 s and returns the status and body; a request that fails
// returns status 0 and the error's text (a server not listening yet, say).
func Get(addr, path string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
