package main

import (
	"fmt"
	"net"
	"strconv"
)

// listen opens the TCP listener of an address flag (--addr, --health-addr). A value that is
// not HOST:PORT with a port of 0 to 65535 is a usage error (status 2, one line naming the
// flag); a listener that cannot bind (the port taken, an address not on this host, a
// privileged port) is the command's own failure (status 1) — never the database's condition.
func listen(flag, addr string) (net.Listener, error) {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		if n, err = strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			err = fmt.Errorf("port %q is not a number from 0 to 65535", port)
		}
	}
	if err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("--%s %s: not HOST:PORT (%v); e.g. 127.0.0.1:8080 or :8080", flag, shellQuote(addr), err)}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &exitError{code: exitFailed, err: fmt.Errorf("--%s %s: cannot listen: %w", flag, shellQuote(addr), err)}
	}
	return ln, nil
}
