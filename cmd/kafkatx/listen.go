package main

import (
	"fmt"
	"net"

	"github.com/kafkatx/kafkatx/cmd/flagcheck"
)

// listen opens the TCP listener of an address flag (--addr, --health-addr). A value that is
// not HOST:PORT with a port of 0 to 65535 (flagcheck.Addr) is a usage error (status 2, one line naming the
// flag); a listener that cannot bind (the port taken, an address not on this host, a
// privileged port) is the command's own failure (status 1) — never the database's condition.
func listen(flag, addr string) (net.Listener, error) {
	if err := flagcheck.Addr(flag, addr); err != nil { // the one rule of an address flag
		return nil, &exitError{code: exitUsage, err: err}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &exitError{code: exitFailed, err: fmt.Errorf("--%s %s: cannot listen: %w", flag, shellQuote(addr), err)}
	}
	return ln, nil
}
