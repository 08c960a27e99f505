package testenv

import (
	"net"
	"testing"
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
