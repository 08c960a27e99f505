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

// Forward listens on addr (127.0.0.1:PORT) and copies each connection to and from target
// until the test ends: a broker that "comes back" at an address a client was given. A Kafka
// client learns the broker's advertised address from the first answer and connects there
// directly afterwards.
func Forward(t testing.TB, addr, target string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("forward %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.Close() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
}
