package walrelay

import (
	"os"
	"sync/atomic"
	"syscall"
)

// crashAt, when set by a test binary through KAFKATX_WALRELAY_CRASH_AT=<point>:<n>, kills the
// process with SIGKILL the n-th time the relay passes that point (after-decode, after-produce,
// before-kafka-commit, after-kafka-commit, before-confirm). Tests only.
var crashAt = os.Getenv("KAFKATX_WALRELAY_CRASH_AT")

var hookCount atomic.Int64

func hook(point string) {
	if crashAt == "" {
		return
	}
	name, n := crashAt, int64(1)
	for i := len(crashAt) - 1; i >= 0; i-- {
		if crashAt[i] == ':' {
			name = crashAt[:i]
			var v int64
			for _, c := range crashAt[i+1:] {
				v = v*10 + int64(c-'0')
			}
			n = v
			break
		}
	}
	if name == point && hookCount.Add(1) == n {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}
